//! A named reentrant lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Settings;
use crate::core::holds::{Claim, Lease};
use crate::core::keys::LockKeys;
use crate::core::{deadline_after, fair_lock, lock as floor, Attempt, Core, Watch};
use crate::error::{Error, Result};
use crate::guard::Guard;
use hasp_owner::Owner;

/// The methods of a handle that is a [`Lock`] under keys of its own kind
/// (a field `lock: Lock` and `fn new(lock: Lock) -> Self`), written once:
/// naming, configuring, forcing and querying work as the lock's do.
macro_rules! over_lock {
    () => {
        /// The lock's name.
        pub fn name(&self) -> &str {
            self.lock.name()
        }

        /// This handle with a fixed lease, never renewed (see
        /// [`Lock::with_lease`](crate::lock::Lock::with_lease)).
        ///
        /// # Errors
        /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) if
        /// `lease` is zero or above the client's `max_lease`.
        pub fn with_lease(self, lease: std::time::Duration) -> crate::error::Result<Self> {
            Ok(Self::new(self.lock.with_lease(lease)?))
        }

        /// This handle in watchdog mode (the default): leases renewed while
        /// held.
        pub fn with_watchdog(self) -> Self {
            Self::new(self.lock.with_watchdog())
        }

        /// This handle acting for `owner` instead of the current task.
        pub fn with_owner(self, owner: hasp_owner::Owner) -> Self {
            Self::new(self.lock.with_owner(owner))
        }

        /// The owner this handle acts for, resolved now.
        pub fn owner(&self) -> hasp_owner::Owner {
            self.lock.owner()
        }

        /// Frees the lock whoever holds it (see
        /// [`Lock::force_unlock`](crate::lock::Lock::force_unlock)).
        ///
        /// # Errors
        /// As [`Lock::force_unlock`](crate::lock::Lock::force_unlock).
        ///
        /// # Cancel safety
        /// Cancel safe: the change is sent when the future is first polled
        /// and made even if the future is dropped afterwards; only its
        /// answer is lost.
        pub async fn force_unlock(&self) -> crate::error::Result<bool> {
            self.lock.force_unlock().await
        }

        /// Whether any owner holds the lock now.
        ///
        /// # Errors
        /// As [`Lock::is_locked`](crate::lock::Lock::is_locked).
        ///
        /// # Cancel safety
        /// Cancel safe: it only reads.
        pub async fn is_locked(&self) -> crate::error::Result<bool> {
            self.lock.is_locked().await
        }

        /// Whether this handle's owner holds the lock, as Redis sees it now.
        ///
        /// # Errors
        /// As [`Lock::is_held_by_me`](crate::lock::Lock::is_held_by_me).
        ///
        /// # Cancel safety
        /// Cancel safe: it only reads.
        pub async fn is_held_by_me(&self) -> crate::error::Result<bool> {
            self.lock.is_held_by_me().await
        }

        /// How many times this handle's owner holds the lock through this
        /// client (answered locally).
        pub fn hold_count(&self) -> u32 {
            self.lock.hold_count()
        }
    };
}
pub(crate) use over_lock;

/// A handle on one named, reentrant distributed lock.
///
/// Made by [`Client::lock`](crate::client::Client::lock); cheap to clone. The handle itself holds
/// nothing: acquiring returns a [`Guard`], and the lock is held until the
/// guard is released.
///
/// * **Owner.** By default the owner is the current task (see [`Owner`]);
///   [`with_owner`](Self::with_owner) picks an explicit one.
/// * **Lease.** By default the lock has the client's watchdog timeout
///   (30 s) as lease and the client's watchdog renews it every third of
///   that for as long as it is held, so it never expires under a live
///   holder and frees itself within one timeout when the holder's process
///   dies. [`with_lease`](Self::with_lease) sets a fixed lease instead, never
///   renewed: the lock expires after it even if still in use.
/// * **Reentrancy.** The owner that holds the lock acquires it again at
///   once; it is free for others after as many releases as acquisitions.
///   A re-entry keeps the lease mode of the first acquisition; with a fixed
///   lease it re-arms that lease.
/// * **Waiting.** [`lock`](Self::lock) and [`try_lock_for`](Self::try_lock_for)
///   subscribe to the lock's release channel (one subscription per name per
///   client) and retry when woken, or when the holder's lease runs out; they
///   never poll. Tasks of one client are served in the order they started
///   waiting: a task that releases the lock hands it to the first of them
///   in the same call to Redis, one round trip sooner than a wake-up would,
///   unless a task of another client waits too; then the lock is freed for
///   that client, and this client's waiter tries again only 10 ms later.
/// * **Fencing.** Each acquisition of a free lock gets a token greater than
///   every token issued before for the name ([`Guard::fencing_token`]); pass
///   it to the resource you protect so that it can reject a stale holder.
///
/// # When not to use it
/// To exclude tasks of one process only, `tokio::sync::Mutex` is cheaper by
/// orders of magnitude. A single Redis server is a single point of truth:
/// if it loses data (restart without persistence, failover to a lagging
/// replica) two holders can overlap; use fencing tokens where that matters.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// use std::time::Duration;
///
/// let lock = client.lock("order:1001")?;
/// // Wait at most 100 ms; hold for at most 10 s, no renewal.
/// let lock = lock.with_lease(Duration::from_secs(10))?;
/// match lock.try_lock_for(Duration::from_millis(100)).await? {
///     Some(guard) => {
///         let token = guard.fencing_token();
///         // ... write, tagged with `token` ...
///         # assert!(token >= 1);
///         guard.unlock().await?;
///     }
///     None => println!("busy, try later"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// Handing a lock to another task with an explicit owner:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let job = client.lock("job:7")?.with_owner(hasp::Owner::new());
/// let guard = job.lock().await?;
/// let worker = {
///     let job = job.clone();
///     tokio::spawn(async move {
///         // Same owner: a re-entry, not a wait.
///         let inner = job.lock().await?;
///         assert_eq!(job.hold_count(), 2);
///         inner.unlock().await
///     })
/// };
/// worker.await.expect("worker panicked")?;
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Lock {
    core: Arc<Core>,
    keys: Arc<LockKeys>,
    lease: Lease,
    owner: Option<Owner>,
}

impl Lock {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        let keys = floor::keys(&core, name)?;
        Ok(Self::with_keys(core, keys))
    }

    /// The lock under a fair lock's keys (see [`FairLock`](crate::fair_lock::FairLock)).
    pub(crate) fn new_fair(core: Arc<Core>, name: &str) -> Result<Self> {
        let keys = fair_lock::keys(&core, name)?;
        Ok(Self::with_keys(core, keys))
    }

    /// The lock under a plain lock's keys (see [`PlainLock`](crate::plain_lock::PlainLock)).
    pub(crate) fn new_plain(core: Arc<Core>, name: &str) -> Result<Self> {
        let keys = floor::plain_keys(&core, name)?;
        Ok(Self::with_keys(core, keys))
    }

    fn with_keys(core: Arc<Core>, keys: Arc<LockKeys>) -> Self {
        Self {
            core,
            keys,
            lease: Lease::Watchdog,
            owner: None,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    // `with_lease`, `with_watchdog`, `with_owner`, `owner`: written once
    // for every kind that takes holds of its own (`terms.rs`).
    crate::terms::hold_terms!();

    /// This handle with a lease learned from how long the holds of `class`
    /// last (see [`AdaptiveLease`](crate::config::AdaptiveLease) for the
    /// rule and its settings): short sections get short leases, so a lock
    /// whose holder died frees sooner, and a hold is renewed only when its
    /// remaining lease runs low, by the client's single scheduler, so a
    /// section that outlasts its lease keeps the lock. Locks of one class
    /// (per-user locks such as `order:user:{id}` share a class `order`)
    /// learn together, in memory and, at most once a second, through a
    /// history in Redis shared by every client (`P:{class}:lease`; see
    /// [`Client::learned_lease`](crate::client::Client::learned_lease)). Before
    /// anything is learned the lease is the initial one (the watchdog
    /// timeout by default). A later [`with_lease`](Self::with_lease) wins.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or over-long class name.
    pub fn with_adaptive_lease(mut self, class: &str) -> Result<Self> {
        self.lease = Lease::Adaptive(self.core.register_class(class)?);
        Ok(self)
    }

    /// Acquires the lock, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached (the wait ends with the
    /// error; it is never reported as acquired). An error means the lock is
    /// not held: if the call reached Redis and only its reply was lost, the
    /// client undoes what it did as soon as Redis answers again, before any
    /// later operation of this client on the lock.
    ///
    /// # Cancel safety
    /// Cancel safe. Dropping the future leaves no lock held (an acquisition
    /// racing the drop is released in the background), no renewal and no
    /// subscription; the task loses its place in the queue of waiters.
    pub async fn lock(&self) -> Result<Guard> {
        self.acquire(None, true)
            .await?
            .ok_or_else(|| Error::Protocol("an unbounded wait ended without the lock".to_owned()))
    }

    /// Tries once, never waiting for a holder: `Ok(None)` if another owner
    /// holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached (then the lock is not
    /// held, as for [`lock`](Self::lock)).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.acquire(Some(Instant::now()), false).await
    }

    /// Tries for at most `wait`: `Ok(None)` if the lock was still held by
    /// another owner when the wait ran out. A zero `wait` is
    /// [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `wait` is too large to represent as a
    /// deadline; [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<Guard>> {
        let deadline = deadline_after(wait)?;
        self.acquire(Some(deadline), !wait.is_zero()).await
    }

    /// As [`try_lock_for`](Self::try_lock_for), but running out of time is
    /// an [`Error::TimedOut`].
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `try_lock_for`.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_within(&self, wait: Duration) -> Result<Guard> {
        let found = self.try_lock_for(wait).await?;
        Error::unless_timed_out(found, self.name(), wait)
    }

    /// One try for `owner`, never queuing: a re-entry, or one call to Redis
    /// that reports how long the holder's lease has left if busy. For the
    /// kinds made of several locks.
    pub(crate) async fn try_once(
        &self,
        owner: &Owner,
        flag_waiting: bool,
    ) -> Result<Attempt<Guard>> {
        let attempt = floor::try_once(&self.core, self.claim(owner), flag_waiting).await?;
        Ok(match attempt {
            Attempt::Done(hold) => Attempt::Done(Guard::new(self.core.clone(), hold)),
            Attempt::Busy(ttl) => Attempt::Busy(ttl),
        })
    }

    /// A subscription to this lock's releases that takes no place in its
    /// queue of waiters.
    pub(crate) fn watch(&self) -> Watch {
        self.core.watch(&self.keys)
    }

    /// The server this lock lives on, as its client names it.
    pub(crate) fn server(&self) -> &Arc<str> {
        self.core.server()
    }

    /// The settings of this lock's client.
    pub(crate) fn settings(&self) -> &Settings {
        self.core.settings()
    }

    /// True if both handles name the same lock through the same client.
    pub(crate) fn same_lock(&self, other: &Lock) -> bool {
        Arc::ptr_eq(&self.core, &other.core) && self.keys.lock == other.keys.lock
    }

    fn claim<'a>(&'a self, owner: &'a Owner) -> Claim<'a> {
        Claim {
            keys: &self.keys,
            owner,
            lease: self.lease,
        }
    }

    async fn acquire(&self, deadline: Option<Instant>, wait: bool) -> Result<Option<Guard>> {
        let owner = self.owner();
        let claim = self.claim(&owner);
        // A lock under a fair lock's keys waits in its line.
        let hold = match self.keys.has_line() {
            true => fair_lock::acquire(&self.core, claim, deadline, wait).await?,
            false => floor::acquire(&self.core, claim, deadline, wait).await?,
        };
        Ok(hold.map(|hold| Guard::new(self.core.clone(), hold)))
    }

    /// Frees the lock whoever holds it and wakes its waiters. Returns whether
    /// a lock was there. Holders find out through renewal (their guards
    /// report the loss) and get [`Error::NotHeld`] on release.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe; once called, the call takes effect whether awaited or not.
    pub async fn force_unlock(&self) -> Result<bool> {
        floor::force_release(&self.core, &self.keys).await
    }

    /// Whether any owner holds the lock now.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn is_locked(&self) -> Result<bool> {
        self.core
            .query(redis::cmd("EXISTS").arg(&*self.keys.lock))
            .await
    }

    /// Whether this handle's owner holds the lock, as Redis sees it now.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn is_held_by_me(&self) -> Result<bool> {
        let owner = self.owner();
        let value: Option<Vec<u8>> = self
            .core
            .query(redis::cmd("GET").arg(&*self.keys.lock))
            .await?;
        Ok(value.as_deref().and_then(crate::core::keys::holder_of) == Some(owner.id().as_bytes()))
    }

    /// How many times this handle's owner holds the lock through this client
    /// (0 if not held, or if the hold is known to be lost). Answered locally.
    pub fn hold_count(&self) -> u32 {
        self.core.hold_count(&self.keys, &self.owner())
    }

    /// Time until the lock expires: `None` if no one holds it.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached; [`Error::Protocol`] if
    /// the key exists without an expiry (not set by this library).
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let ttl: i64 = self
            .core
            .query(redis::cmd("PTTL").arg(&*self.keys.lock))
            .await?;
        match ttl {
            -2 => Ok(None),
            ms if ms >= 0 => Ok(Some(Duration::from_millis(ms.unsigned_abs()))),
            _ => Err(Error::Protocol(format!(
                "lock key {:?} has no expiry",
                self.keys.lock
            ))),
        }
    }
}
