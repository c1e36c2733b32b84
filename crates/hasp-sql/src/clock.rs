//! The database's clock as SQL: integer milliseconds or microseconds since
//! the Unix epoch, read inside the statement that uses it, in each dialect
//! hasp-sql speaks.
//!
//! No session time zone, no 2038 limit, no client clock: every process
//! sharing a database judges time by the same clock. PostgreSQL's reads
//! `clock_timestamp()`, the statement's own time rather than its
//! transaction's start.

/// An SQL dialect: which server a statement is written for.
///
/// ```
/// use hasp_sql::Dialect;
///
/// let due = format!("SELECT id FROM orders WHERE due_ms <= {}", Dialect::Postgres.now_ms());
/// assert!(due.contains("clock_timestamp()"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    MySql,
    /// SQLite.
    Sqlite,
}

impl Dialect {
    /// An SQL expression for the database's clock in Unix milliseconds (a
    /// 64-bit integer).
    pub const fn now_ms(self) -> &'static str {
        match self {
            Dialect::Postgres => "(extract(epoch from clock_timestamp()) * 1000)::bigint",
            Dialect::MySql => "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000) AS SIGNED)",
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
        }
    }

    /// An SQL expression for the database's clock in Unix microseconds (a
    /// 64-bit integer; SQLite's clock has millisecond resolution).
    pub const fn now_us(self) -> &'static str {
        match self {
            Dialect::Postgres => "(extract(epoch from clock_timestamp()) * 1000000)::bigint",
            Dialect::MySql => "CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) * 1000000) AS SIGNED)",
            Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)",
        }
    }
}
