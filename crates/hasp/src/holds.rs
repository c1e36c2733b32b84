//! The client's registry of the locks it holds.
//!
//! Re-entries are counted here, not in Redis: the client that holds a lock
//! already knows it does (seed 001), so a re-entry in watchdog mode costs no
//! round trip. Redis sees one hold per (lock, owner, client) — more only when
//! two clients share an explicit owner — and the watchdog renews what is
//! listed here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use crate::keys::LockKeys;
use crate::owner::Owner;

/// How a hold's lease is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lease {
    /// Renewed by the watchdog while the client lives.
    Watchdog,
    /// Fixed lease in milliseconds, never renewed.
    Fixed(u64),
}

/// What every guard of one hold shares.
#[derive(Debug)]
pub(crate) struct HoldState {
    id: u64,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) owner: Owner,
    pub(crate) token: u64,
    pub(crate) lease: Lease,
    lost: AtomicBool,
    lost_notify: Notify,
    /// For fixed leases: when the lease runs out unless re-armed. Measured
    /// from before the acquire was sent, so it never overestimates.
    expires_at: Mutex<Option<Instant>>,
}

impl HoldState {
    pub(crate) fn mark_lost(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            tracing::warn!(lock = %self.keys.name, owner = %self.owner, "lock lost while held");
        }
        self.lost_notify.notify_waiters();
    }

    pub(crate) fn expires_at(&self) -> Option<Instant> {
        *lock(&self.expires_at)
    }

    pub(crate) fn set_expires_at(&self, at: Instant) {
        *lock(&self.expires_at) = Some(at);
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
            || self.expires_at().is_some_and(|at| Instant::now() >= at)
    }

    /// Resolves when the hold is lost (renewal found it gone) or its fixed
    /// lease ran out.
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lost.load(Ordering::Acquire) {
                return;
            }
            match self.expires_at() {
                Some(at) => {
                    if tokio::time::timeout_at(at.into(), notified).await.is_err() {
                        // The lease may have been re-armed while we slept.
                        if self.expires_at().is_some_and(|now| Instant::now() >= now) {
                            return;
                        }
                    }
                }
                None => notified.await,
            }
        }
    }
}

#[derive(Debug, Hash, PartialEq, Eq)]
struct HoldKey {
    lock: Arc<str>,
    owner: Arc<str>,
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
            owner: owner.as_arc().clone(),
        }
    }

    /// The live hold of `owner` on this lock, if any. A hold found lost is
    /// dropped from the registry so that the caller acquires afresh.
    pub(crate) fn live(&self, keys: &LockKeys, owner: &Owner) -> Option<Arc<HoldState>> {
        let mut map = self.map(keys);
        let key = Self::key(keys, owner);
        let entry = map.get(&key)?;
        if entry.state.is_lost() {
            map.remove(&key);
            return None;
        }
        Some(entry.state.clone())
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

    /// Records a hold just acquired in Redis.
    pub(crate) fn insert(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        token: u64,
        lease: Lease,
        expires_at: Option<Instant>,
    ) -> Arc<HoldState> {
        let mut map = self.map(keys);
        let key = Self::key(keys, owner);
        if let Some(entry) = map.get_mut(&key) {
            if entry.state.token == token && !entry.state.lost.load(Ordering::Acquire) {
                // Two tasks sharing an owner raced past the local check;
                // Redis counted a re-entry of the same hold.
                entry.count += 1;
                entry.redis_holds += 1;
                if let Some(at) = expires_at {
                    entry.state.set_expires_at(at);
                }
                return entry.state.clone();
            }
        }
        let state = Arc::new(HoldState {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            keys: keys.clone(),
            owner: owner.clone(),
            token,
            lease,
            lost: AtomicBool::new(false),
            lost_notify: Notify::new(),
            expires_at: Mutex::new(expires_at),
        });
        map.insert(
            key,
            Entry {
                count: 1,
                redis_holds: 1,
                state: state.clone(),
            },
        );
        state
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

    /// The holds the watchdog must renew.
    pub(crate) fn watchdog_holds(&self) -> Vec<Arc<HoldState>> {
        let mut holds = Vec::new();
        for shard in &self.shards {
            holds.extend(
                lock(shard)
                    .values()
                    .filter(|e| {
                        e.state.lease == Lease::Watchdog && !e.state.lost.load(Ordering::Relaxed)
                    })
                    .map(|e| e.state.clone()),
            );
        }
        holds
    }

    /// Number of registered holds (all owners, all locks).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }
}
