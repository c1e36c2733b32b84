//! # hasp — distributed locks on Redis for async Rust
//!
//! Redisson's lock family, built for tokio: reentrant locks with owner
//! identity, leases renewed by a per-client watchdog, waiting woken by
//! pub/sub (not polling), and fencing tokens.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> hasp::Result<()> {
//! # let server = testkit::RedisServer::start();
//! # let url = server.url();
//! let client = hasp::Client::open(&url).await?;
//! let lock = client.lock("stock:voucher-7")?;
//!
//! let guard = lock.lock().await?;          // waits; watchdog keeps it alive
//! let again = lock.lock().await?;          // same task: re-entry, no wait
//! assert_eq!(lock.hold_count(), 2);
//! assert_eq!(again.fencing_token(), guard.fencing_token());
//! again.unlock().await?;
//! guard.unlock().await?;                   // now free for others
//! assert!(!lock.is_locked().await?);
//! # Ok(())
//! # }
//! ```
//!
//! Under the hood a client batches the lock operations its tasks have
//! pending at the same moment into one script call (group commit), renews
//! every lease-less lock it holds from one watchdog task, 100 locks per call,
//! shares one pub/sub subscription per lock name among its waiters, and
//! hands a lock its task releases straight to its next waiting task in the
//! same call (unless another client waits too: then that client goes first).
//!
//! * [`Client`] — one per Redis deployment; clone it freely.
//! * [`Lock`] — a named lock handle: [`Lock::lock`] waits,
//!   [`Lock::try_lock`] never waits, [`Lock::try_lock_for`] waits a bounded
//!   time; [`Lock::with_lease`] / [`Lock::with_owner`] configure it.
//! * [`Guard`] — a held lock: [`Guard::unlock`], [`Guard::fencing_token`],
//!   [`Guard::lost`].
//! * [`Error`] — separates outcomes ([`Error::NotHeld`]) from failures
//!   ([`Error::Redis`]).
//!
//! ## Key layout
//!
//! For a lock named `N` under prefix `P` (default `hasp`), with `E` = `N`
//! where `%`, `{`, `}` are percent-encoded:
//!
//! | key / channel              | type    | content                                   |
//! |----------------------------|---------|-------------------------------------------|
//! | `P:{E}`                    | hash    | `<owner id>` → hold count; `:w` → the id of the client waiting, `*` if several |
//! | `P:{E}:fence`              | string  | last fencing token issued: the holder's while held (no TTL) |
//! | `P:{E}:released`           | channel | release notifications                     |
//!
//! `{E}` is the hash tag of all three, so one lock lives in one Redis
//! Cluster slot whatever characters its name holds, and distinct names never
//! share keys.

#![warn(missing_docs)]

mod client;
mod config;
mod core;
mod error;
mod guard;
mod lock;
mod owner;

/// Not part of the API: what the lock benchmark (`benches/lock.rs`) needs to
/// drive Redis with hasp's own script, without a copy of its wire format.
#[doc(hidden)]
pub mod __bench {
    /// The source of `batch.lua`.
    pub const BATCH_SCRIPT: &str = crate::core::BATCH_SOURCE;

    /// Every argument of one `EVALSHA` of `batch.lua` under `prefix`: for
    /// each `(name, owner, lease)`, an acquisition when `lease` is
    /// `Some(ms)`, else the release of one hold.
    ///
    /// # Errors
    /// An invalid owner id.
    pub fn batch_args(
        client_id: &str,
        prefix: &str,
        ops: &[(&str, &str, Option<u64>)],
    ) -> crate::Result<Vec<Vec<u8>>> {
        crate::core::wire::bench_args(client_id, prefix, ops)
    }
}

pub use client::{Client, Stats};
pub use config::{ReplicaAck, Settings, MAX_LEASE};
pub use error::{Error, Result};
pub use guard::Guard;
pub use lock::Lock;
pub use owner::Owner;
