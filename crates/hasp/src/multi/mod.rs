//! The top floor: locks that span several Redis deployments.
//!
//! A [`MultiLock`](multi_lock::MultiLock) holds every one of its parts or
//! none; a [`RedLock`](red_lock::RedLock) holds a majority of N independent
//! servers. Both are made of ordinary [`Lock`](crate::lock::Lock)s, one per part,
//! and use only what a lock offers the crate: one try that never queues,
//! a subscription to its releases that takes no place in its queue, the
//! extension of a hold, and the guard's loss signal. Batching, waiting by
//! pub/sub, renewal and cancel safety are the floor's; nothing here talks
//! to Redis.
//!
//! | module | concept |
//! |---|---|
//! | `parts` | trying every part at once, each bounded by a per-server timeout; releasing all; waiting for a part's release |
//! | `holders` | re-entry counted per owner set, client-side |
//! | `fence` | fencing tokens of several parts and their order |
//! | `multi_lock` | all of several locks |
//! | `red_lock` | a majority of independent servers, with validity and extension |

pub(crate) mod fence;
mod holders;
pub(crate) mod multi_lock;
mod parts;
pub(crate) mod red_lock;

use std::time::Duration;

pub(crate) use crate::core::holds::drift;

/// A random delay in `[d/2, d]`: contenders that collided do not retry in
/// step.
pub(crate) fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    let spread = u64::try_from((d - half).as_micros()).unwrap_or(u64::MAX);
    half + Duration::from_micros(fastrand::u64(0..=spread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
        assert_eq!(drift(Duration::from_millis(1)), Duration::from_millis(3));
    }

    #[test]
    fn jitter_stays_in_its_band() {
        let d = Duration::from_millis(200);
        for _ in 0..1000 {
            let j = jitter(d);
            assert!(j >= d / 2 && j <= d, "{j:?}");
        }
    }
}
