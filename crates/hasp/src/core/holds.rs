//! The client's registry of the locks it holds (and semaphore permits:
//! then an entry's Redis count is the permits its owner holds through this
//! client, and every guard gives back its own).
//!
//! Re-entries are counted here, not in Redis: the client that holds a lock
//! already knows it does, so a re-entry in watchdog mode costs no
//! round trip. Redis sees one hold per (lock, owner, client) — more only when
//! two clients share an explicit owner — and the watchdog renews what is
//! listed here.
//!
//! Each hold knows when the holder's belief ends: when the last acquire or
//! renewal that Redis confirmed was *sent*, plus its lease, less a clock
//! drift allowance (1% of the lease + 2 ms, as Redlock's), on the monotonic
//! clock. Redis's expiry runs from when it *applied* the call, which is
//! later, and the allowance covers a server clock that runs a little fast,
//! so the belief ends before the key can expire; past that instant the hold
//! counts as lost, whether or not Redis can be reached to say so, and
//! [`HoldState::lost`] resolves then, not a timer tick later.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::keys::{Kind, LockKeys};
use super::nonce::Nonce;
use hasp_owner::Owner;

/// The clock drift allowance of a lease (the Redlock spec's): 1% of it,
/// rounded up, plus 2 ms.
pub(crate) fn drift(lease: Duration) -> Duration {
    let ms = u64::try_from(lease.as_millis().div_ceil(100)).unwrap_or(u64::MAX);
    Duration::from_millis(ms.saturating_add(2))
}

/// When the belief in a hold ends, for a call sent at `sent_at` that set a
/// lease of `lease_ms`.
fn belief_end(sent_at: Instant, lease_ms: u64) -> Instant {
    let lease = Duration::from_millis(lease_ms);
    (sent_at + lease)
        .checked_sub(drift(lease))
        .unwrap_or(sent_at)
        .max(sent_at)
}

/// tokio's timer fires on whole-millisecond ticks, up to a tick after its
/// deadline.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// Returns once `deadline` has passed on the monotonic clock, and not a
/// timer tick after it: sleeps until a tick before it and yields to other
/// tasks for the rest. So a signal that fires at a deadline fires when a
/// reading of the clock (`Instant::now() >= deadline`) would first say so.
pub(crate) async fn sleep_past(deadline: Instant) {
    if let Some(early) = deadline.checked_sub(TIMER_TICK) {
        tokio::time::sleep_until(early.into()).await;
    }
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

/// How a hold's lease is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog while the client lives.
    Watchdog,
    /// Fixed lease in milliseconds, never renewed.
    Fixed(u64),
    /// Learned per class (the client's class index), renewed only when its
    /// remaining lease runs low (see `adaptive`).
    Adaptive(u32),
}

/// Who asks for a hold of which object, and how its lease is kept: what
/// every acquisition names.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim<'a> {
    pub(crate) keys: &'a Arc<LockKeys>,
    pub(crate) owner: &'a Owner,
    pub(crate) lease: Lease,
}

/// What an acquisition of a free lock wrote into the lock's value: its
/// operation's nonce and the hold's token (`lock.lua`, "lock").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) nonce: Nonce,
    pub(crate) token: u64,
}

/// What every guard of one hold shares.
#[derive(Debug)]
pub(crate) struct HoldState {
    id: u64,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Owner,
    pub(crate) token: u64,
    pub(crate) lease: Lease,
    /// The acquisition that made this hold, if it was one that writes the
    /// lock's value whole (`1 <nonce> - <owner> <token>`): while Redis
    /// still holds exactly that value, a release or renewal can be one
    /// conditional command (`wire::native`).
    pub(crate) written: Option<Written>,
    /// Redis said the hold is gone (renewal or re-entry found another owner
    /// or no lock).
    gone: AtomicBool,
    lost_notify: Notify,
    /// The end of the holder's belief (see the module docs).
    valid_until: Mutex<Instant>,
    /// When the acquisition's reply came: an adaptive hold's duration runs
    /// from here.
    pub(crate) acquired_at: Instant,
    /// An adaptive hold had to be renewed (it overran its lease).
    pub(crate) renewed: AtomicBool,
    /// Bumped each time the hold is scheduled for renewal: older entries of
    /// the schedule are stale.
    schedule_seq: AtomicU64,
}

impl HoldState {
    /// Redis said the hold is gone: the loss is certain and there is nothing
    /// left in Redis to release.
    pub(crate) fn mark_gone(&self) {
        if !self.gone.swap(true, Ordering::AcqRel) {
            tracing::warn!(lock = %self.keys.name, owner = %self.owner, "lock lost while held");
        }
        self.lost_notify.notify_waiters();
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// When the holder's belief ends unless a renewal is confirmed.
    pub(crate) fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    /// A call sent at `sent_at` that set the lease to `lease_ms` was
    /// confirmed.
    pub(crate) fn confirm(&self, sent_at: Instant, lease_ms: u64) {
        *lock(&self.valid_until) = belief_end(sent_at, lease_ms);
        self.lost_notify.notify_waiters(); // lost() re-reads the new end
    }

    /// Gone, or its belief ran out.
    pub(crate) fn is_lost(&self) -> bool {
        self.is_gone() || Instant::now() >= self.valid_until()
    }

    /// Resolves when the hold is lost (see [`is_lost`](Self::is_lost)).
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            // Woken early by a renewal: read the new end.
            tokio::select! {
                () = notified => {}
                () = sleep_past(self.valid_until()) => {}
            }
        }
    }
}

#[derive(Debug, Hash, PartialEq, Eq)]
struct HoldKey {
    lock: Arc<str>,
    owner: Arc<str>,
    /// A read-write lock's read and write holds share its keys.
    kind: Kind,
}

#[derive(Debug)]
struct Entry {
    /// Local holds: guards handed out and not yet released.
    count: u32,
    /// Holds this client added in Redis (1, or more when a same-owner race
    /// made Redis count a re-entry); the final release removes all of them.
    redis_holds: u32,
    state: Arc<HoldState>,
}

/// What the registry has for a (lock, owner).
#[derive(Debug)]
pub(crate) enum Found {
    /// A hold not known to be lost.
    Live(Arc<HoldState>),
    /// A hold whose belief ran out (now dropped); Redis may still count
    /// `redis_holds` of it.
    Stale { redis_holds: u32 },
    /// Nothing (or a hold Redis said was gone, now dropped).
    None,
}

/// What a release must do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReleaseStep {
    /// Other local holds remain; nothing to send.
    Local,
    /// The last local hold: release `redis_holds` holds in Redis.
    Final { redis_holds: u32 },
    /// This hold is not (or no longer) registered.
    NotHeld,
}

/// Looked up three times per lock/unlock pair with two strings of some 40
/// bytes as key: SipHash (std's default) was a visible share of a client's
/// CPU under load. foldhash is seeded per map, like std's.
type HoldMap = HashMap<HoldKey, Entry, foldhash::fast::RandomState>;

/// Shards of the registry. Two runtime workers that lock at once rarely meet
/// on one mutex; on a machine where they share a core, a meeting costs two
/// context switches.
const SHARDS: usize = 16;

#[derive(Debug, Default)]
pub(crate) struct Holds {
    shards: [Mutex<HoldMap>; SHARDS],
    next_id: AtomicU64,
    /// Adaptive holds by the instant their renewal is due.
    due: Mutex<BinaryHeap<Reverse<Due>>>,
    /// Notified when a renewal falls due sooner than the schedule's head.
    pub(crate) due_sooner: Notify,
    /// The least lead of an adaptive renewal (`renew_floor`).
    renew_floor: Mutex<Duration>,
}

/// One entry of the renewal schedule.
#[derive(Debug)]
struct Due {
    at: Instant,
    seq: u64,
    state: Arc<HoldState>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq, self.state.id) == (other.at, other.seq, other.state.id)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.state.id, self.seq).cmp(&(other.at, other.state.id, other.seq))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding this mutex cannot leave the map half-updated
    // (every update is a single insert/remove/increment), so poison is moot.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Holds {
    fn map(&self, keys: &LockKeys) -> MutexGuard<'_, HoldMap> {
        lock(&self.shards[keys.shard % SHARDS])
    }

    fn key(keys: &LockKeys, owner: &Owner) -> HoldKey {
        HoldKey {
            lock: keys.lock.clone(),
            owner: owner.shared_id().clone(),
            kind: keys.kind,
        }
    }

    /// The hold of `owner` on this lock. A hold found lost is dropped from
    /// the registry, so that the caller acquires afresh; if Redis may still
    /// count it, the caller must release it first.
    pub(crate) fn find(&self, keys: &LockKeys, owner: &Owner) -> Found {
        let mut map = self.map(keys);
        let key = Self::key(keys, owner);
        let Some(entry) = map.get(&key) else {
            return Found::None;
        };
        if !entry.state.is_lost() {
            return Found::Live(entry.state.clone());
        }
        let stale = (!entry.state.is_gone()).then_some(entry.redis_holds);
        map.remove(&key);
        match stale {
            Some(redis_holds) => Found::Stale { redis_holds },
            None => Found::None,
        }
    }

    /// Counts one more local hold on `state`. False if it was released or
    /// replaced meanwhile.
    pub(crate) fn reenter(&self, state: &Arc<HoldState>) -> bool {
        let mut map = self.map(&state.keys);
        match map.get_mut(&Self::key(&state.keys, &state.owner)) {
            Some(entry) if Arc::ptr_eq(&entry.state, state) => {
                entry.count += 1;
                true
            }
            _ => false,
        }
    }

    /// A new hold's state: its belief ends at `sent_at` + `lease_ms`.
    fn new_state(
        &self,
        claim: Claim<'_>,
        token: u64,
        (sent_at, lease_ms): (Instant, u64),
        written: Option<Written>,
    ) -> Arc<HoldState> {
        Arc::new(HoldState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            keys: claim.keys.clone(),
            owner: claim.owner.clone(),
            token,
            lease: claim.lease,
            written,
            gone: AtomicBool::new(false),
            lost_notify: Notify::new(),
            valid_until: Mutex::new(belief_end(sent_at, lease_ms)),
            acquired_at: Instant::now(),
            renewed: AtomicBool::new(false),
            schedule_seq: AtomicU64::new(0),
        })
    }

    /// Records a hold just acquired in Redis by a call sent at `sent_at`
    /// with a lease of `lease_ms` (`written`: the acquisition, if it wrote
    /// the lock's value whole).
    pub(crate) fn insert(
        &self,
        claim: Claim<'_>,
        token: u64,
        confirmed: (Instant, u64),
        written: Option<Written>,
    ) -> Arc<HoldState> {
        // Two tasks sharing an owner raced past the local check: Redis
        // counted a re-entry of the same hold (same token). A plain lock's
        // holds have no token: a live hold of the owner is the one Redis
        // counted again.
        let same_hold = |state: &HoldState| match claim.keys.fenced() {
            true => state.token == token && !state.is_gone(),
            false => !state.is_lost(),
        };
        self.insert_or_join(claim, token, confirmed, 1, same_hold, written)
    }

    /// Records `permits` of a semaphore just taken in Redis for `owner` by a
    /// call sent at `sent_at` with a lease of `lease_ms`: added to the
    /// owner's live entry (one lease covers all of an owner's permits), or
    /// a new one.
    pub(crate) fn insert_permits(
        &self,
        claim: Claim<'_>,
        permits: u32,
        confirmed: (Instant, u64),
    ) -> Arc<HoldState> {
        let live = |state: &HoldState| !state.is_lost();
        self.insert_or_join(claim, 0, confirmed, permits, live, None)
    }

    /// Adds `units` held in Redis to the entry of (lock, owner) if `joins`
    /// its state (one more guard of it), else registers a new hold.
    fn insert_or_join(
        &self,
        claim: Claim<'_>,
        token: u64,
        (sent_at, lease_ms): (Instant, u64),
        units: u32,
        joins: impl Fn(&HoldState) -> bool,
        written: Option<Written>,
    ) -> Arc<HoldState> {
        let mut map = self.map(claim.keys);
        let key = Self::key(claim.keys, claim.owner);
        if let Some(entry) = map.get_mut(&key) {
            if joins(&entry.state) {
                entry.count += 1;
                entry.redis_holds += units;
                entry.state.confirm(sent_at, lease_ms);
                return entry.state.clone();
            }
        }
        let state = self.new_state(claim, token, (sent_at, lease_ms), written);
        map.insert(
            key,
            Entry {
                count: 1,
                redis_holds: units,
                state: state.clone(),
            },
        );
        drop(map);
        if let Lease::Adaptive(_) = claim.lease {
            self.schedule(&state, lease_ms);
        }
        state
    }

    /// Gives back one guard's `permits` of `state`: always a release in
    /// Redis ([`ReleaseStep::Final`] with the permits), unless the entry is
    /// gone.
    pub(crate) fn release_permits(&self, state: &HoldState, permits: u32) -> ReleaseStep {
        let mut map = self.map(&state.keys);
        let key = Self::key(&state.keys, &state.owner);
        let Some(entry) = map.get_mut(&key) else {
            return ReleaseStep::NotHeld;
        };
        if entry.state.id != state.id {
            return ReleaseStep::NotHeld;
        }
        entry.count -= 1;
        entry.redis_holds = entry.redis_holds.saturating_sub(permits);
        if entry.count == 0 {
            map.remove(&key);
        }
        ReleaseStep::Final {
            redis_holds: permits,
        }
    }

    /// Gives back one local hold of `state`.
    pub(crate) fn release(&self, state: &HoldState) -> ReleaseStep {
        let mut map = self.map(&state.keys);
        let key = Self::key(&state.keys, &state.owner);
        let Some(entry) = map.get_mut(&key) else {
            return ReleaseStep::NotHeld;
        };
        if entry.state.id != state.id {
            return ReleaseStep::NotHeld;
        }
        if entry.count > 1 {
            entry.count -= 1;
            return ReleaseStep::Local;
        }
        let redis_holds = entry.redis_holds;
        map.remove(&key);
        ReleaseStep::Final { redis_holds }
    }

    /// Local hold count of `owner` on this lock (0 if none or lost).
    pub(crate) fn count(&self, keys: &LockKeys, owner: &Owner) -> u32 {
        let map = self.map(keys);
        match map.get(&Self::key(keys, owner)) {
            Some(entry) if !entry.state.is_lost() => entry.count,
            _ => 0,
        }
    }

    /// The holds not known to be lost: those in watchdog mode, or all of
    /// them (for a check after a reconnect).
    pub(crate) fn to_renew(&self, all: bool) -> Vec<Arc<HoldState>> {
        let mut holds = Vec::new();
        for shard in &self.shards {
            holds.extend(
                lock(shard)
                    .values()
                    .filter(|e| (all || e.state.lease == Lease::Watchdog) && !e.state.is_lost())
                    .map(|e| e.state.clone()),
            );
        }
        holds
    }

    /// Sets the least lead of an adaptive renewal (the client's
    /// `renew_floor`).
    pub(crate) fn set_renew_floor(&self, floor: Duration) {
        *lock(&self.renew_floor) = floor;
    }

    /// Schedules the renewal of adaptive hold `state`, whose lease is now
    /// `lease_ms`: due when its remaining lease falls below
    /// `max(lease / 3, renew_floor)`.
    pub(crate) fn schedule(&self, state: &Arc<HoldState>, lease_ms: u64) {
        let lead = (Duration::from_millis(lease_ms) / 3).max(*lock(&self.renew_floor));
        let at = state
            .valid_until()
            .checked_sub(lead)
            .unwrap_or_else(Instant::now);
        self.schedule_at(state, at);
    }

    /// Schedules the renewal of `state` at `at` (replacing its earlier
    /// entry).
    pub(crate) fn schedule_at(&self, state: &Arc<HoldState>, at: Instant) {
        let seq = state.schedule_seq.fetch_add(1, Ordering::AcqRel) + 1;
        let mut due = lock(&self.due);
        let sooner = due.peek().is_none_or(|Reverse(head)| at < head.at);
        due.push(Reverse(Due {
            at,
            seq,
            state: state.clone(),
        }));
        drop(due);
        if sooner {
            self.due_sooner.notify_one();
        }
    }

    /// When the next scheduled renewal is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        lock(&self.due).peek().map(|Reverse(head)| head.at)
    }

    /// The adaptive holds due by `now`: still registered, not lost, and not
    /// rescheduled since (a released or dropped hold is never renewed).
    pub(crate) fn take_due(&self, now: Instant) -> Vec<Arc<HoldState>> {
        let mut taken = Vec::new();
        let mut due = lock(&self.due);
        while due.peek().is_some_and(|Reverse(head)| head.at <= now) {
            let Some(Reverse(entry)) = due.pop() else {
                break;
            };
            if entry.seq == entry.state.schedule_seq.load(Ordering::Acquire) {
                taken.push(entry.state);
            }
        }
        drop(due);
        taken.retain(|state| !state.is_lost() && self.is_registered(state));
        taken
    }

    /// Whether `state` is the registered hold of its (lock, owner).
    fn is_registered(&self, state: &HoldState) -> bool {
        let map = self.map(&state.keys);
        map.get(&Self::key(&state.keys, &state.owner))
            .is_some_and(|entry| entry.state.id == state.id)
    }

    /// Number of registered holds (all owners, all locks).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }
}
