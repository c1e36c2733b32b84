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

use std::borrow::Cow;
use std::sync::Once;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, AssertSqlSafe, Row};

use crate::domain::now_ms;
use crate::domain::order::OrderState;
pub use crate::domain::order::{OrderRecord, StoredOrder};
use crate::domain::voucher::{SaleTerms, Title};
use crate::error::{Error, Result};

/// The columns [`stored_order`] reads, in its order.
macro_rules! order_columns {
    () => {
        "id, user_id, voucher_id, created_ms, state, pay_by_ms, paid_ms, closed_ms"
    };
}

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

/// A voucher row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoucherRow {
    /// Id.
    pub id: i64,
    /// Title.
    pub title: String,
    /// Stock left in the database.
    pub stock: i64,
    /// Sale start (Unix ms).
    pub begin_ms: i64,
    /// Sale end, exclusive (Unix ms).
    pub end_ms: i64,
    /// How long a buyer has to pay (ms from the purchase).
    pub pay_within_ms: i64,
    /// Whether a buyer whose order was given back may buy again.
    pub rebuy_after_cancel: bool,
}

/// What asking a stored order to change found. Only a reserved order
/// changes, by one conditional update: the row's state decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Done now; the order as it is after.
    Done(StoredOrder),
    /// The same change was made before (a repeat): nothing changed.
    Already(StoredOrder),
    /// The order's state forbids it (paid, given back, or past its
    /// deadline): nothing changed.
    Refused(StoredOrder),
    /// No stored order of that id (for that buyer).
    NotFound,
}

/// Why a reserved order gives its unit back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// Its buyer cancelled it (at any time before payment).
    Cancel,
    /// Its payment deadline passed (by the database's clock).
    Expire,
}

/// A stored order that gave its unit back: what the Redis side needs to
/// take the unit back too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Returned {
    /// The order.
    pub order_id: i64,
    /// Its buyer.
    pub user_id: i64,
    /// Its voucher.
    pub voucher_id: i64,
    /// Whether the buyer may buy again (their claim was released).
    pub rebuy: bool,
}

/// What [`Database::record_order`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The order is new: inserted, stock decremented, committed.
    Created,
    /// This order id is already stored (a re-delivery): nothing changed.
    AlreadyStored,
    /// The user already has another order for this voucher: nothing changed.
    UserAlreadyOrdered,
    /// The voucher has no stock left in the database: nothing changed.
    OutOfStock,
    /// No such voucher in the database: nothing changed.
    UnknownVoucher,
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

    /// `?` placeholders numbered for PostgreSQL (`$1`, `$2`, …), and
    /// `NOW_MS` the database's clock in Unix milliseconds. Takes only
    /// `'static` text: the rewrite never lets data into the SQL.
    fn sql(&self, query: &'static str) -> AssertSqlSafe<Cow<'static, str>> {
        let numbered = self.numbered(query);
        if !numbered.contains("NOW_MS") {
            return AssertSqlSafe(numbered);
        }
        // The one clock that judges payment deadlines: the one whose rows
        // decide the orders' states.
        let now = match self.backend {
            Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
            Backend::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            Backend::MySql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
        };
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

    /// Stores a new voucher and returns its id.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn create_voucher(&self, title: &Title, terms: &SaleTerms) -> Result<i64> {
        let row: AnyRow = sqlx::query(self.sql(
            "INSERT INTO seckill_voucher \
             (title, stock, begin_ms, end_ms, created_ms, pay_within_ms, rebuy_after_cancel) \
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        ))
        .bind(title.as_str())
        .bind(terms.stock())
        .bind(terms.begin_ms())
        .bind(terms.end_ms())
        .bind(now_ms())
        .bind(terms.pay_within_ms())
        .bind(i64::from(terms.rebuy_after_cancel()))
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Stock left in the database for voucher `id`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_stock(&self, id: i64) -> Result<Option<i64>> {
        let row = sqlx::query(self.sql("SELECT stock FROM seckill_voucher WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?)
    }

    /// Whether the database answers.
    ///
    /// # Errors
    /// [`Error::Database`] if it does not.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").fetch_one(&self.pool).await?;
        Ok(())
    }

    /// Ids of every voucher (the pipeline's worklist).
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_ids(&self) -> Result<Vec<i64>> {
        let rows = sqlx::query("SELECT id FROM seckill_voucher ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        first_column(&rows)
    }

    /// Ids of the vouchers whose sale has not ended at `now_ms` (Unix ms):
    /// those whose Redis state still matters.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn open_voucher_ids(&self, now_ms: i64) -> Result<Vec<i64>> {
        let rows =
            sqlx::query(self.sql("SELECT id FROM seckill_voucher WHERE end_ms > ? ORDER BY id"))
                .bind(now_ms)
                .fetch_all(&self.pool)
                .await?;
        first_column(&rows)
    }

    /// Every voucher, newest first, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn vouchers(&self, limit: i64) -> Result<Vec<VoucherRow>> {
        let rows = sqlx::query(self.sql(
            "SELECT id, title, stock, begin_ms, end_ms, pay_within_ms, rebuy_after_cancel \
             FROM seckill_voucher ORDER BY id DESC LIMIT ?",
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(voucher_row).collect::<Result<_, _>>()?)
    }

    /// Voucher `id` as stored.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher(&self, id: i64) -> Result<Option<VoucherRow>> {
        let row = sqlx::query(self.sql(
            "SELECT id, title, stock, begin_ms, end_ms, pay_within_ms, rebuy_after_cancel \
                 FROM seckill_voucher WHERE id = ?",
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(voucher_row).transpose()?)
    }

    /// The sale terms of voucher `id` as stored: `(stock, begin_ms, end_ms)`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_window(&self, id: i64) -> Result<Option<(i64, i64, i64)>> {
        let row = sqlx::query(
            self.sql("SELECT stock, begin_ms, end_ms FROM seckill_voucher WHERE id = ?"),
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|r| -> Result<_, sqlx::Error> {
                Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
            })
            .transpose()?)
    }

    /// Users whose order holds their one order of voucher `id` (reserved or
    /// paid; given back too when the voucher does not let them buy again):
    /// the buyers Redis must know.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_users(&self, voucher_id: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(self.sql(
            "SELECT claim_user_id FROM voucher_order \
             WHERE voucher_id = ? AND claim_user_id IS NOT NULL",
        ))
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await?;
        first_column(&rows)
    }

    /// `user_id`'s latest stored order of voucher `voucher_id`, whatever its
    /// state.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_of(&self, user_id: i64, voucher_id: i64) -> Result<Option<StoredOrder>> {
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE user_id = ? AND voucher_id = ? ORDER BY id DESC LIMIT 1"
        )))
        .bind(user_id)
        .bind(voucher_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(stored_order).transpose()
    }

    /// Stored order `id`, if any.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order(&self, id: i64) -> Result<Option<StoredOrder>> {
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE id = ?"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(stored_order).transpose()
    }

    /// The stored orders of `user_id`, newest first, at most 100.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn orders_of(&self, user_id: i64) -> Result<Vec<StoredOrder>> {
        let rows = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE user_id = ? ORDER BY id DESC LIMIT 100"
        )))
        .bind(user_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stored_order).collect()
    }

    /// Ids of the orders stored for voucher `id`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_ids(&self, voucher_id: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(self.sql("SELECT id FROM voucher_order WHERE voucher_id = ?"))
            .bind(voucher_id)
            .fetch_all(&self.pool)
            .await?;
        first_column(&rows)
    }

    /// The orders of voucher `id` that hold their buyer's one order of it
    /// (see [`Database::order_users`]): `(order id, user id)`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_orders(&self, voucher_id: i64) -> Result<Vec<(i64, i64)>> {
        self.pairs(
            "SELECT id, user_id FROM voucher_order \
             WHERE voucher_id = ? AND claim_user_id IS NOT NULL",
            voucher_id,
        )
        .await
    }

    /// Every stored order of voucher `id`: `(order id, user id, state)`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_order_states(
        &self,
        voucher_id: i64,
    ) -> Result<Vec<(i64, i64, OrderState)>> {
        let rows = sqlx::query(
            self.sql("SELECT id, user_id, state FROM voucher_order WHERE voucher_id = ?"),
        )
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let state: String = r.try_get(2)?;
                let state = OrderState::from_stored(&state).ok_or_else(|| {
                    Error::Protocol(format!("order state {state:?} in the database"))
                })?;
                Ok((r.try_get(0)?, r.try_get(1)?, state))
            })
            .collect()
    }

    /// The orders of voucher `id` that gave their unit back (cancelled or
    /// expired): `(order id, user id)`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn returned_orders(&self, voucher_id: i64) -> Result<Vec<(i64, i64)>> {
        self.pairs(
            "SELECT id, user_id FROM voucher_order \
             WHERE voucher_id = ? AND state IN ('cancelled', 'expired')",
            voucher_id,
        )
        .await
    }

    /// The two integer columns of `query` (one `?`: `id`).
    async fn pairs(&self, query: &'static str, id: i64) -> Result<Vec<(i64, i64)>> {
        let rows = sqlx::query(self.sql(query))
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::from)
    }

    /// Number of orders stored for voucher `id`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_count(&self, voucher_id: i64) -> Result<i64> {
        let row = sqlx::query(self.sql("SELECT COUNT(*) FROM voucher_order WHERE voucher_id = ?"))
            .bind(voucher_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Stores `order` and takes its unit of stock, in one transaction, or
    /// changes nothing. Safe to repeat: a re-delivered order is recognised
    /// by its id.
    ///
    /// # Errors
    /// [`Error::Database`] for failures other than the outcomes in
    /// [`Recorded`] (then nothing was committed; retrying is safe).
    pub async fn record_order(&self, order: &OrderRecord) -> Result<Recorded> {
        let mut attempt = 1;
        loop {
            match self.try_record_order(order).await {
                Err(Error::Database(sqlx::Error::Database(e)))
                    if attempt < SERIALIZATION_RETRIES
                        && matches!(e.code().as_deref(), Some("40001" | "40P01")) =>
                {
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// Stores several orders with one commit when all of them can be
    /// stored, which is the pipeline's usual case (Redis already decided):
    /// one transaction, one flush to disk, instead of one per order. If any
    /// order is refused or the transaction fails, nothing of it is kept and
    /// each order is recorded on its own ([`Database::record_order`]), so
    /// every element is exactly what `record_order` would have returned.
    ///
    /// # Errors
    /// Per order, as [`Database::record_order`].
    pub async fn record_orders(&self, orders: &[OrderRecord]) -> Vec<Result<Recorded>> {
        if orders.len() > 1 {
            if let Ok(true) = self.try_record_all(orders).await {
                return orders.iter().map(|_| Ok(Recorded::Created)).collect();
            }
            // Re-deliveries mixed with new orders (a take-over, a consumer
            // that died after its commit) need not cost one commit each:
            // the stored ones are set apart and the rest tried together.
            let ids: Vec<i64> = orders.iter().map(|o| o.id.as_i64()).collect();
            if let Ok(stored) = self.stored_among(&ids).await {
                let new: Vec<OrderRecord> = orders
                    .iter()
                    .filter(|o| !stored.contains(&o.id.as_i64()))
                    .copied()
                    .collect();
                if !stored.is_empty() && matches!(self.try_record_all(&new).await, Ok(true)) {
                    return orders
                        .iter()
                        .map(|o| {
                            Ok(if stored.contains(&o.id.as_i64()) {
                                Recorded::AlreadyStored
                            } else {
                                Recorded::Created
                            })
                        })
                        .collect();
                }
            }
        }
        let mut outcomes = Vec::with_capacity(orders.len());
        for order in orders {
            outcomes.push(self.record_order(order).await);
        }
        outcomes
    }

    /// Which of the order ids `ids` are stored.
    async fn stored_among(&self, ids: &[i64]) -> Result<std::collections::HashSet<i64>> {
        let mut stored = std::collections::HashSet::new();
        for chunk in ids.chunks(500) {
            let list: Vec<String> = (1..=chunk.len())
                .map(|n| match self.backend {
                    Backend::Postgres => format!("${n}"),
                    _ => "?".to_owned(),
                })
                .collect();
            let query = format!(
                "SELECT id FROM voucher_order WHERE id IN ({})",
                list.join(",")
            );
            let mut select = sqlx::query(AssertSqlSafe(query));
            for id in chunk {
                select = select.bind(*id);
            }
            let rows = select.fetch_all(&self.pool).await?;
            stored.extend(first_column(&rows)?);
        }
        Ok(stored)
    }

    /// All of `orders` in one transaction: `Ok(true)` if committed,
    /// `Ok(false)` (nothing kept) as soon as one would be refused.
    async fn try_record_all(&self, orders: &[OrderRecord]) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        for order in orders {
            if !self.take_and_insert(&mut tx, order).await? {
                return Ok(false); // dropping `tx` rolls back
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn try_record_order(&self, order: &OrderRecord) -> Result<Recorded> {
        let mut tx = self.pool.begin().await?;
        if self.take_and_insert(&mut tx, order).await? {
            tx.commit().await?;
            Ok(Recorded::Created)
        } else {
            drop(tx); // rolls the decrement back
            self.classify_refusal(order).await
        }
    }

    /// In `tx`: takes a unit of the voucher's stock and inserts `order`.
    /// `Ok(false)` if there was no stock or a unique key refused the order
    /// (the caller rolls back and finds out which).
    async fn take_and_insert(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        order: &OrderRecord,
    ) -> Result<bool> {
        // Take the voucher row's exclusive lock first. Inserting the order
        // first would take a shared lock on it (the foreign key) and then
        // need to upgrade it: two buyers doing that deadlock on InnoDB.
        let taken = sqlx::query(
            self.sql("UPDATE seckill_voucher SET stock = stock - 1 WHERE id = ? AND stock > 0"),
        )
        .bind(order.voucher_id)
        .execute(&mut **tx)
        .await?;
        if taken.rows_affected() == 0 {
            return Ok(false);
        }
        // Reserved until paid: due for the expiry sweep at its deadline,
        // the voucher's payment window after the purchase.
        let inserted = sqlx::query(self.sql(
            "INSERT INTO voucher_order \
             (id, user_id, voucher_id, created_ms, state, pay_by_ms, due_ms, claim_user_id) \
             SELECT ?, ?, id, ?, 'reserved', ? + pay_within_ms, ? + pay_within_ms, ? \
             FROM seckill_voucher WHERE id = ?",
        ))
        .bind(order.id.as_i64())
        .bind(order.user_id)
        .bind(order.created_ms)
        .bind(order.created_ms)
        .bind(order.created_ms)
        .bind(order.user_id)
        .bind(order.voucher_id)
        .execute(&mut **tx)
        .await;
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            other => {
                other?;
                Ok(true)
            }
        }
    }

    /// Marks reserved order `id` of `user_id` paid with the payment of
    /// client key `key`, if its deadline has not passed by the database's
    /// clock. Paying again with the same key is [`Transition::Already`];
    /// with another key, or an order given back or past its deadline,
    /// [`Transition::Refused`].
    ///
    /// # Errors
    /// [`Error::Database`] on failure (then nothing changed, or the
    /// outcome is unknown if the commit's answer was lost: asking again
    /// with the same key tells).
    pub async fn pay_order(&self, id: i64, user_id: i64, key: &str) -> Result<Transition> {
        let paid = sqlx::query(self.sql(
            "UPDATE voucher_order SET state = 'paid', paid_ms = NOW_MS, pay_key = ?, due_ms = NULL \
             WHERE id = ? AND user_id = ? AND state = 'reserved' AND pay_by_ms > NOW_MS",
        ))
        .bind(key)
        .bind(id)
        .bind(user_id)
        .execute(&self.pool)
        .await?;
        let Some((order, pay_key)) = self.order_with_key(id, user_id).await? else {
            return Ok(Transition::NotFound);
        };
        Ok(match order.state {
            OrderState::Paid if paid.rows_affected() == 1 => Transition::Done(order),
            OrderState::Paid if pay_key.as_deref() == Some(key) => Transition::Already(order),
            _ => Transition::Refused(order),
        })
    }

    /// Order `id` (of `user_id` when given) and its payment's key.
    async fn order_with_key(
        &self,
        id: i64,
        user_id: i64,
    ) -> Result<Option<(StoredOrder, Option<String>)>> {
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            ", pay_key FROM voucher_order WHERE id = ? AND user_id = ?"
        )))
        .bind(id)
        .bind(user_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| Ok((stored_order(&r)?, r.try_get(8)?)))
            .transpose()
    }

    /// Gives back reserved order `id`'s unit, in one transaction: the order
    /// becomes cancelled (`why`: [`GiveBack::Cancel`], only by its buyer
    /// `user_id`) or expired ([`GiveBack::Expire`], only once its deadline
    /// passed by the database's clock), the voucher's stock rises by one,
    /// and the buyer's claim is released if the voucher lets them buy
    /// again. The order stays due for the sweep until
    /// [`Database::finish_return`] says Redis has the unit back too.
    ///
    /// # Errors
    /// [`Error::Database`] on failure (then nothing changed, or the
    /// outcome is unknown if the commit's answer was lost: the order's
    /// state tells).
    pub async fn give_back(
        &self,
        id: i64,
        user_id: Option<i64>,
        why: GiveBack,
    ) -> Result<(Transition, Option<Returned>)> {
        let mut attempt = 1;
        loop {
            match self.try_give_back(id, user_id, why).await {
                Err(Error::Database(sqlx::Error::Database(e)))
                    if attempt < SERIALIZATION_RETRIES
                        && matches!(e.code().as_deref(), Some("40001" | "40P01")) =>
                {
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    async fn try_give_back(
        &self,
        id: i64,
        user_id: Option<i64>,
        why: GiveBack,
    ) -> Result<(Transition, Option<Returned>)> {
        // An order's voucher, buyer and the voucher's rebuy rule never
        // change: read before the transaction, whose first statement then
        // writes. (On SQLite a transaction that reads first cannot wait for
        // the write lock: it fails at once when another writer holds it.)
        let row = sqlx::query(self.sql(
            "SELECT o.voucher_id, o.user_id, v.rebuy_after_cancel \
             FROM voucher_order o JOIN seckill_voucher v ON v.id = o.voucher_id WHERE o.id = ?",
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok((Transition::NotFound, None));
        };
        let (voucher_id, buyer, rebuy): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        if user_id.is_some_and(|user| user != buyer) {
            return Ok((Transition::NotFound, None));
        }
        let (state, query) = match why {
            GiveBack::Cancel => (
                OrderState::Cancelled,
                self.sql(
                    "UPDATE voucher_order SET state = 'cancelled', closed_ms = NOW_MS, \
                     due_ms = NOW_MS, claim_user_id = CASE WHEN ? = 1 THEN NULL ELSE claim_user_id END \
                     WHERE id = ? AND state = 'reserved'",
                ),
            ),
            GiveBack::Expire => (
                OrderState::Expired,
                self.sql(
                    "UPDATE voucher_order SET state = 'expired', closed_ms = NOW_MS, \
                     due_ms = NOW_MS, claim_user_id = CASE WHEN ? = 1 THEN NULL ELSE claim_user_id END \
                     WHERE id = ? AND state = 'reserved' AND pay_by_ms <= NOW_MS",
                ),
            ),
        };
        let mut tx = self.pool.begin().await?;
        let changed = sqlx::query(query)
            .bind(rebuy)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if changed.rows_affected() == 1 {
            sqlx::query(self.sql("UPDATE seckill_voucher SET stock = stock + 1 WHERE id = ?"))
                .bind(voucher_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        } else {
            drop(tx);
        }
        let order = self
            .order(id)
            .await?
            .ok_or_else(|| Error::Protocol(format!("order {id} vanished")))?;
        let returned = Returned {
            order_id: id,
            user_id: buyer,
            voucher_id,
            rebuy: rebuy == 1,
        };
        Ok(match order.state {
            s if s == state && changed.rows_affected() == 1 => {
                (Transition::Done(order), Some(returned))
            }
            s if s == state => (Transition::Already(order), None),
            _ => (Transition::Refused(order), None),
        })
    }

    /// Orders the expiry sweep must look at now (by the database's clock),
    /// the most overdue first, at most `limit`: reserved orders past their
    /// deadline, and given-back orders whose unit Redis does not have back
    /// yet. One range read of an index: orders not due cost nothing.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn due_orders(&self, limit: i64) -> Result<Vec<StoredOrder>> {
        let rows = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE due_ms <= NOW_MS ORDER BY due_ms LIMIT ?"
        )))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stored_order).collect()
    }

    /// Records that Redis has given-back order `id`'s unit too: the order
    /// is no longer due.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn finish_return(&self, id: i64) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE voucher_order SET due_ms = NULL \
             WHERE id = ? AND state IN ('cancelled', 'expired')",
        ))
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// How many orders of voucher `id` are in each state: `(reserved,
    /// paid, cancelled, expired)`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_states(&self, voucher_id: i64) -> Result<(i64, i64, i64, i64)> {
        let rows =
            sqlx::query(self.sql(
                "SELECT state, COUNT(*) FROM voucher_order WHERE voucher_id = ? GROUP BY state",
            ))
            .bind(voucher_id)
            .fetch_all(&self.pool)
            .await?;
        let mut counts = (0, 0, 0, 0);
        for row in &rows {
            let (state, n): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            match OrderState::from_stored(&state) {
                Some(OrderState::Reserved) => counts.0 = n,
                Some(OrderState::Paid) => counts.1 = n,
                Some(OrderState::Cancelled) => counts.2 = n,
                Some(OrderState::Expired) => counts.3 = n,
                _ => {}
            }
        }
        Ok(counts)
    }

    /// Why `order` could not be stored (after a rolled-back attempt).
    async fn classify_refusal(&self, order: &OrderRecord) -> Result<Recorded> {
        let same_id = sqlx::query(self.sql("SELECT 1 FROM voucher_order WHERE id = ?"))
            .bind(order.id.as_i64())
            .fetch_optional(&self.pool)
            .await?;
        if same_id.is_some() {
            return Ok(Recorded::AlreadyStored);
        }
        let claimed = sqlx::query(
            self.sql("SELECT 1 FROM voucher_order WHERE voucher_id = ? AND claim_user_id = ?"),
        )
        .bind(order.voucher_id)
        .bind(order.user_id)
        .fetch_optional(&self.pool)
        .await?;
        if claimed.is_some() {
            return Ok(Recorded::UserAlreadyOrdered);
        }
        Ok(match self.voucher_stock(order.voucher_id).await? {
            Some(_) => Recorded::OutOfStock,
            None => Recorded::UnknownVoucher,
        })
    }
}

/// The `VoucherRow` of a `SELECT id, title, stock, begin_ms, end_ms,
/// pay_within_ms, rebuy_after_cancel`.
fn voucher_row(r: &AnyRow) -> Result<VoucherRow, sqlx::Error> {
    Ok(VoucherRow {
        id: r.try_get(0)?,
        title: r.try_get(1)?,
        stock: r.try_get(2)?,
        begin_ms: r.try_get(3)?,
        end_ms: r.try_get(4)?,
        pay_within_ms: r.try_get(5)?,
        rebuy_after_cancel: r.try_get::<i64, _>(6)? == 1,
    })
}

/// The `StoredOrder` of a `SELECT` of [`order_columns`].
fn stored_order(r: &AnyRow) -> Result<StoredOrder> {
    let state: String = r.try_get(4)?;
    Ok(StoredOrder {
        record: OrderRecord {
            id: crate::OrderId::from_i64(r.try_get(0)?)?,
            user_id: r.try_get(1)?,
            voucher_id: r.try_get(2)?,
            created_ms: r.try_get(3)?,
        },
        state: OrderState::from_stored(&state)
            .ok_or_else(|| Error::Protocol(format!("order state {state:?} in the database")))?,
        pay_by_ms: r.try_get(5)?,
        paid_ms: r.try_get(6)?,
        closed_ms: r.try_get(7)?,
    })
}

/// The first column of every row, as integers.
fn first_column(rows: &[AnyRow]) -> Result<Vec<i64>> {
    Ok(rows
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()?)
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
