//! Client settings.

use std::time::Duration;

use crate::error::{Error, Result};

/// How a [`SqlClient`](crate::SqlClient) behaves; every value is checked
/// before any connection.
#[derive(Debug, Clone)]
pub struct SqlSettings {
    pub(crate) table: String,
    pub(crate) watchdog_timeout: Duration,
    pub(crate) max_lease: Duration,
    pub(crate) connections: u32,
}

impl Default for SqlSettings {
    fn default() -> Self {
        Self {
            table: "hasp_locks".to_owned(),
            watchdog_timeout: Duration::from_secs(30),
            max_lease: Duration::from_secs(7 * 24 * 3600),
            connections: 10,
        }
    }
}

impl SqlSettings {
    /// The lock table (default `hasp_locks`): an identifier of ASCII
    /// letters, digits and `_`, not starting with a digit, at most 54
    /// bytes (the release channel appends `_released` within PostgreSQL's
    /// 63).
    pub fn set_table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Lease of a lock taken without one (default 30 s), renewed every third
    /// of it while held.
    pub fn set_watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// Longest accepted explicit lease (default 7 days).
    pub fn set_max_lease(mut self, lease: Duration) -> Self {
        self.max_lease = lease;
        self
    }

    /// Connections in the pool (default 10). Waiting never holds one. The
    /// client opens one more, for lease renewals alone.
    pub fn set_connections(mut self, connections: u32) -> Self {
        self.connections = connections;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let t = self.table.as_bytes();
        let ident = !t.is_empty()
            && t.len() <= 54
            && !t[0].is_ascii_digit()
            && t.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_');
        if !ident {
            return Err(Error::invalid(
                "table",
                format!(
                    "{:?} is not an identifier of 1 to 54 ASCII letters, digits or _",
                    self.table
                ),
            ));
        }
        if self.watchdog_timeout < Duration::from_millis(30)
            || self.watchdog_timeout > self.max_lease
        {
            return Err(Error::invalid(
                "watchdog_timeout",
                format!("{:?} is not in 30 ms ..= max_lease", self.watchdog_timeout),
            ));
        }
        if self.connections == 0 {
            return Err(Error::invalid("connections", "must be at least 1"));
        }
        Ok(())
    }

    pub(crate) fn watchdog_lease_ms(&self) -> u64 {
        self.watchdog_timeout.as_millis() as u64
    }

    /// An explicit lease in milliseconds, checked.
    pub(crate) fn lease_ms(&self, lease: Duration) -> Result<u64> {
        if lease.is_zero() || lease > self.max_lease {
            return Err(Error::invalid(
                "lease",
                format!("{lease:?} is not in (0, {:?}]", self.max_lease),
            ));
        }
        Ok(lease.as_nanos().div_ceil(1_000_000) as u64)
    }
}
