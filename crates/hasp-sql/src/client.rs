//! The client: a pool, the lease renewal task, and (PostgreSQL) the
//! listener that wakes waiters.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::lock::SqlLock;
use crate::settings::SqlSettings;

/// A client of one database: cheap to clone; its background tasks stop
/// when the last clone is dropped.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp_sql::Result<()> {
/// # let dir = std::env::temp_dir().join(format!("hasp-sql-doc-{}", std::process::id()));
/// # let url = format!("sqlite://{}?mode=rwc", dir.display());
/// let client = hasp_sql::SqlClient::open(&url, hasp_sql::SqlSettings::default()).await?;
/// client.migrate().await?;                  // creates the table if missing
/// let lock = client.lock("nightly-report")?;
/// let guard = lock.lock().await?;
/// println!("token {}", guard.fencing_token());
/// guard.unlock().await?;
/// # drop(client); let _ = std::fs::remove_file(&dir);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct SqlClient {
    engine: Arc<Engine>,
}

impl SqlClient {
    /// Opens a pool to `url` (`postgres://`, `mysql://`, `mariadb://`,
    /// `sqlite://path?mode=rwc`) and starts the background tasks on the
    /// current tokio runtime. Run [`migrate`](Self::migrate) once before
    /// the first lock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad URL or setting; [`Error::Db`] if
    /// the database cannot be reached.
    pub async fn open(url: &str, settings: SqlSettings) -> Result<Self> {
        Ok(Self {
            engine: Engine::start(url, settings).await?,
        })
    }

    /// Creates the lock table (the settings' name) if it does not exist;
    /// running it again changes nothing. The DDL of each backend is in the
    /// crate docs.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn migrate(&self) -> Result<()> {
        self.engine.sql.migrate(&self.engine.db).await
    }

    /// A handle on the lock called `name` (1 to 255 bytes of UTF-8, exact:
    /// `"A"` and `"a"` are different locks on every backend).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or over-long name.
    pub fn lock(&self, name: &str) -> Result<SqlLock> {
        if name.is_empty() || name.len() > 255 {
            return Err(Error::invalid("name", "must be 1 to 255 bytes"));
        }
        Ok(SqlLock::new(self.engine.clone(), name))
    }

    /// This client's id, the prefix of its default owners.
    pub fn id(&self) -> &str {
        &self.engine.id
    }

    /// What this client's acquisitions have cost the database so far.
    pub fn stats(&self) -> SqlStats {
        SqlStats {
            attempts: self.engine.attempts.load(Ordering::Relaxed),
            probes: self.engine.probes.load(Ordering::Relaxed),
        }
    }
}

/// Counts of a client's acquiring statements, from [`SqlClient::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlStats {
    /// Acquiring statements sent (each one write: the upsert, or MySQL's
    /// conditional update).
    pub attempts: u64,
    /// Reads a waiter made before a retry, which found the row held by
    /// another owner and so sent no acquiring statement.
    pub probes: u64,
}
