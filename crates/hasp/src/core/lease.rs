//! Learned leases on the floor: classes registered by the locks that use
//! them, samples taken at each full release, and the merges with the
//! history shared in Redis, in the background (see `adaptive`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::adaptive::{Class, Shared};
use super::holds::HoldState;
use super::wire::lease::LeaseMerge;
use super::wire::{Op, Reply};
use super::Core;
use crate::error::{Error, Result};

/// What a class of adaptive locks has learned, from
/// [`Client::learned_lease`](crate::client::Client::learned_lease).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnedLease {
    /// The smoothed duration of a hold.
    pub srtt: Duration,
    /// The smoothed deviation of it.
    pub rttvar: Duration,
    /// Samples behind the estimate (every client's, as merged).
    pub samples: u64,
    /// The lease the next hold of the class gets.
    pub lease: Duration,
    /// When the shared history was last written (by the server's clock);
    /// `None` if it never was.
    pub updated_at: Option<SystemTime>,
}

impl Core {
    /// The index of class `name` for [`Lease::Adaptive`](super::holds::Lease),
    /// after checking the name; a class new to this client reads the shared
    /// history in the background (holds taken before it answers get the
    /// initial lease).
    pub(crate) fn register_class(&self, name: &str) -> Result<u32> {
        self.check_name(name)?;
        let (id, new) = self.classes.register(name);
        if new {
            if let Some(class) = self.classes.get(id) {
                self.merge_in_background(class, true);
            }
        }
        Ok(id)
    }

    /// Learns from a full release of adaptive hold `hold` (not lost: a lost
    /// hold teaches nothing).
    pub(super) fn learn(&self, class: u32, hold: &HoldState) {
        let Some(class) = self.classes.get(class) else {
            return;
        };
        let overran = hold.renewed.load(std::sync::atomic::Ordering::Acquire);
        let learning = &self.classes.learning;
        if class.sample(hold.acquired_at.elapsed(), overran, learning) {
            self.merge_in_background(class, false);
        }
    }

    fn merge_in_background(&self, class: Arc<Class>, force: bool) {
        let Some((estimate, sent)) = class.begin_merge(force) else {
            return;
        };
        let learning = self.classes.learning;
        let op = self.merge_op(&class, estimate.srtt, estimate.rttvar, sent);
        let name = class.name.clone();
        self.queue.send(
            op,
            Box::new(move |reply| {
                let shared = match reply {
                    Ok(reply) => shared(&reply),
                    Err(e) => {
                        tracing::debug!(error = %e, class = %name, "lease history merge failed");
                        None
                    }
                };
                class.end_merge(shared, sent, &learning);
            }),
        );
    }

    fn merge_op(&self, class: &Class, srtt: f64, rttvar: f64, samples: u64) -> Op {
        let learning = &self.classes.learning;
        Op::Lease(LeaseMerge {
            keys: class.keys.clone(),
            srtt,
            rttvar,
            samples,
            ttl_ms: learning.history_ttl.as_millis() as u64,
            max_ms: learning.max.as_millis() as u64,
        })
    }

    /// What class `name` has learned, after merging this client's samples
    /// with the shared history (one round trip).
    pub(crate) async fn learned(&self, name: &str) -> Result<LearnedLease> {
        let id = self.register_class(name)?;
        let class = self
            .classes
            .get(id)
            .ok_or_else(|| Error::Protocol(format!("class {name:?} is not registered")))?;
        // Send what is unmerged, whether or not a merge ran this second.
        if let Some((estimate, sent)) = class.begin_merge(true) {
            let op = self.merge_op(&class, estimate.srtt, estimate.rttvar, sent);
            let reply = self.call(op).await;
            let shared = reply.as_ref().ok().and_then(shared);
            class.end_merge(shared, sent, &self.classes.learning);
            reply?;
        }
        let estimate = class.estimate();
        let updated_at = u64::try_from(class.updated_at_ms())
            .ok()
            .filter(|ms| *ms > 0)
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        Ok(LearnedLease {
            srtt: Duration::from_secs_f64(estimate.srtt.max(0.0) / 1000.0),
            rttvar: Duration::from_secs_f64(estimate.rttvar.max(0.0) / 1000.0),
            samples: estimate.samples,
            lease: Duration::from_millis(estimate.lease_ms(&self.classes.learning)),
            updated_at,
        })
    }
}

/// The shared history a merge answered (`None`: not a merge's reply).
fn shared(reply: &Reply) -> Option<Shared> {
    match *reply {
        Reply::Learned {
            srtt_us,
            rttvar_us,
            samples,
            updated_at_ms,
        } => Some(Shared {
            srtt: srtt_us as f64 / 1000.0,
            rttvar: rttvar_us as f64 / 1000.0,
            samples: u64::try_from(samples).unwrap_or(0),
            updated_at_ms,
        }),
        _ => None,
    }
}
