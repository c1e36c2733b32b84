//! The one place that knows SQL: each statement in the dialect of
//! PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! Every time is integer milliseconds (or microseconds, for a first token)
//! since the Unix epoch by the **database's** clock, read inside the
//! statement that uses it: no session time zone, no 2038 limit, no client
//! clock. PostgreSQL reads `clock_timestamp()` (the statement's time, not
//! the transaction's start).

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{AssertSqlSafe, Row};

use crate::error::{Error, Result};

/// A connection pool to one database.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Postgres(PgPool),
    MySql(MySqlPool),
    Sqlite(SqlitePool),
}

/// A hold as its row knows it: name, owner, token.
pub(crate) type HoldKey = (String, String, i64);

/// What one acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Taken (or re-entered) with this token.
    Yes { token: i64 },
    /// Held by another owner for this long (`None`: unknown).
    Busy { left: Option<Duration> },
}

/// The table's statements, with its name in them.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    table: String,
}

const PG_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";
const PG_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";
const MY_MS: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)";
const MY_US: &str = "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000) AS SIGNED)";
const LITE_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
const LITE_US: &str = "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";

impl Backend {
    /// Opens a pool of `connections` to `url` (`postgres://`,
    /// `mysql://`/`mariadb://`, `sqlite://`).
    pub(crate) async fn open(url: &str, connections: u32) -> Result<Self> {
        let invalid = |e: sqlx::Error| Error::invalid("url", e.to_string());
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let options = PgConnectOptions::from_str(url).map_err(invalid)?;
            let pool = PgPoolOptions::new()
                .max_connections(connections)
                .connect_with(options)
                .await?;
            Ok(Backend::Postgres(pool))
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            let url = url.replacen("mariadb://", "mysql://", 1);
            let options = MySqlConnectOptions::from_str(&url).map_err(invalid)?;
            let pool = MySqlPoolOptions::new()
                .max_connections(connections)
                .connect_with(options)
                .await?;
            Ok(Backend::MySql(pool))
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(invalid)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(5));
            let pool = SqlitePoolOptions::new()
                .max_connections(connections)
                .connect_with(options)
                .await?;
            Ok(Backend::Sqlite(pool))
        } else {
            Err(Error::invalid(
                "url",
                format!("{url:?}: expected postgres://, mysql://, mariadb:// or sqlite:"),
            ))
        }
    }

    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Backend::Postgres(_))
    }

    pub(crate) fn postgres(&self) -> Option<&PgPool> {
        match self {
            Backend::Postgres(pool) => Some(pool),
            _ => None,
        }
    }
}

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        Self {
            table: table.to_owned(),
        }
    }

    /// The channel release notifications go out on (PostgreSQL).
    pub(crate) fn channel(&self) -> String {
        format!("{}_released", self.table)
    }

    /// Creates the table if it does not exist.
    pub(crate) async fn migrate(&self, db: &Backend) -> Result<()> {
        let t = &self.table;
        match db {
            Backend::Postgres(pool) => {
                let ddl = format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     name TEXT COLLATE \"C\" PRIMARY KEY, \
                     owner TEXT, \
                     holds BIGINT NOT NULL DEFAULT 0, \
                     token BIGINT NOT NULL, \
                     expires_at BIGINT NOT NULL DEFAULT 0, \
                     acquired_at BIGINT NOT NULL DEFAULT 0)"
                );
                sqlx::query(AssertSqlSafe(ddl)).execute(pool).await?;
            }
            Backend::MySql(pool) => {
                let ddl = format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     name VARBINARY(255) PRIMARY KEY, \
                     owner VARBINARY(255) NULL, \
                     holds BIGINT NOT NULL DEFAULT 0, \
                     token BIGINT NOT NULL, \
                     expires_at BIGINT NOT NULL DEFAULT 0, \
                     acquired_at BIGINT NOT NULL DEFAULT 0) ENGINE=InnoDB"
                );
                sqlx::query(AssertSqlSafe(ddl)).execute(pool).await?;
            }
            Backend::Sqlite(pool) => {
                let ddl = format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\
                     name TEXT PRIMARY KEY, \
                     owner TEXT, \
                     holds INTEGER NOT NULL DEFAULT 0, \
                     token INTEGER NOT NULL, \
                     expires_at INTEGER NOT NULL DEFAULT 0, \
                     acquired_at INTEGER NOT NULL DEFAULT 0)"
                );
                sqlx::query(AssertSqlSafe(ddl)).execute(pool).await?;
            }
        }
        Ok(())
    }

    /// One attempt: inserts a free row, takes over a free or expired row,
    /// or re-enters `owner`'s live row (re-arming its lease) — one atomic
    /// statement (MySQL: a conditional update whose matched-row count says
    /// whether it took the row, then a read-back).
    pub(crate) async fn acquire(
        &self,
        db: &Backend,
        name: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Taken> {
        let t = &self.table;
        let row = match db {
            Backend::Postgres(pool) => {
                let sql = upsert(t, "$1", "$2", "$3", PG_MS, &format!("GREATEST(1, {PG_US})"));
                sqlx::query(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(owner)
                    .bind(lease_ms)
                    .fetch_optional(pool)
                    .await?
                    .map(|r| r.try_get::<i64, _>(0))
                    .transpose()?
            }
            Backend::Sqlite(pool) => {
                let sql = upsert(t, "?1", "?2", "?3", LITE_MS, &format!("max(1, {LITE_US})"));
                sqlx::query(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(owner)
                    .bind(lease_ms)
                    .fetch_optional(pool)
                    .await?
                    .map(|r| r.try_get::<i64, _>(0))
                    .transpose()?
            }
            Backend::MySql(pool) => self.acquire_mysql(pool, name, owner, lease_ms).await?,
        };
        match row {
            Some(token) => Ok(Taken::Yes { token }),
            None => Ok(Taken::Busy {
                left: self.time_left(db, name).await?,
            }),
        }
    }

    async fn acquire_mysql(
        &self,
        pool: &MySqlPool,
        name: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>> {
        let t = &self.table;
        // MySQL assigns left to right, each seeing the columns set before
        // it: holds, token and acquired_at read the old owner and expiry
        // before owner and expires_at change.
        let live = format!("owner = ? AND expires_at > {MY_MS}");
        let take = format!(
            "UPDATE {t} SET \
             holds = IF({live}, holds + 1, 1), \
             token = IF({live}, token, token + 1), \
             acquired_at = IF({live}, acquired_at, {MY_MS}), \
             owner = ?, \
             expires_at = {MY_MS} + ? \
             WHERE name = ? AND (owner IS NULL OR expires_at <= {MY_MS} OR owner = ?)"
        );
        let mut conn = pool.acquire().await?;
        for first in [true, false] {
            // With CLIENT_FOUND_ROWS (sqlx sets it), the count is of rows
            // matched: 1 if this owner has the row now.
            let taken = sqlx::query(AssertSqlSafe(take.clone()))
                .bind(owner)
                .bind(owner)
                .bind(owner)
                .bind(owner)
                .bind(lease_ms)
                .bind(name)
                .bind(owner)
                .execute(&mut *conn)
                .await?
                .rows_affected()
                == 1;
            if taken {
                let token: i64 = sqlx::query(AssertSqlSafe(format!(
                    "SELECT token FROM {t} WHERE name = ? AND owner = ?"
                )))
                .bind(name)
                .bind(owner)
                .fetch_one(&mut *conn)
                .await?
                .try_get(0)?;
                return Ok(Some(token));
            }
            if !first {
                break;
            }
            // No row matched: the name is new (create it free, then take
            // it) or held by another owner (the insert does nothing).
            let created = sqlx::query(AssertSqlSafe(format!(
                "INSERT IGNORE INTO {t} (name, owner, holds, token, expires_at, acquired_at) \
                 VALUES (?, NULL, 0, GREATEST(0, {MY_US} - 1), 0, 0)"
            )))
            .bind(name)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if created == 0 {
                break;
            }
        }
        Ok(None)
    }

    /// How long the current holder's lease has left (`None`: no row).
    async fn time_left(&self, db: &Backend, name: &str) -> Result<Option<Duration>> {
        let t = &self.table;
        let left: Option<i64> = match db {
            Backend::Postgres(pool) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT expires_at - {PG_MS} FROM {t} WHERE name = $1"
                )))
                .bind(name)
                .fetch_optional(pool)
                .await?
            }
            Backend::MySql(pool) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT expires_at - {MY_MS} FROM {t} WHERE name = ?"
                )))
                .bind(name)
                .fetch_optional(pool)
                .await?
            }
            Backend::Sqlite(pool) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT expires_at - {LITE_MS} FROM {t} WHERE name = ?1"
                )))
                .bind(name)
                .fetch_optional(pool)
                .await?
            }
        };
        Ok(left.map(|ms| Duration::from_millis(ms.max(1).unsigned_abs())))
    }

    /// How long another owner's live hold of `name` has left (`None`: free,
    /// expired, missing or `owner`'s own). A read that takes no write lock:
    /// a waiter asks it before trying again, so that waiters queue no
    /// writes in front of the holder's renewal and release (SQLite has one
    /// writer at a time; the others serialise on the row). Only a hint: the
    /// attempt that follows decides, in one statement.
    pub(crate) async fn held_by_other(
        &self,
        db: &Backend,
        name: &str,
        owner: &str,
    ) -> Result<Option<Duration>> {
        let t = &self.table;
        let left: Option<i64> = match db {
            Backend::Postgres(pool) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT expires_at - {PG_MS} FROM {t} WHERE name = $1 \
                     AND owner IS NOT NULL AND owner <> $2 AND expires_at > {PG_MS}"
                )))
                .bind(name)
                .bind(owner)
                .fetch_optional(pool)
                .await?
            }
            Backend::MySql(pool) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT expires_at - {MY_MS} FROM {t} WHERE name = ? \
                     AND owner IS NOT NULL AND owner <> ? AND expires_at > {MY_MS}"
                )))
                .bind(name)
                .bind(owner)
                .fetch_optional(pool)
                .await?
            }
            Backend::Sqlite(pool) => {
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT expires_at - {LITE_MS} FROM {t} WHERE name = ?1 \
                     AND owner IS NOT NULL AND owner <> ?2 AND expires_at > {LITE_MS}"
                )))
                .bind(name)
                .bind(owner)
                .fetch_optional(pool)
                .await?
            }
        };
        Ok(left
            .filter(|&ms| ms > 0)
            .map(|ms| Duration::from_millis(ms.unsigned_abs())))
    }

    /// Gives back `holds` holds of `owner`'s live row, checking owner and
    /// expiry in the same statement; the last frees the row (owner NULL)
    /// without deleting it, so its token survives. `Ok(None)`: not held
    /// (nothing changed); `Ok(Some(freed))` otherwise.
    pub(crate) async fn release(
        &self,
        db: &Backend,
        name: &str,
        owner: &str,
        holds: i64,
    ) -> Result<Option<bool>> {
        let t = &self.table;
        let released = |left: Option<i64>| left.map(|left| left == 0);
        match db {
            Backend::Postgres(pool) => {
                let sql = release(t, "$1", "$2", "$3", PG_MS);
                let left: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(owner)
                    .bind(holds)
                    .fetch_optional(pool)
                    .await?;
                if left == Some(0) {
                    sqlx::query("SELECT pg_notify($1, $2)")
                        .bind(self.channel())
                        .bind(name)
                        .execute(pool)
                        .await?;
                }
                Ok(released(left))
            }
            Backend::Sqlite(pool) => {
                let sql = release(t, "?1", "?2", "?3", LITE_MS);
                let left: Option<i64> = sqlx::query_scalar(AssertSqlSafe(sql))
                    .bind(name)
                    .bind(owner)
                    .bind(holds)
                    .fetch_optional(pool)
                    .await?;
                Ok(released(left))
            }
            Backend::MySql(pool) => {
                let last = "holds <= ?";
                let sql = format!(
                    "UPDATE {t} SET \
                     owner = IF({last}, NULL, owner), \
                     expires_at = IF({last}, 0, expires_at), \
                     holds = IF({last}, 0, holds - ?) \
                     WHERE name = ? AND owner = ? AND expires_at > {MY_MS}"
                );
                let mut conn = pool.acquire().await?;
                let matched = sqlx::query(AssertSqlSafe(sql))
                    .bind(holds)
                    .bind(holds)
                    .bind(holds)
                    .bind(holds)
                    .bind(name)
                    .bind(owner)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                if matched == 0 {
                    return Ok(None);
                }
                let freed: Option<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT holds FROM {t} WHERE name = ? AND owner IS NULL"
                )))
                .bind(name)
                .fetch_optional(&mut *conn)
                .await?;
                Ok(Some(freed.is_some()))
            }
        }
    }

    /// `owner`'s live holds of `name` and what is left of their lease
    /// (`None`: `owner` does not hold it).
    pub(crate) async fn held_by(
        &self,
        db: &Backend,
        name: &str,
        owner: &str,
    ) -> Result<Option<(i64, Duration)>> {
        let t = &self.table;
        let row: Option<(i64, i64)> = match db {
            Backend::Postgres(pool) => {
                sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT holds, expires_at - {PG_MS} FROM {t} \
                 WHERE name = $1 AND owner = $2 AND expires_at > {PG_MS}"
                )))
                .bind(name)
                .bind(owner)
                .fetch_optional(pool)
                .await?
            }
            Backend::MySql(pool) => {
                sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT holds, expires_at - {MY_MS} FROM {t} \
                 WHERE name = ? AND owner = ? AND expires_at > {MY_MS}"
                )))
                .bind(name)
                .bind(owner)
                .fetch_optional(pool)
                .await?
            }
            Backend::Sqlite(pool) => {
                sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT holds, expires_at - {LITE_MS} FROM {t} \
                 WHERE name = ?1 AND owner = ?2 AND expires_at > {LITE_MS}"
                )))
                .bind(name)
                .bind(owner)
                .fetch_optional(pool)
                .await?
            }
        };
        Ok(row.map(|(holds, left)| (holds, Duration::from_millis(left.max(0).unsigned_abs()))))
    }

    /// What is left of the current holder's lease (`None`: free).
    pub(crate) async fn remaining(&self, db: &Backend, name: &str) -> Result<Option<Duration>> {
        if !self.is_locked(db, name).await? {
            return Ok(None);
        }
        self.time_left(db, name).await
    }

    /// Frees `name` whoever holds it (the row and its token stay); true if
    /// it was held. Wakes the waiters (PostgreSQL: NOTIFY).
    pub(crate) async fn force_release(&self, db: &Backend, name: &str) -> Result<bool> {
        let t = &self.table;
        let freed = match db {
            Backend::Postgres(pool) => {
                let freed = sqlx::query(AssertSqlSafe(format!(
                    "UPDATE {t} SET owner = NULL, holds = 0, expires_at = 0 \
                     WHERE name = $1 AND owner IS NOT NULL AND expires_at > {PG_MS}"
                )))
                .bind(name)
                .execute(pool)
                .await?
                .rows_affected();
                if freed > 0 {
                    sqlx::query("SELECT pg_notify($1, $2)")
                        .bind(self.channel())
                        .bind(name)
                        .execute(pool)
                        .await?;
                }
                freed
            }
            Backend::MySql(pool) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {t} SET owner = NULL, holds = 0, expires_at = 0 \
                 WHERE name = ? AND owner IS NOT NULL AND expires_at > {MY_MS}"
            )))
            .bind(name)
            .execute(pool)
            .await?
            .rows_affected(),
            Backend::Sqlite(pool) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {t} SET owner = NULL, holds = 0, expires_at = 0 \
                 WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {LITE_MS}"
            )))
            .bind(name)
            .execute(pool)
            .await?
            .rows_affected(),
        };
        Ok(freed > 0)
    }

    /// Re-arms every live hold among `holds` to `lease_ms` from now, in one
    /// statement per 100; returns those renewed (the others expired or were
    /// taken: lost). A hold is its row's (name, owner, token): a row the
    /// same owner took again after losing it has a new token, and renewing
    /// it says nothing of the hold that was lost.
    pub(crate) async fn extend_many(
        &self,
        db: &Backend,
        holds: &[HoldKey],
        lease_ms: i64,
    ) -> Result<Vec<HoldKey>> {
        let mut renewed = Vec::with_capacity(holds.len());
        for chunk in holds.chunks(100) {
            renewed.extend(self.extend_chunk(db, chunk, lease_ms).await?);
        }
        Ok(renewed)
    }

    async fn extend_chunk(
        &self,
        db: &Backend,
        holds: &[HoldKey],
        lease_ms: i64,
    ) -> Result<Vec<HoldKey>> {
        let t = &self.table;
        let triples = |first: usize, numbered: bool, dollar: bool| -> String {
            (0..holds.len())
                .map(|i| {
                    let [a, b, c] = [0, 1, 2].map(|k| first + 3 * i + k);
                    match (numbered, dollar) {
                        (true, true) => format!("(${a}, ${b}, ${c})"),
                        (true, false) => format!("(?{a}, ?{b}, ?{c})"),
                        _ => "(?, ?, ?)".to_owned(),
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        match db {
            Backend::Postgres(pool) => {
                let sql = format!(
                    "UPDATE {t} SET expires_at = {PG_MS} + $1 \
                     WHERE (name, owner, token) IN ({}) AND expires_at > {PG_MS} \
                     RETURNING name, owner, token",
                    triples(2, true, true)
                );
                let mut query = sqlx::query_as(AssertSqlSafe(sql)).bind(lease_ms);
                for (name, owner, token) in holds {
                    query = query.bind(name).bind(owner).bind(token);
                }
                Ok(query.fetch_all(pool).await?)
            }
            Backend::Sqlite(pool) => {
                let sql = format!(
                    "UPDATE {t} SET expires_at = {LITE_MS} + ?1 \
                     WHERE (name, owner, token) IN ({}) AND expires_at > {LITE_MS} \
                     RETURNING name, owner, token",
                    triples(2, true, false)
                );
                let mut query = sqlx::query_as(AssertSqlSafe(sql)).bind(lease_ms);
                for (name, owner, token) in holds {
                    query = query.bind(name).bind(owner).bind(token);
                }
                Ok(query.fetch_all(pool).await?)
            }
            Backend::MySql(pool) => {
                // No RETURNING: the update, then which of them are live and
                // still ours, on the same connection.
                let list = triples(0, false, false);
                let mut conn = pool.acquire().await?;
                let mut update = sqlx::query(AssertSqlSafe(format!(
                    "UPDATE {t} SET expires_at = {MY_MS} + ? \
                     WHERE (name, owner, token) IN ({list}) AND expires_at > {MY_MS}"
                )))
                .bind(lease_ms);
                for (name, owner, token) in holds {
                    update = update.bind(name).bind(owner).bind(token);
                }
                update.execute(&mut *conn).await?;
                let mut live = sqlx::query_as(AssertSqlSafe(format!(
                    "SELECT CAST(name AS CHAR), CAST(owner AS CHAR), token FROM {t} \
                     WHERE (name, owner, token) IN ({list}) AND expires_at > {MY_MS}"
                )));
                for (name, owner, token) in holds {
                    live = live.bind(name).bind(owner).bind(token);
                }
                Ok(live.fetch_all(&mut *conn).await?)
            }
        }
    }

    /// Whether any owner holds `name` now (by the database's clock).
    pub(crate) async fn is_locked(&self, db: &Backend, name: &str) -> Result<bool> {
        let t = &self.table;
        let n: i64 = match db {
            Backend::Postgres(pool) => sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {t} WHERE name = $1 AND owner IS NOT NULL AND expires_at > {PG_MS}"
            )))
            .bind(name)
            .fetch_one(pool)
            .await?,
            Backend::MySql(pool) => sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {t} WHERE name = ? AND owner IS NOT NULL AND expires_at > {MY_MS}"
            )))
            .bind(name)
            .fetch_one(pool)
            .await?,
            Backend::Sqlite(pool) => sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT count(*) FROM {t} WHERE name = ?1 AND owner IS NOT NULL AND expires_at > {LITE_MS}"
            )))
            .bind(name)
            .fetch_one(pool)
            .await?,
        };
        Ok(n > 0)
    }
}

/// PostgreSQL's and SQLite's acquire: one upsert whose `WHERE` lets it
/// take only a free or expired row or this owner's own; `RETURNING` gives
/// the token when it did (no row: held by another owner).
fn upsert(t: &str, name: &str, owner: &str, lease: &str, ms: &str, first_token: &str) -> String {
    let live = format!("{t}.owner = excluded.owner AND {t}.expires_at > {ms}");
    format!(
        "INSERT INTO {t} (name, owner, holds, token, expires_at, acquired_at) \
         VALUES ({name}, {owner}, 1, {first_token}, {ms} + {lease}, {ms}) \
         ON CONFLICT (name) DO UPDATE SET \
         holds = CASE WHEN {live} THEN {t}.holds + 1 ELSE 1 END, \
         token = CASE WHEN {live} THEN {t}.token ELSE {t}.token + 1 END, \
         acquired_at = CASE WHEN {live} THEN {t}.acquired_at ELSE excluded.acquired_at END, \
         owner = excluded.owner, \
         expires_at = excluded.expires_at \
         WHERE {t}.owner IS NULL OR {t}.expires_at <= {ms} OR {t}.owner = excluded.owner \
         RETURNING token"
    )
}

/// PostgreSQL's and SQLite's release (every `SET` reads the old row).
fn release(t: &str, name: &str, owner: &str, holds: &str, ms: &str) -> String {
    format!(
        "UPDATE {t} SET \
         owner = CASE WHEN holds <= {holds} THEN NULL ELSE owner END, \
         expires_at = CASE WHEN holds <= {holds} THEN 0 ELSE expires_at END, \
         holds = CASE WHEN holds <= {holds} THEN 0 ELSE holds - {holds} END \
         WHERE name = {name} AND owner = {owner} AND expires_at > {ms} \
         RETURNING holds"
    )
}
