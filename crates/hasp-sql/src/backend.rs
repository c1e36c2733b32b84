//! The one place that knows SQL: each statement in the dialect of
//! PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! Every time is integer milliseconds (or microseconds, for a first token)
//! since the Unix epoch by the **database's** clock (`clock`).

use std::str::FromStr;
use std::time::Duration;

#[cfg(feature = "mysql")]
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
#[cfg(feature = "postgres")]
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
#[cfg(feature = "sqlite")]
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::AssertSqlSafe;
#[cfg(feature = "mysql")]
use sqlx::Row;

use crate::clock::Dialect;
use crate::error::{Error, Result};

/// A connection pool to one database.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    #[cfg(feature = "postgres")]
    Postgres(PgPool),
    #[cfg(feature = "mysql")]
    MySql(MySqlPool),
    #[cfg(feature = "sqlite")]
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

fn invalid_url(e: sqlx::Error) -> Error {
    Error::invalid("url", e.to_string())
}

/// The error for a URL whose driver this build left out.
#[cfg(not(all(feature = "postgres", feature = "mysql", feature = "sqlite")))]
fn not_built(url: &str, driver: &str) -> Error {
    Error::invalid(
        "url",
        format!("{url:?}: this build has no {driver} driver (cargo feature `{driver}`)"),
    )
}

impl Backend {
    /// Opens a pool of `connections` to `url` (`postgres://`,
    /// `mysql://`/`mariadb://`, `sqlite://`).
    pub(crate) async fn open(url: &str, connections: u32) -> Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            #[cfg(feature = "postgres")]
            return Self::open_postgres(url, connections).await;
            #[cfg(not(feature = "postgres"))]
            return Err(not_built(url, "postgres"));
        }
        if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            #[cfg(feature = "mysql")]
            return Self::open_mysql(url, connections).await;
            #[cfg(not(feature = "mysql"))]
            return Err(not_built(url, "mysql"));
        }
        if url.starts_with("sqlite:") {
            #[cfg(feature = "sqlite")]
            return Self::open_sqlite(url, connections).await;
            #[cfg(not(feature = "sqlite"))]
            return Err(not_built(url, "sqlite"));
        }
        Err(Error::invalid(
            "url",
            format!("{url:?}: expected postgres://, mysql://, mariadb:// or sqlite:"),
        ))
    }

    #[cfg(feature = "postgres")]
    async fn open_postgres(url: &str, connections: u32) -> Result<Self> {
        let options = PgConnectOptions::from_str(url).map_err(invalid_url)?;
        let pool = PgPoolOptions::new()
            .max_connections(connections)
            .connect_with(options)
            .await?;
        Ok(Backend::Postgres(pool))
    }

    #[cfg(feature = "mysql")]
    async fn open_mysql(url: &str, connections: u32) -> Result<Self> {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let options = MySqlConnectOptions::from_str(&url).map_err(invalid_url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(connections)
            .connect_with(options)
            .await?;
        Ok(Backend::MySql(pool))
    }

    #[cfg(feature = "sqlite")]
    async fn open_sqlite(url: &str, connections: u32) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(invalid_url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(connections)
            .connect_with(options)
            .await?;
        Ok(Backend::Sqlite(pool))
    }

    pub(crate) fn is_postgres(&self) -> bool {
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)] // a build with PostgreSQL alone
        if let Backend::Postgres(_) = self {
            return true;
        }
        false
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(&self) -> Option<&PgPool> {
        match self {
            Backend::Postgres(pool) => Some(pool),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
}

/// Runs `$query` (a function of `sqlx`: `query`, `query_scalar`,
/// `query_as`) with the statement `$sql` on `$db`'s pool, its arguments
/// bound by `$bind` (a function of the query, written once for every
/// backend), then `$run` (`fetch_optional`, `fetch_all`, ...; `execute`
/// answers the rows affected).
macro_rules! on {
    // An `execute`, whose result type is each backend's own: its count of
    // rows affected.
    ($db:expr, $query:ident, $sql:expr, |$q:ident| $bind:expr, execute) => {
        match $db {
            #[cfg(feature = "postgres")]
            Backend::Postgres(pool) => {
                let $q = sqlx::$query(AssertSqlSafe($sql));
                $bind.execute(pool).await?.rows_affected()
            }
            #[cfg(feature = "mysql")]
            Backend::MySql(pool) => {
                let $q = sqlx::$query(AssertSqlSafe($sql));
                $bind.execute(pool).await?.rows_affected()
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(pool) => {
                let $q = sqlx::$query(AssertSqlSafe($sql));
                $bind.execute(pool).await?.rows_affected()
            }
        }
    };
    ($db:expr, $query:ident, $sql:expr, |$q:ident| $bind:expr, $run:ident) => {
        match $db {
            #[cfg(feature = "postgres")]
            Backend::Postgres(pool) => {
                let $q = sqlx::$query(AssertSqlSafe($sql));
                $bind.$run(pool).await?
            }
            #[cfg(feature = "mysql")]
            Backend::MySql(pool) => {
                let $q = sqlx::$query(AssertSqlSafe($sql));
                $bind.$run(pool).await?
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(pool) => {
                let $q = sqlx::$query(AssertSqlSafe($sql));
                $bind.$run(pool).await?
            }
        }
    };
}

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        Self {
            table: table.to_owned(),
        }
    }

    /// The channel release notifications go out on (PostgreSQL).
    #[cfg(feature = "postgres")]
    pub(crate) fn channel(&self) -> String {
        format!("{}_released", self.table)
    }

    /// `template` in `db`'s dialect: `{t}` the table, `{ms}` the database's
    /// clock in milliseconds, `{us}` in microseconds, `{text}` a name or
    /// owner column's type, `{int}` an integer column's type, `{engine}`
    /// the table options; `?` placeholders numbered `$1, $2, …` for
    /// PostgreSQL. Only `'static` templates and the table name (checked by
    /// the settings) enter the SQL.
    fn sql(&self, db: &Backend, template: &'static str) -> String {
        let (ms, us, text, int, engine) = match db {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => (
                Dialect::Postgres.now_ms(),
                Dialect::Postgres.now_us(),
                "TEXT COLLATE \"C\"",
                "BIGINT",
                "",
            ),
            #[cfg(feature = "mysql")]
            Backend::MySql(_) => (
                Dialect::MySql.now_ms(),
                Dialect::MySql.now_us(),
                "VARBINARY(255)",
                "BIGINT",
                " ENGINE=InnoDB",
            ),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => (
                Dialect::Sqlite.now_ms(),
                Dialect::Sqlite.now_us(),
                "TEXT",
                "INTEGER",
                "",
            ),
        };
        let sql = template
            .replace("{t}", &self.table)
            .replace("{ms}", ms)
            .replace("{us}", us)
            .replace("{text}", text)
            .replace("{int}", int)
            .replace("{engine}", engine);
        numbered(db, sql)
    }

    /// Creates the table if it does not exist.
    pub(crate) async fn migrate(&self, db: &Backend) -> Result<()> {
        let ddl = self.sql(
            db,
            "CREATE TABLE IF NOT EXISTS {t} (\
             name {text} PRIMARY KEY, \
             owner {text} NULL, \
             holds {int} NOT NULL DEFAULT 0, \
             token {int} NOT NULL, \
             expires_at {int} NOT NULL DEFAULT 0, \
             acquired_at {int} NOT NULL DEFAULT 0){engine}",
        );
        on!(db, query, ddl, |q| q, execute);
        Ok(())
    }

    /// One attempt: inserts a free row, takes over a free or expired row,
    /// or re-enters `owner`'s live row (re-arming its lease) — one atomic
    /// statement (MySQL, which has no `ON CONFLICT` nor `RETURNING`: a
    /// conditional update whose matched-row count says whether it took the
    /// row, then a read-back).
    pub(crate) async fn acquire(
        &self,
        db: &Backend,
        name: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Taken> {
        let row = match db {
            #[cfg(feature = "mysql")]
            Backend::MySql(pool) => self.acquire_mysql(db, pool, name, owner, lease_ms).await?,
            #[allow(unreachable_patterns)]
            _ => {
                let sql = self.sql(db, UPSERT);
                let token: Option<i64> = on!(
                    db,
                    query_scalar,
                    sql,
                    |q| q.bind(name).bind(owner).bind(lease_ms),
                    fetch_optional
                );
                token
            }
        };
        match row {
            Some(token) => Ok(Taken::Yes { token }),
            None => Ok(Taken::Busy {
                left: self.time_left(db, name).await?,
            }),
        }
    }

    #[cfg(feature = "mysql")]
    async fn acquire_mysql(
        &self,
        db: &Backend,
        pool: &MySqlPool,
        name: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Option<i64>> {
        // MySQL assigns left to right, each seeing the columns set before
        // it: holds, token and acquired_at read the old owner and expiry
        // before owner and expires_at change.
        let take = self.sql(
            db,
            "UPDATE {t} SET \
             holds = IF(owner = ? AND expires_at > {ms}, holds + 1, 1), \
             token = IF(owner = ? AND expires_at > {ms}, token, token + 1), \
             acquired_at = IF(owner = ? AND expires_at > {ms}, acquired_at, {ms}), \
             owner = ?, \
             expires_at = {ms} + ? \
             WHERE name = ? AND (owner IS NULL OR expires_at <= {ms} OR owner = ?)",
        );
        let read_back = self.sql(db, "SELECT token FROM {t} WHERE name = ? AND owner = ?");
        let create = self.sql(
            db,
            "INSERT IGNORE INTO {t} (name, owner, holds, token, expires_at, acquired_at) \
             VALUES (?, NULL, 0, GREATEST(0, {us} - 1), 0, 0)",
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
                let token: i64 = sqlx::query(AssertSqlSafe(read_back.clone()))
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
            let created = sqlx::query(AssertSqlSafe(create.clone()))
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
        let sql = self.sql(db, "SELECT expires_at - {ms} FROM {t} WHERE name = ?");
        let left: Option<i64> = on!(db, query_scalar, sql, |q| q.bind(name), fetch_optional);
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
        let sql = self.sql(
            db,
            "SELECT expires_at - {ms} FROM {t} WHERE name = ? \
             AND owner IS NOT NULL AND owner <> ? AND expires_at > {ms}",
        );
        let left: Option<i64> = on!(
            db,
            query_scalar,
            sql,
            |q| q.bind(name).bind(owner),
            fetch_optional
        );
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
        #[cfg(feature = "mysql")]
        #[allow(irrefutable_let_patterns)] // a build with MySQL alone
        if let Backend::MySql(pool) = db {
            return self.release_mysql(db, pool, name, owner, holds).await;
        }
        let sql = self.sql(db, RELEASE);
        let left: Option<i64> = on!(
            db,
            query_scalar,
            sql,
            |q| q
                .bind(holds)
                .bind(holds)
                .bind(holds)
                .bind(holds)
                .bind(name)
                .bind(owner),
            fetch_optional
        );
        if left == Some(0) {
            self.notify(db, name).await?;
        }
        Ok(left.map(|left| left == 0))
    }

    #[cfg(feature = "mysql")]
    async fn release_mysql(
        &self,
        db: &Backend,
        pool: &MySqlPool,
        name: &str,
        owner: &str,
        holds: i64,
    ) -> Result<Option<bool>> {
        let update = self.sql(
            db,
            "UPDATE {t} SET \
             owner = IF(holds <= ?, NULL, owner), \
             expires_at = IF(holds <= ?, 0, expires_at), \
             holds = IF(holds <= ?, 0, holds - ?) \
             WHERE name = ? AND owner = ? AND expires_at > {ms}",
        );
        let read_back = self.sql(db, "SELECT holds FROM {t} WHERE name = ? AND owner IS NULL");
        let mut conn = pool.acquire().await?;
        let matched = sqlx::query(AssertSqlSafe(update))
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
        let freed: Option<i64> = sqlx::query_scalar(AssertSqlSafe(read_back))
            .bind(name)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(Some(freed.is_some()))
    }

    /// PostgreSQL: tells the listeners that `name` was freed (the other
    /// backends' waiters read the row when their back-off ends).
    async fn notify(&self, db: &Backend, name: &str) -> Result<()> {
        #[cfg(not(feature = "postgres"))]
        let _ = (db, name);
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)] // a build with PostgreSQL alone
        if let Backend::Postgres(pool) = db {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(self.channel())
                .bind(name)
                .execute(pool)
                .await?;
        }
        Ok(())
    }

    /// `owner`'s live holds of `name` and what is left of their lease
    /// (`None`: `owner` does not hold it).
    pub(crate) async fn held_by(
        &self,
        db: &Backend,
        name: &str,
        owner: &str,
    ) -> Result<Option<(i64, Duration)>> {
        let sql = self.sql(
            db,
            "SELECT holds, expires_at - {ms} FROM {t} \
             WHERE name = ? AND owner = ? AND expires_at > {ms}",
        );
        let row: Option<(i64, i64)> = on!(
            db,
            query_as,
            sql,
            |q| q.bind(name).bind(owner),
            fetch_optional
        );
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
        let sql = self.sql(
            db,
            "UPDATE {t} SET owner = NULL, holds = 0, expires_at = 0 \
             WHERE name = ? AND owner IS NOT NULL AND expires_at > {ms}",
        );
        let freed = on!(db, query, sql, |q| q.bind(name), execute) > 0;
        if freed {
            self.notify(db, name).await?;
        }
        Ok(freed)
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
        let list = vec!["(?, ?, ?)"; holds.len()].join(", ");
        let ms = match db {
            #[cfg(feature = "postgres")]
            Backend::Postgres(_) => Dialect::Postgres.now_ms(),
            #[cfg(feature = "mysql")]
            Backend::MySql(_) => Dialect::MySql.now_ms(),
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(_) => Dialect::Sqlite.now_ms(),
        };
        // Built here rather than from a template: its list of holds has a
        // length of its own.
        let update = numbered(
            db,
            format!(
                "UPDATE {t} SET expires_at = {ms} + ? \
             WHERE (name, owner, token) IN ({list}) AND expires_at > {ms}"
            ),
        );
        #[cfg(feature = "mysql")]
        #[allow(irrefutable_let_patterns)] // a build with MySQL alone
        if let Backend::MySql(pool) = db {
            return self
                .extend_mysql(pool, update, holds, lease_ms, &list, ms)
                .await;
        }
        // RETURNING: the holds this statement renewed.
        let sql = format!("{update} RETURNING name, owner, token");
        let renewed: Vec<HoldKey> = on!(
            db,
            query_as,
            sql,
            |q| holds
                .iter()
                .fold(q.bind(lease_ms), |q, (name, owner, token)| q
                    .bind(name)
                    .bind(owner)
                    .bind(token)),
            fetch_all
        );
        Ok(renewed)
    }

    /// MySQL's renewal: no `RETURNING`, so the update, then which of them
    /// are live and still ours, on the same connection.
    #[cfg(feature = "mysql")]
    async fn extend_mysql(
        &self,
        pool: &MySqlPool,
        update: String,
        holds: &[HoldKey],
        lease_ms: i64,
        list: &str,
        ms: &str,
    ) -> Result<Vec<HoldKey>> {
        let t = &self.table;
        let mut conn = pool.acquire().await?;
        let mut update = sqlx::query(AssertSqlSafe(update)).bind(lease_ms);
        for (name, owner, token) in holds {
            update = update.bind(name).bind(owner).bind(token);
        }
        update.execute(&mut *conn).await?;
        let mut live = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT CAST(name AS CHAR), CAST(owner AS CHAR), token FROM {t} \
             WHERE (name, owner, token) IN ({list}) AND expires_at > {ms}"
        )));
        for (name, owner, token) in holds {
            live = live.bind(name).bind(owner).bind(token);
        }
        Ok(live.fetch_all(&mut *conn).await?)
    }

    /// Whether any owner holds `name` now (by the database's clock).
    pub(crate) async fn is_locked(&self, db: &Backend, name: &str) -> Result<bool> {
        let sql = self.sql(
            db,
            "SELECT count(*) FROM {t} WHERE name = ? AND owner IS NOT NULL AND expires_at > {ms}",
        );
        let n: i64 = on!(db, query_scalar, sql, |q| q.bind(name), fetch_one);
        Ok(n > 0)
    }
}

/// `sql` with its `?` placeholders numbered `$1, $2, …` for PostgreSQL,
/// as it is for the others.
fn numbered(db: &Backend, sql: String) -> String {
    if !db.is_postgres() {
        return sql;
    }
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// PostgreSQL's and SQLite's acquire: one upsert whose `WHERE` lets it
/// take only a free or expired row or this owner's own; `RETURNING` gives
/// the token when it did (no row: held by another owner). A first token is
/// the clock in microseconds (at least 1): tokens of a name never go back,
/// even when its row was deleted.
const UPSERT: &str = "INSERT INTO {t} (name, owner, holds, token, expires_at, acquired_at) \
     VALUES (?, ?, 1, CASE WHEN {us} > 1 THEN {us} ELSE 1 END, {ms} + ?, {ms}) \
     ON CONFLICT (name) DO UPDATE SET \
     holds = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {ms} \
       THEN {t}.holds + 1 ELSE 1 END, \
     token = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {ms} \
       THEN {t}.token ELSE {t}.token + 1 END, \
     acquired_at = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {ms} \
       THEN {t}.acquired_at ELSE excluded.acquired_at END, \
     owner = excluded.owner, \
     expires_at = excluded.expires_at \
     WHERE {t}.owner IS NULL OR {t}.expires_at <= {ms} OR {t}.owner = excluded.owner \
     RETURNING token";

/// PostgreSQL's and SQLite's release (every `SET` reads the old row); the
/// holds to give back are bound four times.
const RELEASE: &str = "UPDATE {t} SET \
     owner = CASE WHEN holds <= ? THEN NULL ELSE owner END, \
     expires_at = CASE WHEN holds <= ? THEN 0 ELSE expires_at END, \
     holds = CASE WHEN holds <= ? THEN 0 ELSE holds - ? END \
     WHERE name = ? AND owner = ? AND expires_at > {ms} \
     RETURNING holds";
