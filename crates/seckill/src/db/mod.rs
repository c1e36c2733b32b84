//! The durable side: vouchers and orders in SQL.
//!
//! One URL picks the backend: `sqlite://path/to/file.db` (the embedded
//! default), `postgres://…`, or `mysql://…` (MariaDB 10.5+). Queries are
//! written once with `?` placeholders and numbered for PostgreSQL; each
//! backend has its own migrations (`migrations/<backend>/`).
//!
//! The database is the final guard: `stock >= 0` and `UNIQUE (voucher_id,
//! claim_user_id)` (a buyer's one live order of a voucher) hold whatever the
//! Redis fast path or a retrying consumer does, and
//! [`Database::record_order`] decides every case from the constraints,
//! never from a check-then-insert. An order's later life (payment,
//! cancellation, expiry) is decided by its row's state, one conditional
//! update each ([`Database::pay_order`], [`Database::give_back`]).
//!
//! One [`Database`] type, its methods in rooms by what they serve:
//! `vouchers` (a sale's terms), `orders` (storing the pipeline's orders and
//! reading one order back), `order_life` (payment, cancellation, expiry,
//! redemption, refund), `payments` (payments a provider confirms by
//! callback, and the callbacks it sent) and `reads` (a voucher's orders as lists and counts, for the repair,
//! the reconciliation and the checks).

use std::borrow::Cow;
use std::sync::Once;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, AssertSqlSafe, Row};

pub use crate::domain::order::{OrderRecord, StoredOrder};
use crate::error::{Error, Result};

/// The columns [`stored_order`] reads, in its order.
macro_rules! order_columns {
    () => {
        "id, user_id, voucher_id, created_ms, state, pay_by_ms, paid_ms, closed_ms, amount_minor, \
         currency, redeem_code, used_ms, refunded_ms, returned_ms, pay_reference"
    };
}

mod order_life;
mod orders;
mod payments;
mod reads;
mod vouchers;

pub use order_life::{GiveBack, Returned, Transition};
pub use orders::Recorded;
pub use payments::{EventOutcome, PaymentStart};
pub use reads::{OrderBuyer, OrderStateRow, StateCounts};
pub use vouchers::{VoucherRow, VoucherWindow};

/// Which SQL server a [`Database`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite (a file).
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// MariaDB or MySQL.
    MySql,
}

/// A pool of connections to the sale's database.
#[derive(Debug, Clone)]
pub struct Database {
    pool: AnyPool,
    backend: Backend,
}

/// Whether a database error means "the database cannot answer now; ask
/// again" (unreachable, its pool exhausted, busy or locked): the same
/// classification as the table lock's. Every route answers these the same
/// way: 503 with `Retry-After`.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    hasp_sql::is_transient(e)
}

/// How long a query waits for a pooled connection (sqlx's default is 30 s).
/// With the database down, each acquire keeps trying to connect until this
/// passes: a read then fails as a 503 within about this time, instead of
/// holding its HTTP request for half a minute.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs database work `work` by `deadline`: a request that makes several
/// calls gives them one budget (the wait for a pooled connection and, on
/// SQLite, for another process's lock count against it), so that it is a
/// 503 within about [`ACQUIRE_TIMEOUT`] of its start, not after each call's
/// own wait. Past the deadline the work is dropped: a transaction not
/// committed is rolled back; one whose commit was on its way has an
/// unknown outcome, as any database failure after sending.
///
/// # Errors
/// `work`'s error, or [`Error::Database`] (`PoolTimedOut`: unavailable)
/// past the deadline.
pub async fn by<T>(
    deadline: tokio::time::Instant,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or(Err(Error::Database(sqlx::Error::PoolTimedOut)))
}

impl Database {
    /// Connects to `url`; for SQLite, creates the file (and its directory)
    /// if missing.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an unsupported URL, [`Error::Database`] if
    /// the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        static DRIVERS: Once = Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            Backend::MySql
        } else {
            return Err(Error::invalid(
                "database_url",
                format!("{url:?}: expected sqlite:, postgres: or mysql:"),
            ));
        };
        let url = match backend {
            Backend::Sqlite => sqlite_url(url)?,
            _ => url.replacen("mariadb:", "mysql:", 1),
        };
        let pool = AnyPoolOptions::new()
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // A statement waits for another process's lock no
                        // longer than a query waits for a connection
                        // (sqlx's default is 5 s): a locked file is then a
                        // 503 as soon as a pool that is busy would be.
                        let pragma =
                            format!("PRAGMA busy_timeout = {}", ACQUIRE_TIMEOUT.as_millis());
                        sqlx::query(AssertSqlSafe(pragma)).execute(conn).await?;
                    }
                    Ok(())
                })
            })
            .max_connections(match backend {
                // One writer at a time is all SQLite allows; more only queue.
                Backend::Sqlite => 1,
                _ => 10,
            })
            .connect(&url)
            .await?;
        Ok(Self { pool, backend })
    }

    /// The backend behind this pool.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Applies the backend's migrations (idempotent), also when several
    /// processes run them at once on a fresh database.
    ///
    /// PostgreSQL and MariaDB serialise concurrent runs with sqlx's
    /// migration lock (an advisory lock). SQLite has none: a process can
    /// find a table another has created since it read the list of applied
    /// migrations, or the file locked. Each migration runs in a
    /// transaction, so the failed one left nothing behind, and running
    /// again finds it applied: a failed run is tried again, a few times
    /// over a few seconds, before its error is reported.
    ///
    /// # Errors
    /// [`Error::Migration`] if a migration still fails after the retries,
    /// or the applied ones differ from the embedded ones.
    pub async fn migrate(&self) -> Result<()> {
        const TRIES: u32 = 8;
        let migrator = match self.backend {
            Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
            Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
            Backend::MySql => sqlx::migrate!("./migrations/mysql"),
        };
        let mut tries = 1;
        loop {
            match migrator.run(&self.pool).await {
                Ok(()) => return Ok(()),
                Err(error) if tries < TRIES => {
                    tracing::info!(%error, tries, "migration failed: another process may be migrating; trying again");
                    let pause = 25 * u64::from(tries) + fastrand::u64(0..25);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    tries += 1;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Whether the database answers.
    ///
    /// # Errors
    /// [`Error::Database`] if it does not.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").fetch_one(&self.pool).await?;
        Ok(())
    }

    /// `?` placeholders numbered for PostgreSQL (`$1`, `$2`, …), and
    /// `NOW_MS` the database's clock in Unix milliseconds. Takes only
    /// `'static` text: the rewrite never lets data into the SQL.
    fn sql(&self, query: &'static str) -> AssertSqlSafe<Cow<'static, str>> {
        let numbered = self.numbered(query);
        if !numbered.contains("NOW_MS") {
            return AssertSqlSafe(numbered);
        }
        // The one clock that judges payment deadlines: the one whose rows
        // decide the orders' states (as hasp-sql's table lock reads it).
        let now = match self.backend {
            Backend::Sqlite => hasp_sql::Dialect::Sqlite,
            Backend::Postgres => hasp_sql::Dialect::Postgres,
            Backend::MySql => hasp_sql::Dialect::MySql,
        }
        .now_ms();
        AssertSqlSafe(Cow::Owned(numbered.replace("NOW_MS", now)))
    }

    fn numbered(&self, query: &'static str) -> Cow<'static, str> {
        if self.backend != Backend::Postgres {
            return Cow::Borrowed(query);
        }
        let mut out = String::with_capacity(query.len() + 8);
        let mut n = 0;
        for c in query.chars() {
            if c == '?' {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push(c);
            }
        }
        Cow::Owned(out)
    }
}

/// The first column of every row, as integers.
fn first_column(rows: &[AnyRow]) -> Result<Vec<i64>> {
    Ok(rows
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()?)
}

/// An order's state as its row stores it.
fn order_state(stored: &str) -> Result<crate::domain::order::OrderState> {
    crate::domain::order::OrderState::from_stored(stored)
        .ok_or_else(|| Error::Protocol(format!("order state {stored:?} in the database")))
}

/// Attempts of one order's transaction when the server reports a
/// serialization failure or deadlock (SQLSTATE 40001 / 40P01).
const SERIALIZATION_RETRIES: u32 = 3;

/// `sqlite://path` with create-if-missing, creating the parent directory.
fn sqlite_url(url: &str) -> Result<String> {
    let path = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:")
        .split('?')
        .next()
        .unwrap_or_default();
    if path.is_empty() || path == ":memory:" {
        return Err(Error::invalid(
            "database_url",
            "SQLite needs a file path (orders must survive a restart)",
        ));
    }
    if let Some(dir) = std::path::Path::new(path).parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::invalid("database_url", format!("{}: {e}", dir.display())))?;
        }
    }
    Ok(format!("sqlite://{path}?mode=rwc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_need_a_file() {
        assert!(sqlite_url("sqlite::memory:").is_err());
        assert!(sqlite_url("sqlite://").is_err());
        let dir = std::env::temp_dir().join(format!("seckill-url-{}", std::process::id()));
        let url = sqlite_url(&format!("sqlite://{}/x.db", dir.display())).unwrap();
        assert!(url.ends_with("x.db?mode=rwc"));
        assert!(dir.exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}
