//! # hasp-sql — hasp's lock kept in a database table
//!
//! For a deployment with PostgreSQL, MySQL/MariaDB or SQLite and no Redis:
//! the same shape as `hasp::Lock` (owner, lease or watchdog renewal,
//! re-entry, guards with an async `unlock`, a loss signal, fencing tokens),
//! kept in one row per name.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> hasp_sql::Result<()> {
//! # let file = std::env::temp_dir().join(format!("hasp-sql-lib-{}", std::process::id()));
//! # let url = format!("sqlite://{}?mode=rwc", file.display());
//! use std::time::Duration;
//!
//! let client = hasp_sql::SqlClient::open(&url, hasp_sql::SqlSettings::default()).await?;
//! client.migrate().await?;
//! let lock = client.lock("invoice:42")?.with_lease(Duration::from_secs(10))?;
//! if let Some(guard) = lock.try_lock_for(Duration::from_millis(100)).await? {
//!     let again = lock.lock().await?;  // re-entry by the same task
//!     assert_eq!(again.fencing_token(), guard.fencing_token());
//!     again.unlock().await?;
//!     guard.unlock().await?;
//! }
//! # drop(client); let _ = std::fs::remove_file(&file);
//! # Ok(())
//! # }
//! ```
//!
//! ## Drivers
//!
//! Each database's driver is a cargo feature, all three on by default:
//! `postgres`, `mysql` (MySQL and MariaDB), `sqlite`. A build with
//! `default-features = false, features = ["postgres"]` compiles no other
//! driver, and a URL for a driver left out is refused with an error naming
//! its feature.
//!
//! ## How it works
//!
//! * **One atomic statement per attempt**, never select-then-insert:
//!   PostgreSQL and SQLite run an `INSERT … ON CONFLICT (name) DO UPDATE …
//!   WHERE` the row is free, expired or this owner's, `RETURNING` the token
//!   (no row: held by another owner); MySQL/MariaDB run a conditional
//!   `UPDATE` whose matched-row count says whether it took the row (then
//!   read the token back), creating a free row first for a new name.
//! * **The database's clock** judges expiry, read inside each statement
//!   (PostgreSQL `clock_timestamp()`, MySQL/MariaDB `NOW(6)`, SQLite
//!   `julianday('now')`), as integer milliseconds since the epoch: no
//!   session time zone, no 2038 limit, no client clock.
//! * **Release** checks owner, count and expiry in the same statement; the
//!   last release frees the row (owner NULL) without deleting it, so the
//!   token survives. A release by a non-owner or after expiry changes
//!   nothing and is [`Error::NotHeld`].
//! * **Fencing**: the token grows by one on every take-over of a free or
//!   expired row; a new row starts at the database clock in microseconds.
//! * **Renewal**: one task per client renews every hold without a lease
//!   every third of the watchdog timeout, 100 holds per statement
//!   (`UPDATE … WHERE (name, owner, token) IN (…)`, `RETURNING` the renewed
//!   ones; MySQL/MariaDB read them back); a renewal that finds the row
//!   expired or taken (by another owner, or by the same owner again after
//!   it was lost: a new token) fires the loss signal at once.
//! * **Waiting**: see [`SqlLock`].
//!
//! ## The table
//!
//! `migrate()` creates it (name from [`SqlSettings::set_table`], default
//! `hasp_locks`): `name` (primary key; PostgreSQL `TEXT COLLATE "C"`,
//! MySQL/MariaDB `VARBINARY(255)`, SQLite `TEXT`: names compare byte for
//! byte everywhere), `owner` (NULL when free), `holds`, `token`,
//! `expires_at` and `acquired_at` (`BIGINT` milliseconds since the epoch,
//! database clock). PostgreSQL notifications go out on the channel
//! `<table>_released` with the name as payload.
//!
//! ## Against PostgreSQL advisory locks
//!
//! `pg_advisory_lock` is cheaper (no row, no write) and the right tool when
//! the holder's work runs on the very connection that took it. But it is
//! bound to that session: it is released when the connection drops (a pool
//! recycling it, a proxy timing it out), kept as long as the session lives
//! even if the holder is stuck, has no lease, no fencing token, and is not
//! visible to other databases or replicas. This lock lives in a row: it
//! survives the connection (renewed over any pooled one), expires with its
//! lease when the holder dies, carries a token, and works the same on
//! MySQL/MariaDB and SQLite. On SQLite it is for one host (file locks on
//! network filesystems are unreliable).

#![warn(missing_docs)]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!("hasp-sql needs at least one driver: enable `postgres`, `mysql` or `sqlite`");

mod backend;
mod client;
mod clock;
mod engine;
mod error;
mod hold;
mod lock;
mod settings;

pub use client::{SqlClient, SqlStats};
pub use clock::Dialect;
pub use error::{is_transient, Error, Result};
pub use hasp_owner::{InvalidOwner, Owner};
pub use lock::{SqlGuard, SqlLock};
pub use settings::SqlSettings;
