//! A named reentrant lock without fencing tokens: the cheaper lock for
//! resources that do not check tokens.

use std::time::Duration;

use crate::error::Result;
use crate::guard::Guard;
use crate::lock::Lock;

/// A handle on one named, reentrant distributed lock that issues no fencing
/// token.
///
/// Made by [`Client::plain_lock`](crate::client::Client::plain_lock); cheap to
/// clone. It behaves as a [`Lock`] in every way (owner, lease and watchdog,
/// re-entry, waiting woken by pub/sub, hand-off to this client's next
/// waiter, loss signal, cancel safety, settlement of lost replies) except
/// that its holds have no fencing token, which makes it cheaper for Redis:
/// acquiring a free plain lock is one `SET … NX PX` (no script) on every
/// server; releasing it is one call of a small compare-and-delete script
/// on Redis 7.0 and, on
/// a server with conditional commands (Valkey 9: `DELIFEQ`, `SET … IFEQ`),
/// one `DELIFEQ`, and a renewal one `SET … IFEQ … PX` (as for a [`Lock`],
/// whose acquisition alone needs the function). Whenever the
/// native command finds the lock not exactly as this client left it (a
/// waiter of another client flagged itself, or a hold through another
/// client re-entered it), the client falls back to the function, which
/// does what the native command could not (publish the release, count the
/// holds); the choice is invisible to callers ([`Stats`](crate::client::Stats)
/// counts it).
///
/// # Which lock to choose
/// A fencing token protects a resource that checks it: a store that
/// refuses a write tagged with a token older than one it has seen turns a
/// stale holder (paused past its lease, partitioned) into a refused write.
/// Where the protected resource checks tokens, use [`Lock`]. Where it does
/// not (most callers: the token is never passed on), the token protects
/// nothing, and the plain lock gives the same exclusion for less Redis
/// work.
///
/// A plain lock and a [`Lock`] of one name are distinct locks (keys
/// `P:{E}:plain` and `P:{E}:plain:released`).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let lock = client.plain_lock("cache:rebuild")?;
/// if let Some(guard) = lock.try_lock().await? {
///     assert!(lock.is_locked().await?);
///     // ... rebuild the cache ...
///     guard.unlock().await?;
/// }
/// assert!(!lock.is_locked().await?);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct PlainLock {
    lock: Lock,
}

impl PlainLock {
    pub(crate) fn new(lock: Lock) -> Self {
        Self { lock }
    }

    // `name`, `with_lease`, `with_watchdog`, `with_owner`, `owner`,
    // `force_unlock`, `is_locked`, `is_held_by_me`, `hold_count`: the inner
    // `Lock`'s, written once for every kind over one (`lock.rs`).
    crate::lock::over_lock!();

    /// A lease learned from how long the holds of `class` last (as
    /// [`Lock::with_adaptive_lease`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for an
    /// invalid class name.
    pub fn with_adaptive_lease(self, class: &str) -> Result<Self> {
        Ok(Self::new(self.lock.with_adaptive_lease(class)?))
    }

    /// Waits until the lock is acquired (as [`Lock::lock`]).
    ///
    /// # Errors
    /// As [`Lock::lock`].
    ///
    /// # Cancel safety
    /// Cancel safe: a hold granted after the future was dropped is released.
    pub async fn lock(&self) -> Result<PlainGuard> {
        self.lock.lock().await.map(PlainGuard)
    }

    /// One try, never waiting (as [`Lock::try_lock`]).
    ///
    /// # Errors
    /// As [`Lock::try_lock`].
    ///
    /// # Cancel safety
    /// Cancel safe: a hold granted after the future was dropped is released.
    pub async fn try_lock(&self) -> Result<Option<PlainGuard>> {
        Ok(self.lock.try_lock().await?.map(PlainGuard))
    }

    /// Waits at most `wait` (as [`Lock::try_lock_for`]).
    ///
    /// # Errors
    /// As [`Lock::try_lock_for`].
    ///
    /// # Cancel safety
    /// Cancel safe: a hold granted after the future was dropped is released.
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<PlainGuard>> {
        Ok(self.lock.try_lock_for(wait).await?.map(PlainGuard))
    }

    /// Waits at most `wait`, then fails (as [`Lock::lock_within`]).
    ///
    /// # Errors
    /// As [`Lock::lock_within`].
    ///
    /// # Cancel safety
    /// Cancel safe: a hold granted after the future was dropped is released.
    pub async fn lock_within(&self, wait: Duration) -> Result<PlainGuard> {
        self.lock.lock_within(wait).await.map(PlainGuard)
    }

    /// How long the lock stays held unless renewed (as
    /// [`Lock::remaining_ttl`]).
    ///
    /// # Errors
    /// [`Error::Redis`](crate::error::Error::Redis) if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe (a read).
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        self.lock.remaining_ttl().await
    }
}

/// A held [`PlainLock`]: a [`Guard`] without a fencing token.
///
/// `'static` and `Send`; each acquisition (re-entries included) returns its
/// own guard, to be released with [`unlock`](Self::unlock) or dropped (then
/// released in the background, as a [`Guard`]).
#[must_use = "if unused the lock is released at once, in the background"]
#[derive(Debug)]
pub struct PlainGuard(Guard);

impl PlainGuard {
    // `name`, `owner`, `is_lost`, `lost`, `valid_until`, `unlock`: the
    // inner `Guard`'s, written once for every guard over one (`guard.rs`).
    crate::guard::over_guard!();
}
