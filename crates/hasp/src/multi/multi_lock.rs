//! All of several locks, or none.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::fence::{Fence, FenceVector};
use super::holders::{Held, Holders, Step};
use super::jitter;
use super::parts::{release_all, servers_failed, Outcome, Parts, Watches};
use crate::core::holds::{sleep_past, HoldState};
use crate::core::{deadline_after, remaining};
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::lock::Lock;
use hasp_owner::Owner;

/// The first delay after two acquisitions collided (each took some parts).
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// The longest delay after repeated collisions.
const MAX_BACKOFF: Duration = Duration::from_millis(200);
/// How long a waiter waits without a known TTL before it asks again.
const RECHECK: Duration = Duration::from_secs(1);

/// One lock made of several: held when every part is held by its owner,
/// never partly.
///
/// Against replica lag: the same lock name
/// on several independent Redis servers, each a [`Client`](crate::client::Client),
/// all of which must agree. It also takes several different locks at once
/// (an order touching two accounts).
///
/// * **All or nothing.** An acquire asks every part at once (one round
///   trip of the slowest server; parts of one client share its batch). If
///   any part is held by another owner, every part this call took is
///   released before it waits or returns; if any server fails to answer
///   within the per-server timeout, the call fails with
///   [`Error::ServersFailed`] after releasing the rest. A part whose reply
///   was lost is released by its client as soon as its server answers.
///   Because the parts are asked at once, tries that collide can each take
///   some parts and all fail: [`try_lock`](Self::try_lock) promises that at
///   most one wins, and a wait ([`try_lock_for`](Self::try_lock_for),
///   [`lock`](Self::lock)) that one of them does.
/// * **No deadlock.** A MultiLock never holds some parts while it waits for
///   others, so two MultiLocks naming the same locks in different orders
///   cannot wait for each other; after a collision each waits a random
///   delay (doubling from 5 ms to 200 ms) so that they do not collide
///   again in step.
/// * **Waiting** is woken by the release messages of the parts (or when a
///   holder's lease runs out), never by polling.
/// * **Re-entry** by the owner that holds it costs no Redis call and is
///   counted per handle (and its clones); the parts are released after the
///   last guard. An owner that holds one of the parts alone re-enters that
///   part, and keeps it after the MultiLock is released.
/// * **Leases.** By default every part is renewed by its client's watchdog;
///   [`with_lease`](Self::with_lease) gives every part a fixed lease. The
///   loss of any part is the loss of the whole ([`MultiGuard::lost`]); the
///   other parts stay held (and renewed) until the guard is released, so
///   that nobody takes the whole set while the old holder may still run.
/// * **Fencing**: a [`FenceVector`], one token per part.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let servers = [testkit::RedisServer::start(), testkit::RedisServer::start(), testkit::RedisServer::start()];
/// let mut parts = Vec::new();
/// for server in &servers {
///     let client = hasp::Client::open(&server.url()).await?;
///     parts.push(client.lock("stock:voucher-7")?);
/// }
/// let lock = hasp::MultiLock::new(parts)?;
/// let guard = lock.lock().await?; // held on all three servers
/// assert_eq!(guard.fencing().parts().len(), 3);
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    parts: Arc<Parts>,
    server_timeout: Duration,
    holders: Arc<Holders<MultiHold>>,
}

impl MultiLock {
    /// A MultiLock of `parts`: locks of one or more clients, in any order.
    /// Their lease and owner settings are replaced by the MultiLock's
    /// (watchdog mode, the current task, unless set).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no parts, or the same lock (same
    /// client, same name) twice; no Redis call is made.
    pub fn new(parts: impl IntoIterator<Item = Lock>) -> Result<Self> {
        let parts = Parts::new(parts.into_iter().map(Lock::with_watchdog).collect())?;
        let server_timeout = parts
            .locks()
            .iter()
            .map(|l| l.settings().response_timeout)
            .min()
            .unwrap_or(Duration::from_secs(5));
        Ok(Self {
            parts: Arc::new(parts),
            server_timeout,
            holders: Arc::default(),
        })
    }

    /// This MultiLock with a fixed lease on every part, never renewed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a part's client refuses the lease (zero,
    /// or above its `max_lease`).
    pub fn with_lease(self, lease: Duration) -> Result<Self> {
        self.with_parts(|part| part.with_lease(lease))
    }

    /// This MultiLock in watchdog mode (the default).
    pub fn with_watchdog(self) -> Self {
        self.with_each(Lock::with_watchdog)
    }

    /// This MultiLock acting for `owner` on every part.
    pub fn with_owner(self, owner: Owner) -> Self {
        self.with_each(|part| part.with_owner(owner.clone()))
    }

    /// How long an acquire waits for one server's answer before it fails
    /// with [`Error::ServersFailed`] (default: the smallest
    /// `response_timeout` of the parts' clients).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero.
    pub fn with_server_timeout(mut self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::invalid(
                "server_timeout",
                "must be greater than zero",
            ));
        }
        self.server_timeout = timeout;
        Ok(self)
    }

    fn with_parts(self, f: impl Fn(Lock) -> Result<Lock>) -> Result<Self> {
        Ok(self.with(self.parts.try_map(f)?))
    }

    fn with_each(self, f: impl Fn(Lock) -> Lock) -> Self {
        self.with(self.parts.map(f))
    }

    fn with(&self, parts: Parts) -> Self {
        Self {
            parts: Arc::new(parts),
            server_timeout: self.server_timeout,
            holders: Arc::default(), // other settings, other holds
        }
    }

    /// The parts, in the order given.
    pub fn parts(&self) -> &[Lock] {
        self.parts.locks()
    }

    /// Acquires every part, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::ServersFailed`] if a server fails to answer; nothing is left
    /// held.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no part held, no renewal
    /// and no subscription.
    pub async fn lock(&self) -> Result<MultiGuard> {
        self.acquire(None, true)
            .await?
            .ok_or_else(|| Error::Protocol("an unbounded wait ended without the lock".to_owned()))
    }

    /// Tries once: `Ok(None)` if any part is held by another owner (and
    /// then no part is held by this call).
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<MultiGuard>> {
        self.acquire(Some(Instant::now()), false).await
    }

    /// Tries for at most `wait`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `wait` is too large to represent; as
    /// [`lock`](Self::lock) otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        let deadline = deadline_after(wait)?;
        self.acquire(Some(deadline), !wait.is_zero()).await
    }

    /// As [`try_lock_for`](Self::try_lock_for), but running out of time is
    /// an [`Error::TimedOut`] (naming the parts, `name@server` joined by
    /// `+`).
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `try_lock_for`.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_within(&self, wait: Duration) -> Result<MultiGuard> {
        if let Some(guard) = self.try_lock_for(wait).await? {
            return Ok(guard);
        }
        let parts: Vec<String> = (self.parts.locks().iter())
            .map(|lock| format!("{}@{}", lock.name(), lock.server()))
            .collect();
        Error::unless_timed_out(None, &parts.join("+"), wait)
    }

    async fn acquire(&self, deadline: Option<Instant>, wait: bool) -> Result<Option<MultiGuard>> {
        let owners = self.parts.owners();
        if let Some(hold) = self.holders.reenter(&owners) {
            return Ok(Some(self.guard(owners, hold)));
        }
        let mut watches: Option<Watches> = None;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let (ttl, collided) = match self.try_all(&owners, wait).await? {
                Ok(hold) => {
                    let hold = Arc::new(hold);
                    self.holders.insert(owners.clone(), hold.clone());
                    return Ok(Some(self.guard(owners, hold)));
                }
                Err(busy) => busy,
            };
            let left = remaining(deadline);
            if !wait || left.is_zero() {
                return Ok(None);
            }
            let Some(watches) = watches.as_mut() else {
                // Subscribe, then try again at once: a release before the
                // subscription would be missed.
                let subscribed = self.parts.watch();
                subscribed.ready(left.min(self.server_timeout)).await;
                watches = Some(subscribed);
                continue;
            };
            let slice = ttl.unwrap_or(RECHECK).min(left);
            let _ = tokio::time::timeout(slice, watches.any_freed()).await;
            if collided {
                tokio::time::sleep(jitter(backoff).min(remaining(deadline))).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            if remaining(deadline).is_zero() {
                return Ok(None);
            }
        }
    }

    /// One try of every part at once. `Err((ttl, collided))`: some part
    /// is held by another owner (for `ttl` if known), and `collided` says
    /// this try had taken others (released again before returning).
    async fn try_all(
        &self,
        owners: &[Owner],
        flag_waiting: bool,
    ) -> Result<Result<MultiHold, (Option<Duration>, bool)>> {
        let mut answers = self
            .parts
            .try_each(owners, flag_waiting, self.server_timeout);
        let mut held: Vec<Option<Guard>> = (0..self.parts.len()).map(|_| None).collect();
        let mut ttl: Option<Duration> = None;
        let mut busy = false;
        let mut failed = Vec::new();
        while let Some(tried) = answers.next().await {
            match tried.outcome {
                Outcome::Held(guard) => held[tried.index] = Some(guard),
                Outcome::Busy(t) => {
                    busy = true;
                    ttl = match (ttl, t) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                Outcome::Failed(e) => failed.push((tried.index, e)),
            }
        }
        if !busy && failed.is_empty() {
            let guards: Vec<Guard> = held.into_iter().flatten().collect();
            return Ok(Ok(MultiHold::new(guards)));
        }
        let taken: Vec<Guard> = held.into_iter().flatten().collect();
        let collided = !taken.is_empty();
        release_all(taken).await;
        if !failed.is_empty() {
            return Err(servers_failed(&self.parts, failed));
        }
        Ok(Err((ttl, collided)))
    }

    fn guard(&self, owners: Vec<Owner>, hold: Arc<MultiHold>) -> MultiGuard {
        MultiGuard {
            holders: self.holders.clone(),
            owners,
            hold,
            released: false,
        }
    }

    /// Frees every part whoever holds it (in parallel). Returns whether any
    /// part was held.
    ///
    /// # Errors
    /// The first error of a part, after every part was tried.
    ///
    /// # Cancel safety
    /// Cancel safe; once called, each part's force takes effect.
    pub async fn force_unlock(&self) -> Result<bool> {
        let results =
            futures_util::future::join_all(self.parts.locks().iter().map(Lock::force_unlock)).await;
        let mut any = false;
        for result in results {
            any |= result?;
        }
        Ok(any)
    }

    /// Whether any part is held by anyone now (an acquire would wait).
    ///
    /// # Errors
    /// The first error of a part.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn is_locked(&self) -> Result<bool> {
        let results =
            futures_util::future::join_all(self.parts.locks().iter().map(Lock::is_locked)).await;
        let mut any = false;
        for result in results {
            any |= result?;
        }
        Ok(any)
    }

    /// Guards handed out to the current owner for this MultiLock (and its
    /// clones) not yet released; 0 if not held or lost. Answered locally.
    pub fn hold_count(&self) -> u32 {
        self.holders.count(&self.parts.owners())
    }

    /// The smallest time left before a held part expires; `None` if no part
    /// is held by anyone.
    ///
    /// # Errors
    /// The first error of a part.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let results =
            futures_util::future::join_all(self.parts.locks().iter().map(Lock::remaining_ttl))
                .await;
        let mut least: Option<Duration> = None;
        for result in results {
            if let Some(ttl) = result? {
                least = Some(least.map_or(ttl, |l| l.min(ttl)));
            }
        }
        Ok(least)
    }
}

/// What every guard of one MultiLock hold shares.
#[derive(Debug)]
struct MultiHold {
    /// The parts' guards, until the last MultiGuard is released.
    guards: Mutex<Vec<Guard>>,
    /// Their loss signals and belief ends (each less its drift allowance),
    /// readable without the mutex.
    signals: Vec<Arc<HoldState>>,
    fences: FenceVector,
}

impl MultiHold {
    fn new(guards: Vec<Guard>) -> Self {
        let fences = FenceVector::new(
            guards
                .iter()
                .map(|g| Fence {
                    server: g.server().to_string(),
                    name: g.name().to_owned(),
                    token: g.fencing_token(),
                })
                .collect(),
        );
        Self {
            signals: guards.iter().map(|g| g.hold().clone()).collect(),
            guards: Mutex::new(guards),
            fences,
        }
    }

    fn valid_until(&self) -> Instant {
        self.signals
            .iter()
            .map(|s| s.valid_until())
            .min()
            .unwrap_or_else(Instant::now)
    }

    fn take_guards(&self) -> Vec<Guard> {
        std::mem::take(&mut *self.guards.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Held for MultiHold {
    fn is_lost(&self) -> bool {
        self.signals.iter().any(|s| s.is_lost()) || Instant::now() >= self.valid_until()
    }
}

/// A held [`MultiLock`]: every part held by its owner.
///
/// Each acquisition, re-entries included, returns its own guard, and each
/// must be released. Dropping a guard without [`unlock`](Self::unlock)
/// gives it back in the background, as for a [`Guard`].
#[must_use = "if unused the MultiLock is released at once, in the background"]
#[derive(Debug)]
pub struct MultiGuard {
    holders: Arc<Holders<MultiHold>>,
    owners: Vec<Owner>,
    hold: Arc<MultiHold>,
    released: bool,
}

impl MultiGuard {
    /// The parts' fencing tokens, in the order of the parts. A re-entry
    /// returns the same vector.
    pub fn fencing(&self) -> &FenceVector {
        &self.hold.fences
    }

    /// When the hold counts as lost unless renewed: the earliest belief end
    /// of the parts (the send time of the last confirmed acquire or renewal
    /// plus the lease) less the drift allowance (1% of the lease + 2 ms),
    /// on the monotonic clock.
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// True once any part is known to be lost (gone, taken by another
    /// owner, or past [`valid_until`](Self::valid_until)).
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when the MultiLock is lost (see [`is_lost`](Self::is_lost)).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        loop {
            if self.hold.is_lost() {
                return;
            }
            let until = self.hold.valid_until();
            let parts = self.hold.signals.iter().map(|s| Box::pin(s.lost()));
            tokio::select! {
                _ = futures_util::future::select_all(parts) => {}
                () = sleep_past(until) => {}
            }
        }
    }

    /// Releases this hold; the parts are released (all at once, never
    /// stopping at a failure) with the last guard.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the MultiLock was lost, naming the parts that
    /// were lost; the other parts are released anyway.
    /// [`Error::ServersFailed`] if some servers could not be reached; their
    /// clients complete those releases as soon as they answer again.
    ///
    /// # Cancel safety
    /// Cancel safe: once called, the release completes.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        match self.holders.release(&self.owners, &self.hold) {
            Step::Local if !self.hold.is_lost() => return Ok(()),
            Step::Local | Step::NotHeld => return Err(self.not_held(Vec::new())),
            Step::Final => {}
        }
        let guards = self.hold.take_guards();
        let names: Vec<String> = guards
            .iter()
            .map(|g| format!("{}@{}", g.name(), g.server()))
            .collect();
        let mut lost = Vec::new();
        let mut failed = Vec::new();
        for (name, result) in names.into_iter().zip(release_all(guards).await) {
            match result {
                Ok(()) => {}
                Err(Error::NotHeld { .. }) => lost.push(name),
                Err(e) => failed.push((name, e)),
            }
        }
        if !lost.is_empty() {
            return Err(self.not_held(lost));
        }
        if let Some((_, first)) = failed.first() {
            return Err(Error::ServersFailed {
                first: Box::new(first.clone()),
                servers: failed.into_iter().map(|(name, _)| name).collect(),
            });
        }
        Ok(())
    }

    fn not_held(&self, lost: Vec<String>) -> Error {
        let name = if lost.is_empty() {
            self.hold
                .fences
                .parts()
                .iter()
                .map(|f| format!("{}@{}", f.name, f.server))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            lost.join(", ")
        };
        Error::NotHeld { name }
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        if !self.released && self.holders.release(&self.owners, &self.hold) == Step::Final {
            // Each part's guard releases itself in the background.
            drop(self.hold.take_guards());
        }
    }
}
