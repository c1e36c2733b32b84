//! The error type of the database lock.

use std::time::Duration;

/// What went wrong in a database lock operation: outcomes a caller plans
/// for ([`NotHeld`](Error::NotHeld), [`TimedOut`](Error::TimedOut)) apart
/// from failures of the database ([`Db`](Error::Db)), which are never
/// reported as "not acquired".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before any statement ran.
    #[error("invalid argument `{argument}`: {reason}")]
    InvalidArgument {
        /// Which argument.
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// The lock is not held by this owner (never taken, released, expired,
    /// or taken over after it expired). Nothing was changed.
    #[error("lock {name:?} is not held by this owner")]
    NotHeld {
        /// The lock's name.
        name: String,
    },

    /// A wait the caller asked to treat as an error ran out.
    #[error("lock {name:?} was not acquired within {waited:?}")]
    TimedOut {
        /// The lock's name.
        name: String,
        /// How long the caller was prepared to wait.
        waited: Duration,
    },

    /// The database could not be reached or refused a statement.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

impl Error {
    /// True for an error that may pass if the same call is made again: the
    /// database unreachable or busy (see [`is_transient`]). A caller may
    /// retry these; the others (bad arguments, `NotHeld`, a statement the
    /// database refused for good) it should not.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Db(e) if is_transient(e))
    }

    pub(crate) fn invalid(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether a database error says "the database cannot answer now; ask
/// again": unreachable, its pool exhausted, or busy (SQLite's file locked
/// by another process, PostgreSQL or MariaDB out of connections, a lock
/// wait that timed out, a deadlock victim, a server starting or stopping).
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(d) => {
            #[cfg(feature = "sqlite")]
            if d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // SQLITE_BUSY (5) and SQLITE_LOCKED (6), with their
                // extended codes (the primary code is the low byte).
                let code = d.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0);
                return matches!(code & 0xff, 5 | 6);
            }
            #[cfg(feature = "postgres")]
            if let Some(e) = d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                // lock_not_available, deadlock_detected, too_many_connections,
                // cannot_connect_now, admin_shutdown
                return matches!(e.code(), "55P03" | "40P01" | "53300" | "57P03" | "57P01");
            }
            #[cfg(feature = "mysql")]
            if let Some(e) = d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                // lock wait timeout, deadlock, too many connections
                return matches!(e.number(), 1205 | 1213 | 1040);
            }
            let _ = d;
            false
        }
        _ => false,
    }
}
