//! A majority of independent servers: the Redlock algorithm, with
//! validity, extension, re-entry and fencing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use tokio::sync::Notify;

use super::fence::{Fence, FenceVector};
use super::holders::{Held, Holders, Step};
use super::parts::{no_answer, release_all, servers_failed, Outcome, Parts, Tried, Watches};
use super::{drift, jitter};
use crate::client::Client;
use crate::config::validate_lease;
use crate::core::holds::sleep_past;
use crate::core::{deadline_after, remaining, Attempt};
use crate::error::{Error, Result};
use crate::guard::Guard;
use hasp_owner::Owner;

/// The default upper bound of the random delay between two tries.
const RETRY_DELAY: Duration = Duration::from_millis(200);
/// The default per-server timeout, unless a tenth of the lease is shorter.
const SERVER_TIMEOUT: Duration = Duration::from_millis(50);

/// A lock held on a majority of N independent Redis servers (the Redlock
/// algorithm), so that it survives the failure of a minority of them.
///
/// * **Acquire** asks all N servers at once, each with a per-server
///   timeout much shorter than the lease (default: 50 ms or a tenth of the
///   lease, whichever is shorter), and decides as soon as a quorum
///   (N/2 + 1, or more) granted or can no longer grant. It holds the lock
///   if a quorum granted and the validity left — lease − the time from
///   sending the first request to the quorum-th grant − drift (1% of the
///   lease + 2 ms), on the monotonic clock — is at least the minimum
///   validity. Otherwise it releases on every server, those that did not
///   answer included (their clients release as soon as they answer), and
///   reports "not acquired" when enough servers said "held by another",
///   or [`Error::ServersFailed`] when failures left it undecided.
/// * **Retries** wait a random delay in [d/2, d] (d = 200 ms by default),
///   cut short by a release message from any server.
/// * **Extension.** In the default mode the lock renews itself every third
///   of its lease (the smallest watchdog timeout of its clients); a fixed
///   lease ([`with_lease`](Self::with_lease)) is extended only by
///   [`RedGuard::extend`]. An extension goes to every server at once and
///   counts when a quorum confirmed it before the current validity ended;
///   a server that lost the key (restarted) gets it back if it is free.
///   A failed extension loses the lock: [`RedGuard::lost`] fires and the
///   remaining keys are released (a minority protects nothing).
/// * **Re-entry** is counted client-side, per handle and its clones.
/// * **Fencing**: a [`FenceVector`] of the granting servers' tokens. Two
///   acquisitions always share a server, so
///   [`FenceVector::supersedes`] orders them.
///
/// # Limits
/// Redlock is safe under the assumptions of its specification, which are
/// worth knowing:
/// * A server restarted without its data (no persistence, or `appendfsync`
///   other than `always`) while a lock is held forgets it: with a majority
///   then free, a second holder can get it. Run with `appendfsync always`,
///   or keep a crashed server down for longer than the longest lease.
/// * A holder paused (GC, swap, `SIGSTOP`) past its validity keeps running
///   when it resumes; it learns of the loss only from
///   [`RedGuard::is_lost`]. Only the resource can refuse its writes:
///   check the fencing vector there.
/// * Redis expires keys by its own wall clock: a server whose clock jumps
///   forward drops keys early.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let servers: Vec<_> = (0..3).map(|_| testkit::RedisServer::start()).collect();
/// let mut clients = Vec::new();
/// for server in &servers {
///     clients.push(hasp::Client::open(&server.url()).await?);
/// }
/// let lock = hasp::RedLock::new("payout:42", &clients)?;
/// if let Some(guard) = lock.try_lock().await? {
///     assert!(guard.fencing().parts().len() >= 2);
///     guard.unlock().await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RedLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    parts: Parts,
    quorum: usize,
    lease: Duration,
    lease_ms: u64,
    renew: bool,
    server_timeout: Duration,
    /// Set by the user: a new lease keeps it.
    server_timeout_chosen: bool,
    retry_delay: Duration,
    min_validity: Duration,
    holders: Holders<RedHold>,
}

impl RedLock {
    /// The lock `name` on each client's server. Needs N ≥ 3 clients, each
    /// on its own server (an odd N is best).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for fewer than 3 clients, a client named
    /// twice, or an invalid name; no Redis call is made.
    pub fn new(name: &str, clients: &[Client]) -> Result<Self> {
        if clients.len() < 3 {
            return Err(Error::invalid(
                "clients",
                format!("a RedLock needs at least 3 servers, got {}", clients.len()),
            ));
        }
        let lease = clients
            .iter()
            .map(|c| c.settings().watchdog_timeout())
            .min()
            .unwrap_or(Duration::from_secs(30));
        let locks = clients
            .iter()
            .map(|c| c.lock(name))
            .collect::<Result<Vec<_>>>()?;
        let inner = Inner {
            name: name.to_owned(),
            parts: Parts::new(locks)?,
            quorum: clients.len() / 2 + 1,
            lease,
            lease_ms: 0,
            renew: true,
            server_timeout: SERVER_TIMEOUT,
            server_timeout_chosen: false,
            retry_delay: RETRY_DELAY,
            min_validity: Duration::from_millis(1),
            holders: Holders::default(),
        };
        inner.with_lease(lease, true)
    }

    /// This lock with a fixed lease, not renewed (extend it with
    /// [`RedGuard::extend`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a client refuses the lease, or the
    /// lease leaves no validity after the drift allowance.
    pub fn with_lease(&self, lease: Duration) -> Result<Self> {
        self.inner.clone_settings().with_lease(lease, false)
    }

    /// The number of servers that must grant (default N/2 + 1). It can only
    /// be raised: a smaller quorum would let two holders overlap.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] below N/2 + 1 or above N.
    pub fn with_quorum(&self, quorum: usize) -> Result<Self> {
        let n = self.inner.parts.len();
        if quorum < n / 2 + 1 || quorum > n {
            return Err(Error::invalid(
                "quorum",
                format!("{quorum} is not in {}..={n}", n / 2 + 1),
            ));
        }
        let mut inner = self.inner.clone_settings();
        inner.quorum = quorum;
        Ok(Self::from(inner))
    }

    /// How long to wait for each server's answer (default: 50 ms or a tenth
    /// of the lease, whichever is shorter).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero, or more than half the lease.
    pub fn with_server_timeout(&self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() || timeout > self.inner.lease / 2 {
            return Err(Error::invalid(
                "server_timeout",
                format!("{timeout:?} must be in 1 ns ..= lease / 2"),
            ));
        }
        let mut inner = self.inner.clone_settings();
        inner.server_timeout = timeout;
        inner.server_timeout_chosen = true;
        Ok(Self::from(inner))
    }

    /// The upper bound d of the random delay in [d/2, d] between tries
    /// (default 200 ms).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero.
    pub fn with_retry_delay(&self, delay: Duration) -> Result<Self> {
        if delay.is_zero() {
            return Err(Error::invalid("retry_delay", "must be greater than zero"));
        }
        let mut inner = self.inner.clone_settings();
        inner.retry_delay = delay;
        Ok(Self::from(inner))
    }

    /// The least validity an acquisition must leave to count (default
    /// 1 ms): with less, it is released and reported not acquired.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero or at least the lease.
    pub fn with_min_validity(&self, min: Duration) -> Result<Self> {
        if min.is_zero() || min >= self.inner.lease {
            return Err(Error::invalid(
                "min_validity",
                format!("{min:?} must be in 1 ns ..< lease"),
            ));
        }
        let mut inner = self.inner.clone_settings();
        inner.min_validity = min;
        Ok(Self::from(inner))
    }

    /// This lock acting for `owner` on every server.
    pub fn with_owner(&self, owner: Owner) -> Self {
        let mut inner = self.inner.clone_settings();
        inner.parts = inner.parts.map(|part| part.with_owner(owner.clone()));
        Self::from(inner)
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The number of servers that must grant.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Acquires, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::ServersFailed`] when too many servers failed to answer for
    /// a quorum to be possible; nothing is left held.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no key held (a grant racing
    /// the drop is released by its client), no renewal and no
    /// subscription.
    pub async fn lock(&self) -> Result<RedGuard> {
        self.acquire(None, true)
            .await?
            .ok_or_else(|| Error::Protocol("an unbounded wait ended without the lock".to_owned()))
    }

    /// Tries once: `Ok(None)` if enough servers answered "held by another"
    /// that no quorum could grant, or the validity left was too short.
    ///
    /// # Errors
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<RedGuard>> {
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
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<RedGuard>> {
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
    pub async fn lock_within(&self, wait: Duration) -> Result<RedGuard> {
        let found = self.try_lock_for(wait).await?;
        Error::unless_timed_out(found, self.name(), wait)
    }

    /// Guards handed out to the current owner (0 if not held or lost).
    /// Answered locally.
    pub fn hold_count(&self) -> u32 {
        self.inner.holders.count(&self.inner.parts.owners())
    }

    async fn acquire(&self, deadline: Option<Instant>, wait: bool) -> Result<Option<RedGuard>> {
        let inner = &self.inner;
        let owners = inner.parts.owners();
        if let Some(hold) = inner.holders.reenter(&owners) {
            return Ok(Some(self.guard(owners, hold)));
        }
        let mut watches: Option<Watches> = None;
        loop {
            if let Some(hold) = inner.try_quorum(&owners, wait).await? {
                let hold = Arc::new(hold);
                inner.holders.insert(owners.clone(), hold.clone());
                if inner.renew {
                    tokio::spawn(renew(Arc::downgrade(inner), Arc::downgrade(&hold)));
                }
                return Ok(Some(self.guard(owners, hold)));
            }
            let left = remaining(deadline);
            if !wait || left.is_zero() {
                return Ok(None);
            }
            let watches = match watches.as_mut() {
                Some(watches) => watches,
                None => {
                    let subscribed = inner.parts.watch();
                    subscribed.ready(left.min(inner.server_timeout * 4)).await;
                    watches.insert(subscribed)
                }
            };
            let delay = jitter(inner.retry_delay).min(remaining(deadline));
            let _ = tokio::time::timeout(delay, watches.any_freed()).await;
            if remaining(deadline).is_zero() {
                return Ok(None);
            }
        }
    }

    fn guard(&self, owners: Vec<Owner>, hold: Arc<RedHold>) -> RedGuard {
        RedGuard {
            inner: self.inner.clone(),
            owners,
            hold,
            released: false,
        }
    }
}

impl From<Inner> for RedLock {
    fn from(inner: Inner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }
}

impl Inner {
    /// The same lock and settings, with no holds.
    fn clone_settings(&self) -> Inner {
        Inner {
            name: self.name.clone(),
            parts: self.parts.map(|part| part),
            quorum: self.quorum,
            lease: self.lease,
            lease_ms: self.lease_ms,
            renew: self.renew,
            server_timeout: self.server_timeout,
            server_timeout_chosen: self.server_timeout_chosen,
            retry_delay: self.retry_delay,
            min_validity: self.min_validity,
            holders: Holders::default(),
        }
    }

    fn with_lease(mut self, lease: Duration, renew: bool) -> Result<RedLock> {
        let mut lease_ms = 0;
        for part in self.parts.locks() {
            lease_ms = validate_lease(part.settings(), lease)?;
        }
        if drift(lease) + self.min_validity >= lease {
            return Err(Error::invalid(
                "lease",
                format!("{lease:?} leaves no validity after the drift allowance"),
            ));
        }
        self.parts = self.parts.try_map(|part| part.with_lease(lease))?;
        self.lease = lease;
        self.lease_ms = lease_ms;
        self.renew = renew;
        if !self.server_timeout_chosen {
            self.server_timeout = SERVER_TIMEOUT.min(lease / 10).max(Duration::from_millis(1));
        } else if self.server_timeout > lease / 2 {
            return Err(Error::invalid(
                "lease",
                format!("{lease:?} is shorter than twice the server timeout"),
            ));
        }
        Ok(RedLock::from(self))
    }

    /// One round of the algorithm: `Ok(None)` when not acquired.
    async fn try_quorum(&self, owners: &[Owner], flag_waiting: bool) -> Result<Option<RedHold>> {
        let n = self.parts.len();
        let started = Instant::now();
        let mut answers = self
            .parts
            .try_each(owners, flag_waiting, self.server_timeout);
        let mut tally = Tally::default();
        while let Some(tried) = answers.next().await {
            tally.add(tried);
            if tally.decided(n, self.quorum) {
                break;
            }
        }
        // Answers already in take part; the rest are abandoned (and
        // released by their clients if they grant).
        while let Some(Some(tried)) = answers.next().now_or_never() {
            tally.add(tried);
        }
        drop(answers);
        let Tally {
            granted,
            refused,
            failed,
        } = tally;
        let valid_until = (started + self.lease).checked_sub(drift(self.lease));
        if granted.len() >= self.quorum {
            if let Some(until) = valid_until {
                if until.saturating_duration_since(Instant::now()) >= self.min_validity {
                    return Ok(Some(RedHold::new(self, owners, granted, until)));
                }
            }
        }
        release_all(granted.into_iter().map(|(_, g)| g).collect()).await;
        if refused > n - self.quorum || failed.is_empty() {
            return Ok(None);
        }
        Err(servers_failed(&self.parts, failed))
    }

    /// One extension round: every server at once; true when a quorum
    /// confirmed before the current validity ended. A server that lost the
    /// key gets it back if it is free.
    async fn extend(&self, hold: &RedHold, owners: &[Owner]) -> bool {
        let sent = Instant::now();
        let until = hold.valid_until();
        let rounds = self.parts.locks().iter().enumerate().map(|(i, part)| {
            let slot = &hold.slots[i];
            let owner = &owners[i];
            async move {
                let mut slot = slot.lock().await;
                let extended = match slot.as_ref() {
                    Some(guard) => tokio::time::timeout(self.server_timeout, guard.extend(self.lease_ms))
                        .await
                        .unwrap_or_else(|_| Err(no_answer(part, self.server_timeout))),
                    None => Ok(false),
                };
                match extended {
                    Ok(true) => true,
                    Ok(false) => match tokio::time::timeout(self.server_timeout, part.try_once(owner, false)).await {
                        Ok(Ok(Attempt::Done(guard))) => {
                            *slot = Some(guard); // the lost one (if any) is dropped: nothing to release
                            true
                        }
                        _ => false,
                    },
                    Err(e) => {
                        tracing::debug!(error = %e, lock = %self.name, "extension failed on a server");
                        false
                    }
                }
            }
        });
        let confirmed = futures_util::future::join_all(rounds)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count();
        if confirmed >= self.quorum && Instant::now() < until {
            if let Some(new_until) = (sent + self.lease).checked_sub(drift(self.lease)) {
                hold.confirm(new_until);
                return true;
            }
        }
        false
    }
}

/// The answers of one round so far.
#[derive(Default)]
struct Tally {
    granted: Vec<(usize, Guard)>,
    refused: usize,
    failed: Vec<(usize, Error)>,
}

impl Tally {
    fn add(&mut self, tried: Tried) {
        match tried.outcome {
            Outcome::Held(guard) => self.granted.push((tried.index, guard)),
            Outcome::Busy(_) => self.refused += 1,
            Outcome::Failed(e) => self.failed.push((tried.index, e)),
        }
    }

    fn decided(&self, n: usize, quorum: usize) -> bool {
        granted_or_impossible(
            self.granted.len(),
            self.refused + self.failed.len(),
            n,
            quorum,
        )
    }
}

/// True once `granted` reached the quorum or the refusals and failures
/// make it unreachable.
fn granted_or_impossible(granted: usize, not_granted: usize, n: usize, quorum: usize) -> bool {
    granted >= quorum || not_granted > n - quorum
}

/// The renewal task of one hold in the default mode: an extension every
/// third of the lease until the hold is released (it stops at once) or
/// lost.
async fn renew(lock: Weak<Inner>, hold: Weak<RedHold>) {
    loop {
        let Some(period) = lock.upgrade().map(|l| l.lease / 3) else {
            return;
        };
        {
            let Some(hold) = hold.upgrade() else {
                return;
            };
            let ended = hold.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if hold.is_released() || hold.is_lost() {
                return;
            }
            tokio::select! {
                () = ended => return,
                () = tokio::time::sleep(period) => {}
            }
        }
        let (Some(lock), Some(hold)) = (lock.upgrade(), hold.upgrade()) else {
            return;
        };
        if hold.is_lost() || hold.is_released() {
            return;
        }
        let owners = hold.owners.clone();
        if !lock.extend(&hold, &owners).await {
            hold.lose();
            return;
        }
    }
}

/// What every guard of one RedLock hold shares.
#[derive(Debug)]
struct RedHold {
    /// One slot per server: the hold there, if any.
    slots: Vec<tokio::sync::Mutex<Option<Guard>>>,
    owners: Vec<Owner>,
    fences: FenceVector,
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
    released: AtomicBool,
    /// Wakes the loss signal's waiters when the validity moves or is lost.
    changed: Notify,
    /// Stops the renewal task when the hold is released.
    ended: Notify,
}

impl RedHold {
    fn new(
        lock: &Inner,
        owners: &[Owner],
        granted: Vec<(usize, Guard)>,
        valid_until: Instant,
    ) -> Self {
        let fences = FenceVector::new(
            granted
                .iter()
                .map(|(_, g)| Fence {
                    server: g.server().to_string(),
                    name: g.name().to_owned(),
                    token: g.fencing_token(),
                })
                .collect(),
        );
        let mut slots: Vec<Option<Guard>> = (0..lock.parts.len()).map(|_| None).collect();
        for (i, guard) in granted {
            slots[i] = Some(guard);
        }
        Self {
            slots: slots.into_iter().map(tokio::sync::Mutex::new).collect(),
            owners: owners.to_vec(),
            fences,
            valid_until: Mutex::new(valid_until),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            changed: Notify::new(),
            ended: Notify::new(),
        }
    }

    fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn confirm(&self, until: Instant) {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        self.changed.notify_waiters();
    }

    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// The last guard is gone: renewal stops.
    fn end(&self) {
        self.released.store(true, Ordering::Release);
        self.ended.notify_waiters();
    }

    /// The extension failed: the hold is lost, and the keys still held
    /// (a minority, protecting nothing) are released in the background.
    fn lose(self: &Arc<Self>) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!("RedLock lost: no quorum extended it in time");
        self.changed.notify_waiters();
        let hold = self.clone();
        tokio::spawn(async move {
            hold.take_guards().await;
        });
    }

    /// Takes every slot's guard; dropping them releases in the background.
    async fn take_guards(&self) -> Vec<Guard> {
        let mut guards = Vec::new();
        for slot in &self.slots {
            if let Some(guard) = slot.lock().await.take() {
                guards.push(guard);
            }
        }
        guards
    }
}

impl Held for RedHold {
    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire) || Instant::now() >= self.valid_until()
    }
}

/// A held [`RedLock`].
///
/// Each acquisition, re-entries included, returns its own guard, and each
/// must be released. Dropping a guard without [`unlock`](Self::unlock)
/// releases in the background.
#[must_use = "if unused the RedLock is released at once, in the background"]
#[derive(Debug)]
pub struct RedGuard {
    inner: Arc<Inner>,
    owners: Vec<Owner>,
    hold: Arc<RedHold>,
    released: bool,
}

impl RedGuard {
    /// The granting servers' fencing tokens at acquisition (a re-entry
    /// returns the same vector).
    pub fn fencing(&self) -> &FenceVector {
        &self.hold.fences
    }

    /// When the lock counts as lost unless extended first: the instant the
    /// first request of the acquisition (or of the last confirmed
    /// extension) was sent, plus the lease, less the drift allowance; on
    /// the monotonic clock.
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// True once the lock is lost: an extension failed, or
    /// [`valid_until`](Self::valid_until) passed.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when the lock is lost (see [`is_lost`](Self::is_lost)),
    /// on time even while every server is unreachable.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        loop {
            let changed = self.hold.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.hold.is_lost() {
                return;
            }
            let until = self.hold.valid_until();
            tokio::select! {
                () = changed => {}
                () = sleep_past(until) => {}
            }
        }
    }

    /// Extends the lock by its lease now, on every server at once.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if no quorum confirmed before the validity ended:
    /// the lock is then lost and its remaining keys released.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped midway, the servers reached are extended
    /// but the validity is not moved.
    pub async fn extend(&self) -> Result<()> {
        if !self.hold.is_lost() && self.inner.extend(&self.hold, &self.owners).await {
            return Ok(());
        }
        self.hold.lose();
        Err(self.not_held())
    }

    /// Releases this hold; the keys are released on every server (all at
    /// once) with the last guard.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the lock was lost meanwhile (its keys are
    /// released anyway).
    ///
    /// # Cancel safety
    /// Cancel safe: once called, the release completes.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        let step = self.inner.holders.release(&self.owners, &self.hold);
        if step == Step::Final {
            self.hold.end();
            let guards = self.hold.take_guards().await;
            release_all(guards).await;
        }
        match step {
            Step::NotHeld => Err(self.not_held()),
            _ if self.hold.is_lost() => Err(self.not_held()),
            _ => Ok(()),
        }
    }

    fn not_held(&self) -> Error {
        Error::NotHeld {
            name: self.inner.name.clone(),
        }
    }
}

impl Drop for RedGuard {
    fn drop(&mut self) {
        if !self.released && self.inner.holders.release(&self.owners, &self.hold) == Step::Final {
            self.hold.end();
            let hold = self.hold.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    drop(hold.take_guards().await);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_comes_as_soon_as_it_is_known() {
        // 5 servers, quorum 3.
        assert!(granted_or_impossible(3, 0, 5, 3));
        assert!(!granted_or_impossible(2, 2, 5, 3));
        assert!(granted_or_impossible(0, 3, 5, 3));
    }
}
