//! A named distributed semaphore with owned, leased permits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::validate_lease;
use crate::config::MAX_COUNT;
use crate::core::holds::{Claim, HoldState, Lease};
use crate::core::keys::LockKeys;
use crate::core::wire::semaphore::Resize;
use crate::core::{deadline_after, semaphore as floor, Core};
use crate::error::{Error, Result};
use hasp_owner::Owner;

/// The largest capacity a semaphore takes (2^48): the script counts permits
/// in Lua numbers, exact far beyond it.
pub const MAX_PERMITS: u64 = MAX_COUNT;

/// A handle on one named distributed semaphore: a capacity of permits that
/// owners take and give back.
///
/// Made by [`Client::semaphore`](crate::client::Client::semaphore); cheap to clone.
/// Unlike Redisson's `RSemaphore`, permits belong to someone:
///
/// * **Owned.** Permits are taken for an owner (the current task by default,
///   or [`with_owner`](Self::with_owner)) and only that owner can give them
///   back: releasing more than it holds is [`Error::NotHeld`] and changes
///   nothing, so no release can create permits from nothing.
/// * **Leased.** Every grant has a lease: the client's watchdog renews it
///   (default) or it is fixed ([`with_lease`](Self::with_lease)). The
///   permits of a client that dies come back within one lease; nothing
///   leaks. All permits of one owner share one lease, measured by the
///   server's clock.
/// * **Fair.** Waiters of every client queue in Redis in order of arrival:
///   a request for many permits is not starved by a stream of small ones.
///   A waiter's place lasts [`Settings::set_waiter_ttl`](crate::config::Settings::set_waiter_ttl)
///   (10 s) and is refreshed while it waits, so a dead waiter's place
///   ends within that time. A release wakes exactly the waiters it lets in.
/// * **Capacity.** [`try_set_capacity`](Self::try_set_capacity) sets it
///   once; [`set_capacity`](Self::set_capacity) and
///   [`add_capacity`](Self::add_capacity) change it at any time. Nothing is
///   revoked when it shrinks below what is held: [`available`](Self::available)
///   turns negative until enough permits come back. A semaphore whose
///   capacity was never set has none (acquisitions wait for one).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let pool = client.semaphore("db-connections")?;
/// pool.try_set_capacity(10).await?;
///
/// let permit = pool.acquire(3).await?;  // waits for 3 permits
/// assert_eq!(pool.available().await?, 7);
/// // ... use three connections ...
/// permit.release().await?;
/// assert_eq!(pool.available().await?, 10);
/// # Ok(())
/// # }
/// ```
///
/// Permits taken by one process and given back by another, with an explicit
/// owner and a fixed lease:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// use std::time::Duration;
///
/// let slots = client.semaphore("upload-slots")?;
/// slots.try_set_capacity(2).await?;
/// let job = hasp::Owner::from_id("job-42")?;
/// let mine = slots
///     .clone()
///     .with_owner(job.clone())
///     .with_lease(Duration::from_secs(60))?;
/// mine.acquire(1).await?.forget(); // kept in Redis; no local guard
///
/// // Elsewhere, knowing only the id:
/// let theirs = slots.with_owner(hasp::Owner::from_id("job-42")?);
/// assert!(theirs.lease_left().await?.is_some());
/// theirs.release(1).await?;
/// assert!(theirs.release(1).await.is_err()); // nothing left to give back
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    core: Arc<Core>,
    keys: Arc<LockKeys>,
    lease: Lease,
    owner: Option<Owner>,
}

impl Semaphore {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        let keys = floor::keys(&core, name)?;
        Ok(Self {
            core,
            keys,
            lease: Lease::Watchdog,
            owner: None,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    // `with_lease`, `with_watchdog`, `with_owner`, `owner`: written once
    // for every kind that takes holds of its own (`terms.rs`).
    crate::terms::hold_terms!();

    /// Sets the capacity to `permits` if none is set; false if one was.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] above [`MAX_PERMITS`]; [`Error::Redis`]
    /// if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn try_set_capacity(&self, permits: u64) -> Result<bool> {
        let capacity = check_capacity(permits)?;
        let resize = Resize::Try {
            capacity,
            expiry_ms: 0,
        };
        floor::resize(&self.core, &self.keys, resize).await
    }

    /// As [`try_set_capacity`](Self::try_set_capacity), and the whole
    /// semaphore (capacity and counts; not the leases) expires after
    /// `expiry`: for a semaphore that must not outlive a sale, say.
    ///
    /// # Errors
    /// As `try_set_capacity`, and [`Error::InvalidArgument`] for a zero or
    /// over-large `expiry`.
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn try_set_capacity_for(&self, permits: u64, expiry: Duration) -> Result<bool> {
        let capacity = check_capacity(permits)?;
        let expiry_ms = validate_lease(self.core.settings(), expiry)
            .map_err(|_| Error::invalid("expiry", format!("{expiry:?} is not a valid expiry")))?;
        let resize = Resize::Try {
            capacity,
            expiry_ms,
        };
        floor::resize(&self.core, &self.keys, resize).await
    }

    /// Sets the capacity, whatever it was. Permits held beyond it stay held
    /// (see the type's docs); a larger capacity wakes waiters it lets in.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] above [`MAX_PERMITS`]; [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn set_capacity(&self, permits: u64) -> Result<()> {
        let capacity = check_capacity(permits)?;
        floor::resize(&self.core, &self.keys, Resize::Set(capacity))
            .await
            .map(drop)
    }

    /// Adds `delta` permits to the capacity (a negative `delta` lowers it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the capacity would go below zero or
    /// above [`MAX_PERMITS`] (nothing changes); [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn add_capacity(&self, delta: i64) -> Result<()> {
        if delta.unsigned_abs() > MAX_PERMITS {
            return Err(Error::invalid(
                "delta",
                format!("{delta} exceeds ±{MAX_PERMITS}"),
            ));
        }
        floor::resize(&self.core, &self.keys, Resize::Add(delta))
            .await
            .map(drop)
    }

    /// The capacity, if one is set.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn capacity(&self) -> Result<Option<u64>> {
        self.core
            .query(redis::cmd("HGET").arg(&*self.keys.lock).arg(":cap"))
            .await
    }

    /// The capacity minus the permits held by live grants, as of the
    /// server's clock now (grants whose lease ended do not count). Negative
    /// while more is held than a lowered capacity.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn available(&self) -> Result<i64> {
        floor::available(&self.core, &self.keys).await
    }

    /// Takes `permits`, waiting as long as it takes (in order of arrival
    /// across clients). `acquire(0)` returns an empty permit at once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] above [`MAX_PERMITS`]; [`Error::Redis`] if
    /// Redis cannot be reached (then nothing is held: a grant whose reply
    /// was lost is undone).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves nothing held and gives up its
    /// place in the queue.
    pub async fn acquire(&self, permits: u32) -> Result<Permit> {
        self.take(permits, None, true).await?.ok_or_else(|| {
            Error::Protocol("an unbounded wait ended without the permits".to_owned())
        })
    }

    /// Tries once, never queuing: `Ok(None)` if the permits are not free
    /// after those the queued waiters want.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_acquire(&self, permits: u32) -> Result<Option<Permit>> {
        self.take(permits, Some(Instant::now()), false).await
    }

    /// Waits at most `wait` for `permits`: `Ok(None)` if the wait ran out.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), and [`Error::InvalidArgument`] for a
    /// `wait` too large to represent.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_acquire_for(&self, permits: u32, wait: Duration) -> Result<Option<Permit>> {
        let deadline = deadline_after(wait)?;
        self.take(permits, Some(deadline), !wait.is_zero()).await
    }

    /// As [`try_acquire_for`](Self::try_acquire_for), but running out of
    /// time is an [`Error::TimedOut`].
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `try_acquire_for`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn acquire_within(&self, permits: u32, wait: Duration) -> Result<Permit> {
        let found = self.try_acquire_for(permits, wait).await?;
        Error::unless_timed_out(found, self.name(), wait)
    }

    fn claim<'a>(&'a self, owner: &'a Owner) -> Claim<'a> {
        Claim {
            keys: &self.keys,
            owner,
            lease: self.lease,
        }
    }

    async fn take(
        &self,
        permits: u32,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Permit>> {
        if u64::from(permits) > MAX_PERMITS {
            return Err(Error::invalid(
                "permits",
                format!("{permits} exceeds {MAX_PERMITS}"),
            ));
        }
        let owner = self.owner();
        if permits == 0 {
            return Ok(Some(Permit::empty(
                self.core.clone(),
                self.keys.clone(),
                owner,
            )));
        }
        let claim = self.claim(&owner);
        let hold = floor::acquire(&self.core, claim, permits, deadline, wait).await?;
        Ok(hold.map(|hold| Permit::new(self.core.clone(), hold, permits)))
    }

    /// Takes every permit free now (after those the queued waiters want):
    /// `Ok(None)` if there is none.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: permits granted to a call whose future was dropped are
    /// given back.
    pub async fn drain(&self) -> Result<Option<Permit>> {
        let owner = self.owner();
        let drained = floor::drain(&self.core, self.claim(&owner)).await?;
        Ok(drained.map(|(hold, permits)| Permit::new(self.core.clone(), hold, permits)))
    }

    /// Gives back `permits` that this handle's owner holds, whichever task
    /// or process took them (with [`Permit::forget`] there, say).
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the owner holds fewer (nothing changes: no
    /// permit is ever created by a release); [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn release(&self, permits: u32) -> Result<()> {
        if permits == 0 {
            return Ok(());
        }
        floor::give_back(&self.core, &self.keys, &self.owner(), permits).await
    }

    /// Re-arms the lease of this handle's owner's permits to `lease`:
    /// false if it holds none (a lease that ended cannot be revived).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero or over-large lease;
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn update_lease(&self, lease: Duration) -> Result<bool> {
        let ms = validate_lease(self.core.settings(), lease)?;
        floor::extend(&self.core, &self.keys, &self.owner(), ms).await
    }

    /// What is left of the lease of this handle's owner's permits, by the
    /// server's clock: `None` if it holds none.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn lease_left(&self) -> Result<Option<Duration>> {
        let ms = floor::lease_left(&self.core, &self.keys, &self.owner()).await?;
        Ok(u64::try_from(ms).ok().map(Duration::from_millis))
    }
}

fn check_capacity(permits: u64) -> Result<u64> {
    if permits > MAX_PERMITS {
        return Err(Error::invalid(
            "permits",
            format!("{permits} exceeds {MAX_PERMITS}"),
        ));
    }
    Ok(permits)
}

/// Permits held, returned by [`Semaphore::acquire`] and friends.
///
/// `'static` and `Send`: move it into another task and release it there.
/// Dropping it gives the permits back in the background (as a dropped
/// [`Guard`](crate::guard::Guard) does); [`release`](Self::release) reports
/// errors, such as permits whose lease ended meanwhile.
#[must_use = "if unused the permits are given back at once, in the background"]
#[derive(Debug)]
pub struct Permit {
    core: Arc<Core>,
    /// `None` for an empty permit (`acquire(0)`).
    state: Option<Arc<HoldState>>,
    keys: Arc<LockKeys>,
    owner: Owner,
    permits: u32,
    released: bool,
}

impl Permit {
    fn new(core: Arc<Core>, state: Arc<HoldState>, permits: u32) -> Self {
        Self {
            core,
            keys: state.keys.clone(),
            owner: state.owner.clone(),
            state: Some(state),
            permits,
            released: false,
        }
    }

    fn empty(core: Arc<Core>, keys: Arc<LockKeys>, owner: Owner) -> Self {
        Self {
            core,
            state: None,
            keys,
            owner,
            permits: 0,
            released: false,
        }
    }

    /// How many permits this holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// The owner the permits are held for.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// True once the permits are known to be lost: their lease ended
    /// (renewal failed, or a fixed lease ran out) or Redis no longer counts
    /// them. See [`Guard::is_lost`](crate::guard::Guard::is_lost).
    pub fn is_lost(&self) -> bool {
        self.state.as_ref().is_some_and(|s| s.is_lost())
    }

    /// Resolves when the permits are lost (never for an empty permit).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        match &self.state {
            Some(state) => state.lost().await,
            None => std::future::pending().await,
        }
    }

    /// When (monotonic) the permits count as lost unless a renewal is
    /// confirmed first; `None` for an empty permit.
    pub fn valid_until(&self) -> Option<Instant> {
        self.state.as_ref().map(|s| s.valid_until())
    }

    /// Gives the permits back.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if they were lost (their lease ended); nothing
    /// anyone else holds is touched. [`Error::Redis`] if Redis cannot be
    /// reached; the release is then completed as soon as it answers again.
    ///
    /// # Cancel safety
    /// Cancel safe: once called, the release completes even if the future
    /// is dropped.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        match &self.state {
            Some(state) => floor::release(&self.core, state, self.permits).await,
            None => Ok(()),
        }
    }

    /// Keeps the permits held in Redis without this guard: no renewal, no
    /// release on drop. They come back when their lease ends, or when their
    /// owner gives them back with [`Semaphore::release`] (from any task or
    /// process). Forgetting a watchdog-mode permit leaves it one watchdog
    /// timeout at most.
    pub fn forget(mut self) {
        self.released = true;
        if let Some(state) = &self.state {
            floor::forget(&self.core, state, self.permits);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.released {
            if let Some(state) = &self.state {
                floor::release_detached(&self.core, state, self.permits);
            }
        }
    }
}
