//! Learned leases: per class of locks, an estimate of how long
//! holds last, kept in the client and merged at most once a second into a
//! history shared in Redis (`lease.lua`).
//!
//! The estimator is TCP's retransmission timer (RFC 6298; see
//! [`AdaptiveLease`](crate::config::AdaptiveLease)). Acquiring and releasing cost no
//! extra round trip: a lease is read from memory, a sample is written to
//! memory, and the merge rides the batcher in the background.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use super::keys::LockKeys;
use crate::config::Learning;

/// The estimate of one class.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Estimator {
    /// Smoothed duration, ms.
    pub(crate) srtt: f64,
    /// Smoothed deviation, ms.
    pub(crate) rttvar: f64,
    /// Samples behind the estimate (this client's and merged ones).
    pub(crate) samples: u64,
    /// A floor raised by an overrun (1.5 × its duration + the margin), ms;
    /// decays at the EWMA rate.
    raise: f64,
}

impl Estimator {
    /// Learns from a hold of `ms` that `overran` (had to be renewed).
    /// Holds longer than `max` teach nothing (Karn's rule).
    pub(crate) fn sample(&mut self, ms: f64, overran: bool, learning: &Learning) {
        if !(ms.is_finite() && ms >= 0.0) || ms > millis(learning.max) {
            return;
        }
        if self.samples == 0 {
            self.srtt = ms;
            self.rttvar = ms / 2.0;
        } else {
            self.rttvar =
                (1.0 - learning.beta) * self.rttvar + learning.beta * (self.srtt - ms).abs();
            self.srtt = (1.0 - learning.alpha) * self.srtt + learning.alpha * ms;
        }
        self.samples += 1;
        self.raise *= 1.0 - learning.alpha;
        if overran {
            // 1.5 × the overrun, plus the margin: the same section again
            // ends before its renewal point (a third of the lease early).
            self.raise = self.raise.max(1.5 * ms + millis(learning.margin));
        }
    }

    /// The lease the next hold gets, in milliseconds.
    pub(crate) fn lease_ms(&self, learning: &Learning) -> u64 {
        let (min, max) = (millis(learning.min), millis(learning.max));
        let lease = if self.samples == 0 {
            millis(learning.initial)
        } else {
            let learned = self.srtt + learning.k * self.rttvar + millis(learning.margin);
            learned.max(self.raise)
        };
        lease.clamp(min, max).ceil() as u64
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What a merge with the shared history answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Shared {
    pub(crate) srtt: f64,
    pub(crate) rttvar: f64,
    pub(crate) samples: u64,
    /// Server milliseconds of the last write (0: nothing shared yet).
    pub(crate) updated_at_ms: i64,
}

/// One class of locks that learn together.
#[derive(Debug)]
pub(crate) struct Class {
    pub(crate) name: Arc<str>,
    /// The shared history's key (`P:{class}:lease`).
    pub(crate) keys: Arc<LockKeys>,
    state: Mutex<ClassState>,
    merging: AtomicBool,
}

#[derive(Debug)]
struct ClassState {
    estimate: Estimator,
    /// Samples taken here since the last merge was sent.
    unmerged: u64,
    last_merge: Option<Instant>,
    updated_at_ms: i64,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is a few stores: a panic cannot leave it half-done.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Class {
    /// The estimate now.
    pub(crate) fn estimate(&self) -> Estimator {
        guard(&self.state).estimate
    }

    /// Server time of the last merge's write (0 if none).
    pub(crate) fn updated_at_ms(&self) -> i64 {
        guard(&self.state).updated_at_ms
    }

    /// Starts a merge unless one runs or one ran within a second (`force`:
    /// unless one runs): returns the estimate and the unmerged samples to
    /// send.
    pub(crate) fn begin_merge(&self, force: bool) -> Option<(Estimator, u64)> {
        if self.merging.swap(true, Ordering::AcqRel) {
            return None;
        }
        let mut state = guard(&self.state);
        let recent = state
            .last_merge
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1));
        if recent && !force {
            self.merging.store(false, Ordering::Release);
            return None;
        }
        state.last_merge = Some(Instant::now());
        let sent = state.unmerged;
        state.unmerged = 0;
        Some((state.estimate, sent))
    }

    /// A merge answered (`None`: it failed; its samples count as unmerged
    /// again, `sent` of them).
    pub(crate) fn end_merge(&self, shared: Option<Shared>, sent: u64, learning: &Learning) {
        let mut state = guard(&self.state);
        match shared {
            Some(shared) if shared.samples > 0 && shared.updated_at_ms > 0 => {
                let sane = |v: f64| v.is_finite() && v >= 0.0 && v <= millis(learning.max);
                if sane(shared.srtt) && sane(shared.rttvar) {
                    // Samples taken while the merge was on the wire stay
                    // counted for the next one; the estimate becomes the
                    // shared one.
                    state.estimate.srtt = shared.srtt;
                    state.estimate.rttvar = shared.rttvar;
                    state.estimate.samples = shared.samples.max(state.estimate.samples);
                    state.updated_at_ms = shared.updated_at_ms;
                }
            }
            Some(_) => {}
            None => state.unmerged += sent,
        }
        drop(state);
        self.merging.store(false, Ordering::Release);
    }

    /// Learns from one hold; true if a merge is due.
    pub(crate) fn sample(&self, held: Duration, overran: bool, learning: &Learning) -> bool {
        let mut state = guard(&self.state);
        let before = state.estimate.samples;
        state.estimate.sample(millis(held), overran, learning);
        if state.estimate.samples > before {
            state.unmerged += 1;
        }
        state
            .last_merge
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
    }
}

/// A client's classes, by index (a `Lease::Adaptive` carries the index).
#[derive(Debug)]
pub(crate) struct Classes {
    pub(crate) learning: Learning,
    prefix: String,
    list: RwLock<Vec<Arc<Class>>>,
    by_name: Mutex<HashMap<Arc<str>, u32>>,
}

impl Classes {
    pub(crate) fn new(learning: Learning, prefix: &str) -> Self {
        Self {
            learning,
            prefix: prefix.to_owned(),
            list: RwLock::default(),
            by_name: Mutex::default(),
        }
    }

    /// The index of class `name`, registered if new (then `true`: its
    /// shared history should be read).
    pub(crate) fn register(&self, name: &str) -> (u32, bool) {
        let mut by_name = guard(&self.by_name);
        if let Some(&id) = by_name.get(name) {
            return (id, false);
        }
        let name: Arc<str> = name.into();
        let class = Arc::new(Class {
            name: name.clone(),
            keys: Arc::new(LockKeys::lease_history(&self.prefix, &name)),
            state: Mutex::new(ClassState {
                estimate: Estimator::default(),
                unmerged: 0,
                last_merge: None,
                updated_at_ms: 0,
            }),
            merging: AtomicBool::new(false),
        });
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        let id = u32::try_from(list.len()).unwrap_or(u32::MAX);
        list.push(class);
        by_name.insert(name, id);
        (id, true)
    }

    /// Class `id` (registered by this client).
    pub(crate) fn get(&self, id: u32) -> Option<Arc<Class>> {
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
        list.get(id as usize).cloned()
    }

    /// The lease a hold of class `id` gets now, ms.
    pub(crate) fn lease_ms(&self, id: u32) -> u64 {
        match self.get(id) {
            Some(class) => class.estimate().lease_ms(&self.learning),
            None => self.learning.initial.as_millis() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AdaptiveLease;

    fn learning(min_ms: u64, floor_ms: u64) -> Learning {
        AdaptiveLease::default()
            .set_min(Duration::from_millis(min_ms))
            .set_renew_floor(Duration::from_millis(floor_ms))
            .resolve(Duration::from_secs(30), Duration::from_secs(3600))
            .unwrap()
    }

    /// Research adaptive 7: a fixed sequence and every lease it gives.
    #[test]
    fn the_update_rule_is_tcps_and_every_lease_follows_it() {
        let l = learning(250, 50);
        let mut e = Estimator::default();
        assert_eq!(e.lease_ms(&l), 30_000, "untaught: the initial lease");
        let mut leases = Vec::new();
        for s in [100.0, 100.0, 200.0, 50.0] {
            e.sample(s, false, &l);
            leases.push(e.lease_ms(&l));
        }
        // s=100: srtt 100, rttvar 50 → 100 + 200 + 200 = 500.
        // s=100: rttvar 37.5, srtt 100 → 450.
        // s=200: rttvar 53.125, srtt 112.5 → 525.
        // s=50: rttvar 55.46875, srtt 104.6875 → 526.5625 → 527.
        assert_eq!(leases, [500, 450, 525, 527]);
    }

    /// Research adaptive 8: 40–60 ms sections settle the lease within
    /// [250, 400] ms, and 99% of holds end before their renewal point.
    #[test]
    fn steady_sections_settle_a_short_lease() {
        let l = learning(250, 50);
        let mut e = Estimator::default();
        let mut before_renewal = 0;
        let mut seed = 7u64;
        for i in 0..1000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let s = 40.0 + (seed >> 33) as f64 % 21.0;
            let lease = e.lease_ms(&l);
            let renew_at = lease as f64 - (lease as f64 / 3.0).max(50.0);
            if i >= 10 && s < renew_at {
                before_renewal += 1;
            }
            e.sample(s, false, &l);
        }
        let lease = e.lease_ms(&l);
        assert!((250..=400).contains(&lease), "{lease}");
        assert!(before_renewal >= 990 * 99 / 100, "{before_renewal}");
    }

    /// Research adaptive 9: an overrun raises the next lease at once past
    /// 1.5 × its duration, so the same section again needs no renewal.
    #[test]
    fn an_overrun_raises_the_lease_at_once() {
        let l = learning(250, 50);
        let mut e = Estimator::default();
        for _ in 0..50 {
            e.sample(20.0, false, &l);
        }
        assert_eq!(e.lease_ms(&l), 250);
        e.sample(2000.0, true, &l);
        assert!(e.lease_ms(&l) >= 3000, "{}", e.lease_ms(&l));
    }

    /// Research adaptive 10: three 1 ms samples after a hundred of 50 ms
    /// lower the lease by less than 10%.
    #[test]
    fn short_outliers_do_not_collapse_the_lease() {
        let l = learning(250, 50);
        let mut e = Estimator::default();
        for _ in 0..100 {
            e.sample(50.0, false, &l);
        }
        let before = e.lease_ms(&l) as f64;
        for _ in 0..3 {
            e.sample(1.0, false, &l);
        }
        assert!(e.lease_ms(&l) as f64 > 0.9 * before);
    }

    /// Research adaptive 6: a hold longer than `max` teaches nothing.
    #[test]
    fn holds_longer_than_max_teach_nothing() {
        let l = learning(250, 50);
        let mut e = Estimator::default();
        e.sample(40_000.0, true, &l);
        assert_eq!(e, Estimator::default());
    }
}
