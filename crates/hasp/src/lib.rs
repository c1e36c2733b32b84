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
//! * [`Client`] — one per Redis deployment (a server, a Sentinel service
//!   with [`Client::open_sentinel`], a Redis Cluster with
//!   [`Client::open_cluster`]); clone it freely. Sentinel and Cluster
//!   support are the crate's `sentinel` and `cluster` features, on by
//!   default; `default-features = false` leaves them (and redis-rs's
//!   Cluster code) out of the build. [`Tls`] says how its `rediss://`
//!   connections trust servers and present themselves.
//! * [`Connection`] — a connection for an application's own commands,
//!   reached as the client reaches its server (the same TLS and server
//!   name); [`sentinel::MasterConnection`] is one that follows a Sentinel
//!   service's master across failovers as the client does, and
//!   [`sentinel::Sentinels`] asks the sentinels for the master the same
//!   way.
//! * [`Lock`] — a named lock handle: [`Lock::lock`] waits,
//!   [`Lock::try_lock`] never waits, [`Lock::try_lock_for`] waits a bounded
//!   time; [`Lock::with_lease`] / [`Lock::with_owner`] configure it, and
//!   [`Lock::with_adaptive_lease`] makes it learn its lease from how long
//!   its class's holds last ([`AdaptiveLease`], [`Client::learned_lease`]).
//! * [`Guard`] — a held lock: [`Guard::unlock`], [`Guard::fencing_token`],
//!   [`Guard::lost`].
//! * [`PlainLock`] — the same lock without fencing tokens, for resources
//!   that do not check them: cheaper for Redis (a free lock is taken with
//!   one `SET … NX PX`; on Valkey 9 released with one `DELIFEQ`).
//! * The family, each a thin type over the same machinery: [`FairLock`]
//!   (waiters of every client served in order of arrival), [`RwLock`]
//!   (many readers or one writer, writers not starved, per-hold leases,
//!   downgrade), [`Semaphore`] (owned, leased permits; [`Permit`]) and
//!   [`CountDownLatch`]. Each type's docs give its key layout.
//! * [`MultiLock`] — every one of several locks (on several servers) or
//!   none; [`RedLock`] — a majority of N independent servers. Both give a
//!   [`FenceVector`] instead of a single token.
//! * [`Error`] — separates outcomes ([`Error::NotHeld`],
//!   [`Error::UpgradeNotSupported`], [`Error::NotSet`]) from failures
//!   ([`Error::Redis`]).
//!
//! ## Safety under faults
//!
//! One Redis server (with or without replicas) cannot make a lock perfectly
//! safe: if it loses a held lock's key, or a holder's process stops for
//! longer than its lease, two owners can believe they hold the lock at
//! once. What hasp does is keep each such window short, tell the holder,
//! and keep fencing tokens usable, so that the resource can refuse a stale
//! holder. `tests/faults` injects each fault for real and measures it
//! (the README's "Safety" table has the figures):
//!
//! * **A holder knows when its belief ends**: at the send time of the last
//!   acquire or renewal Redis confirmed, plus the lease, less a clock drift
//!   allowance of 1% of the lease + 2 ms, on the monotonic clock
//!   ([`Guard::valid_until`]). [`Guard::lost`] fires then (not a timer tick
//!   later) even while Redis is unreachable, and that instant comes before
//!   Redis can expire the key, so a partitioned holder stops believing
//!   before anyone else can take the lock (while the two machines' clocks
//!   differ in rate by less than the allowance).
//! * **A loss Redis can tell is told at once**: a renewal that finds the
//!   lock gone or held by another owner marks it lost and re-creates
//!   nothing; after any reconnect every hold is checked in one batch. The
//!   release of a lost hold is [`Error::NotHeld`] and touches nobody else's
//!   hold.
//! * **Errors mean "not held"**: an acquire whose reply was lost is undone
//!   before anything else the client sends; a release whose reply was lost
//!   is completed. No hold is left that nobody tracks.
//! * **Tokens never go back** for a name: a fresh token is the counter's
//!   next value; the counter is seeded from the server's `TIME` in µs when
//!   it is missing and lives 100 ms from then (so an idle name keeps no
//!   key). So a token never exceeds its issue time in µs, and after the
//!   counter expired, a restart without persistence, or a failover (taking
//!   ≥ 100 ms) to a replica that missed the last increments, new tokens are
//!   still greater — as long as the server's clock is not stepped back. A
//!   hold keeps its token in the lock's value.
//! * **Replication is asynchronous**: a master that dies right after an
//!   acquisition its replicas did not get leaves the promoted replica
//!   without the lock. [`Settings::set_replica_ack`] makes acquisitions
//!   and renewals wait for replicas (`WAIT`), at the cost of a replica
//!   round trip; `WAIT` still does not make Redis consistent (the replica
//!   promoted need not be one that acknowledged).
//! * **What no Redis lock can do**: protect a resource from a holder whose
//!   process froze past its lease and resumes without checking
//!   [`Guard::is_lost`]; only the resource can, by refusing writes whose
//!   fencing token is lower than one it has seen. Restart Redis with
//!   `appendfsync always` (or keep it down for longer than the longest
//!   lease) if a restart must not hand a held lock to someone else.
//!
//! ## Key layout
//!
//! For a lock named `N` under prefix `P` (default `hasp`), with `E` = `N`
//! where `%`, `{`, `}` are percent-encoded:
//!
//! | key / channel              | type    | content                                   |
//! |----------------------------|---------|-------------------------------------------|
//! | `P:{E}`                    | string  | `<count> <nonce> <flag> <owner id> <token>` with the lease as expiry: hold count; nonce of the last operation that changed it; the id of the client waiting, `*` if several, `-` if none; the holder; the hold's fencing token |
//! | `P:{E}:fence`              | string  | last fencing token issued (lives 100 ms from its seeding; see "Tokens never go back") |
//! | `P:{E}:released`           | channel | release notifications                     |
//!
//! `{E}` is the hash tag of all three, so one lock lives in one Redis
//! Cluster slot whatever characters its name holds, and distinct names never
//! share keys. Every change goes through one Redis function (`FCALL`; Redis
//! 7.0 or later), loaded by the client when a server does not have it.
//!
//! The family's objects of name `N` live beside the lock, under the same
//! hash tag: a [`PlainLock`] under `P:{E}:plain` (a lock's value, no
//! counter), a [`FairLock`] under `P:{E}:fair…`, an [`RwLock`] under
//! `P:{E}:rw…`, a [`Semaphore`] under `P:{E}:sem…`, a [`CountDownLatch`]
//! under `P:{E}:latch…` (a hash of counts or holds, zsets of leases and of
//! a line of waiters where it has them, and a release channel; the README's
//! family section lists every key). They are distinct objects: a lock and a
//! semaphore of one name never share a key. The adaptive locks of class `C`
//! share the hash `P:{C}:lease` (`srtt`, `rttvar`, `samples`, `updated_at`).

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acl;
mod client;
mod config;
mod core;
mod error;
mod fair_lock;
mod guard;
mod latch;
mod lock;
mod multi;
mod plain_lock;
mod rw_lock;
mod semaphore;
mod shared_attempt;
mod terms;
mod tls;
mod transport;

/// Not part of the API: what the lock benchmark (`benches/lock.rs`) needs to
/// drive Redis with hasp's own script, without a copy of its wire format.
#[doc(hidden)]
pub mod __bench {
    /// The function library holding the batch function (`FUNCTION LOAD`).
    pub fn batch_library() -> &'static str {
        crate::core::scripts::BATCH.source()
    }

    /// Every argument of one `FCALL` of the batch function under `prefix`: for
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

/// Following the master of a Sentinel service, for an application's own
/// connections beside hasp's.
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub mod sentinel {
    pub use crate::core::following::{MasterConnection, OnSwitch};
    pub use crate::core::sentinels::{follow_master_switches, Sentinels};
}

pub use acl::acl_rules;
pub use client::{Client, Stats};
pub use config::{AdaptiveLease, ReplicaAck, Settings, MAX_LEASE};
pub use core::lease::LearnedLease;
pub use error::{Error, Result};
pub use fair_lock::FairLock;
pub use guard::Guard;
pub use hasp_owner::{InvalidOwner, Owner};
pub use latch::CountDownLatch;
pub use lock::Lock;
pub use multi::fence::{Fence, FenceVector};
pub use multi::multi_lock::{MultiGuard, MultiLock};
pub use multi::red_lock::{RedGuard, RedLock};
pub use plain_lock::{PlainGuard, PlainLock};
pub use rw_lock::{ReadGuard, RwLock, WriteGuard};
pub use semaphore::{Permit, Semaphore, MAX_PERMITS};
pub use tls::Tls;
pub use transport::Connection;
