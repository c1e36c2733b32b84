//! What the fast path knows of Redis being reachable.
//!
//! Once a purchase found Redis unreachable (connection refused or
//! dropped), every purchase would wait for connection attempts of its own
//! before its 503: seconds each, while the answer is already known. So
//! after such a failure purchases are refused at once (they never reach
//! Redis: certainly not bought), and one purchase at a time, at most one
//! every [`PROBE_INTERVAL`], goes through to find out whether Redis is
//! back. A slow Redis (a timeout) is not "unreachable": it answers late,
//! and purchases keep waiting for it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often, while Redis is unreachable, one purchase tries it.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// Redis' reachability as the last purchases found it.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    down: Mutex<Option<Down>>,
}

#[derive(Debug)]
struct Down {
    /// When the last try (the failure, or a probe) started.
    tried_at: Instant,
    /// A probe is in flight.
    probing: bool,
}

/// Whether a purchase may go to Redis.
#[derive(Debug)]
pub(crate) enum Admission<'a> {
    /// Redis is reachable as far as anyone knows.
    Go,
    /// Redis was unreachable: this purchase is the one that tries it. The
    /// probe is given up if dropped unresolved.
    Probe(Probe<'a>),
    /// Redis was unreachable moments ago, and another purchase tries it.
    Refuse,
}

/// The purchase that tries an unreachable Redis.
#[derive(Debug)]
pub(crate) struct Probe<'a> {
    reachability: &'a Reachability,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if let Some(down) = self.reachability.lock().as_mut() {
            down.probing = false;
        }
    }
}

impl Reachability {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Down>> {
        self.down.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the next purchase may go to Redis.
    pub(crate) fn admit(&self) -> Admission<'_> {
        let mut down = self.lock();
        match down.as_mut() {
            None => Admission::Go,
            Some(d) if !d.probing && d.tried_at.elapsed() >= PROBE_INTERVAL => {
                d.probing = true;
                d.tried_at = Instant::now();
                Admission::Probe(Probe { reachability: self })
            }
            Some(_) => Admission::Refuse,
        }
    }

    /// What a purchase that went to Redis found: reachable or not.
    pub(crate) fn record<T>(&self, result: &redis::RedisResult<T>) {
        let unreachable = result.as_ref().err().is_some_and(|e| {
            (e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped())
                && !e.is_timeout()
        });
        let mut down = self.lock();
        match (unreachable, down.as_mut()) {
            (false, Some(_)) => {
                tracing::info!("Redis is reachable again");
                *down = None;
            }
            (true, None) => {
                tracing::warn!(
                    "Redis is unreachable: purchases are refused at once until it is back"
                );
                *down = Some(Down {
                    tried_at: Instant::now(),
                    probing: false,
                });
            }
            (true, Some(d)) => d.tried_at = Instant::now(),
            (false, None) => {}
        }
    }
}

/// The error of a purchase refused because Redis was unreachable moments
/// ago: a connection error, so the service answers 503 `unavailable`.
pub(crate) fn unreachable() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "Redis was unreachable moments ago (tried again every 200 ms)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> redis::RedisResult<()> {
        Err(unreachable())
    }

    #[test]
    fn after_a_failure_one_probe_at_a_time_goes_through() {
        let r = Reachability::default();
        assert!(matches!(r.admit(), Admission::Go));
        r.record(&refused());
        assert!(matches!(r.admit(), Admission::Refuse));
        std::thread::sleep(PROBE_INTERVAL);
        let probe = r.admit();
        assert!(matches!(probe, Admission::Probe(_)));
        assert!(
            matches!(r.admit(), Admission::Refuse),
            "one probe at a time"
        );
        r.record(&Ok::<_, redis::RedisError>(()));
        drop(probe);
        assert!(matches!(r.admit(), Admission::Go));
    }

    #[test]
    fn a_dropped_probe_lets_the_next_one_try() {
        let r = Reachability::default();
        r.record(&refused());
        std::thread::sleep(PROBE_INTERVAL);
        drop(r.admit());
        std::thread::sleep(PROBE_INTERVAL);
        assert!(matches!(r.admit(), Admission::Probe(_)));
    }
}
