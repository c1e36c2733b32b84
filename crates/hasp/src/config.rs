//! Client settings and the validation of durations.

use std::time::Duration;

use crate::error::{Error, Result};

/// The longest lease hasp sends: 100 years. Redis refuses an expiry whose
/// end (now + lease) does not fit its signed 64-bit milliseconds, and a
/// refused `PEXPIRE` would leave a lock without any expiry; this bound keeps
/// every lease far inside what Redis accepts, and no real lease near it.
pub const MAX_LEASE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The largest count the functions keep (semaphore permits, a latch's
/// count): 2^48, far inside what a Lua number holds exactly.
pub(crate) const MAX_COUNT: u64 = 1 << 48;

/// The most renewals one script call carries (one batch of the batcher).
const MAX_RENEW_BATCH: usize = 100;

/// Connections a client spreads its lock operations over by default.
const DEFAULT_LANES: usize = 4;
/// The most lanes a client may have.
const MAX_LANES: usize = 64;

/// How a [`Client`](crate::client::Client) behaves. Build with [`Settings::default`]
/// and the `set_*` methods; every value is checked by
/// [`Client::open_with`](crate::client::Client::open_with) before any connection.
#[derive(Debug, Clone)]
pub struct Settings {
    pub(crate) prefix: String,
    pub(crate) watchdog_timeout: Duration,
    pub(crate) renew_batch: usize,
    pub(crate) lanes: usize,
    pub(crate) max_name_len: usize,
    pub(crate) max_lease: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) connection_timeout: Duration,
    pub(crate) replica_ack: Option<ReplicaAck>,
    pub(crate) waiter_ttl: Duration,
    pub(crate) adaptive: AdaptiveLease,
    pub(crate) tls: Option<crate::tls::Tls>,
}

/// How a lock in adaptive mode ([`Lock::with_adaptive_lease`](crate::lock::Lock::with_adaptive_lease))
/// learns its lease (with TCP's retransmission-timer estimator,
/// RFC 6298): each full release of a hold gives a sample `s`, the time it
/// was held (ms, monotonic); the first sets `srtt = s`, `rttvar = s / 2`,
/// each later one `rttvar = (1 − β)·rttvar + β·|srtt − s|`, then
/// `srtt = (1 − α)·srtt + α·s`; the next lease is
/// `clamp(srtt + k·rttvar + margin, min, max)`. A hold that had to be
/// renewed raises the next lease to at least 1.5 × its duration plus the
/// margin at once (the raise then decays at the EWMA rate), so the same
/// long section again needs no renewal. Holds that were lost, dropped
/// without release, or held longer than `max` teach nothing.
///
/// While a hold runs, the client's scheduler renews it (by the class's
/// current lease) only once its remaining lease falls below
/// `max(lease / 3, renew_floor)`: a section shorter than its learned lease
/// costs no renewal at all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveLease {
    initial: Option<Duration>,
    min: Option<Duration>,
    max: Option<Duration>,
    margin: Duration,
    k: f64,
    alpha: f64,
    beta: f64,
    renew_floor: Option<Duration>,
    history_ttl: Duration,
}

impl Default for AdaptiveLease {
    fn default() -> Self {
        Self {
            initial: None,
            min: None,
            max: None,
            margin: Duration::from_millis(200),
            k: 4.0,
            alpha: 1.0 / 8.0,
            beta: 1.0 / 4.0,
            renew_floor: None,
            history_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// [`AdaptiveLease`] with its defaults filled in for one client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Learning {
    pub(crate) initial: Duration,
    pub(crate) min: Duration,
    pub(crate) max: Duration,
    pub(crate) margin: Duration,
    pub(crate) k: f64,
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
    pub(crate) renew_floor: Duration,
    pub(crate) history_ttl: Duration,
}

impl AdaptiveLease {
    /// Lease before anything was learned (default: the watchdog timeout,
    /// so turning the mode on never shortens a lease untaught).
    pub fn set_initial(mut self, lease: Duration) -> Self {
        self.initial = Some(lease);
        self
    }

    /// Shortest learned lease (default 1 s, or the initial lease if
    /// shorter; at least 3 × `renew_floor`).
    pub fn set_min(mut self, lease: Duration) -> Self {
        self.min = Some(lease);
        self
    }

    /// Longest learned lease (default: the watchdog timeout; at most the
    /// client's `max_lease`).
    pub fn set_max(mut self, lease: Duration) -> Self {
        self.max = Some(lease);
        self
    }

    /// Added to every learned lease (default 200 ms).
    pub fn set_margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// Weight of the deviation (default 4, as TCP's).
    pub fn set_k(mut self, k: f64) -> Self {
        self.k = k;
        self
    }

    /// Gains of the averages (defaults 1/8 and 1/4, as TCP's); each in
    /// (0, 1].
    pub fn set_gains(mut self, alpha: f64, beta: f64) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }

    /// The least remaining lease at which a running hold is renewed
    /// (default 300 ms, or a third of `min` if less).
    pub fn set_renew_floor(mut self, floor: Duration) -> Self {
        self.renew_floor = Some(floor);
        self
    }

    /// How long the history shared in Redis lives without a merge (default
    /// 24 h).
    pub fn set_history_ttl(mut self, ttl: Duration) -> Self {
        self.history_ttl = ttl;
        self
    }

    /// The settings with their defaults filled in for a client whose
    /// watchdog timeout is `watchdog`, checked against `max_lease`.
    pub(crate) fn resolve(&self, watchdog: Duration, max_lease: Duration) -> Result<Learning> {
        let initial = self.initial.unwrap_or(watchdog);
        let max = self.max.unwrap_or(initial.max(watchdog));
        let min = self.min.unwrap_or(Duration::from_secs(1).min(initial));
        let renew_floor = self
            .renew_floor
            .unwrap_or(Duration::from_millis(300).min(min / 3));
        let bad = |reason: String| Err(Error::invalid("adaptive_lease", reason));
        if renew_floor.is_zero() || min < renew_floor * 3 {
            return bad(format!(
                "min {min:?} must be at least 3 × renew_floor ({renew_floor:?}), which must be > 0"
            ));
        }
        if min > initial || initial > max {
            return bad(format!(
                "needs min {min:?} <= initial {initial:?} <= max {max:?}"
            ));
        }
        if max > max_lease {
            return bad(format!("max {max:?} exceeds max_lease {max_lease:?}"));
        }
        let gain = |g: f64| g > 0.0 && g <= 1.0;
        if !(gain(self.alpha) && gain(self.beta) && self.k.is_finite() && self.k >= 0.0) {
            return bad("alpha and beta must be in (0, 1], k finite and >= 0".to_owned());
        }
        if self.history_ttl < Duration::from_secs(1) || lease_millis(self.history_ttl).is_none() {
            return bad(format!("history_ttl {:?} is not valid", self.history_ttl));
        }
        Ok(Learning {
            initial,
            min,
            max,
            margin: self.margin,
            k: self.k,
            alpha: self.alpha,
            beta: self.beta,
            renew_floor,
            history_ttl: self.history_ttl,
        })
    }
}

/// Replicas that must confirm each acquisition and renewal (see
/// [`Settings::set_replica_ack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAck {
    /// How many replicas must acknowledge.
    pub replicas: u32,
    /// How long to wait for them (`WAIT`'s timeout).
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            prefix: "hasp".to_owned(),
            watchdog_timeout: Duration::from_secs(30),
            renew_batch: 100,
            lanes: DEFAULT_LANES,
            max_name_len: 1024,
            max_lease: Duration::from_secs(7 * 24 * 3600),
            response_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(5),
            replica_ack: None,
            waiter_ttl: Duration::from_secs(10),
            adaptive: AdaptiveLease::default(),
            tls: None,
        }
    }
}

impl Settings {
    /// Which certificates TLS connections trust and present (see
    /// [`Tls`](crate::tls::Tls)); TLS itself is asked for by a `rediss://`
    /// address. Without it, a `rediss://` server must have a certificate
    /// the system trusts.
    pub fn set_tls(mut self, tls: crate::tls::Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Prefix of every key and channel (default `"hasp"`). It must not
    /// contain `{` or `}`: the hash tag is reserved for the lock name.
    pub fn set_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease of a lock acquired without an explicit lease (default 30 s). The
    /// watchdog renews such locks every third of it while the client lives.
    pub fn set_watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// Most locks renewed per script call by the watchdog (default 100, as
    /// in Redisson; at most 100, the size of one batch). Renewals share the
    /// calls of the client's other lock operations.
    pub fn set_renew_batch(mut self, batch: usize) -> Self {
        self.renew_batch = batch;
        self
    }

    /// Connections (lanes) the client spreads its lock operations over, by
    /// lock name: default 4, at most 64; a Redis Cluster client always has
    /// one (its calls already go out per node). Every operation on one lock takes the
    /// same lane, so each lock's operations stay in order. Each lane batches
    /// its locks' operations into one script call per round trip; several
    /// lanes keep Redis busy while the client handles replies (figures in
    /// the benchmark's README). A client that
    /// holds few locks at once, or must use one connection, can set 1.
    pub fn set_lanes(mut self, lanes: usize) -> Self {
        self.lanes = lanes;
        self
    }

    /// Longest accepted lock name in bytes (default 1024).
    pub fn set_max_name_len(mut self, len: usize) -> Self {
        self.max_name_len = len;
        self
    }

    /// Longest accepted explicit lease (default 7 days; at most
    /// [`MAX_LEASE`], 100 years). Redis accepts absurd expiries; a cap turns
    /// a unit mistake into an error instead of a lock that outlives everyone.
    pub fn set_max_lease(mut self, lease: Duration) -> Self {
        self.max_lease = lease;
        self
    }

    /// How long one Redis call may take before it fails (default 5 s).
    pub fn set_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long establishing a connection may take (default 5 s).
    pub fn set_connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Makes every acquisition, hand-off and renewal wait until `replicas`
    /// replicas have acknowledged it (`WAIT replicas timeout`, sent in the
    /// same pipeline as the script call: one `WAIT` per batch, not per lock).
    /// Off by default.
    ///
    /// An acquisition that fewer replicas confirm within `timeout` is
    /// released again and fails with
    /// [`Error::NotReplicated`]; a renewal that
    /// fewer confirm does not move the hold's belief end, so a holder whose
    /// renewals stop replicating learns of the loss when its last confirmed
    /// lease ends. Releases never wait. A try made for a bounded wait
    /// (`lock_within`) waits for the replicas no longer than the wait has
    /// left, so the wait ends at its bound, not a `timeout` after it (Redis
    /// ends a timed-out `WAIT` at its next timer event: up to 1/`hz` late,
    /// 100 ms at the default `hz 10`).
    ///
    /// What it buys: after the master dies and a replica that acknowledged
    /// is promoted, the lock is still there. What it does not: `WAIT` does
    /// not make Redis strongly consistent — the replica promoted need not be
    /// one that acknowledged, and an acknowledged write is in the replica's
    /// memory, not on its disk. Pair it with `min-replicas-to-write` on the
    /// server and fencing tokens at the resource. Redis 7.2's `WAITAOF` is
    /// not used (this release targets 7.0).
    pub fn set_replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_ack = Some(ReplicaAck { replicas, timeout });
        self
    }

    /// How long a waiter's place in a queue kept in Redis (a semaphore's)
    /// lasts unless its client asks again (default 10 s, at least 30 ms). A
    /// waiting task asks again every third of it, so its place never ends
    /// while it waits; the place of a waiter whose process died ends within
    /// this time, and the waiters behind it move up.
    pub fn set_waiter_ttl(mut self, ttl: Duration) -> Self {
        self.waiter_ttl = ttl;
        self
    }

    /// How locks in adaptive mode learn their lease (see [`AdaptiveLease`]).
    pub fn set_adaptive_lease(mut self, adaptive: AdaptiveLease) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// The configured watchdog timeout.
    pub fn watchdog_timeout(&self) -> Duration {
        self.watchdog_timeout
    }

    /// The configured key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.prefix.is_empty() {
            return Err(Error::invalid("prefix", "must not be empty"));
        }
        if self.prefix.contains(['{', '}']) {
            return Err(Error::invalid(
                "prefix",
                "must not contain '{' or '}' (the hash tag is reserved for the lock name)",
            ));
        }
        if !(1..=MAX_RENEW_BATCH).contains(&self.renew_batch) {
            return Err(Error::invalid(
                "renew_batch",
                format!("{} is not in 1..={MAX_RENEW_BATCH}", self.renew_batch),
            ));
        }
        if !(1..=MAX_LANES).contains(&self.lanes) {
            return Err(Error::invalid(
                "lanes",
                format!("{} is not in 1..={MAX_LANES}", self.lanes),
            ));
        }
        if self.max_name_len == 0 {
            return Err(Error::invalid("max_name_len", "must be at least 1"));
        }
        check_positive_ms("max_lease", self.max_lease)?;
        if self.max_lease > MAX_LEASE {
            return Err(Error::invalid(
                "max_lease",
                format!(
                    "{:?} exceeds {MAX_LEASE:?}, the longest lease hasp sends to Redis",
                    self.max_lease
                ),
            ));
        }
        // The watchdog renews every third of its timeout: below 3 ms that
        // period would be zero.
        if self.watchdog_timeout < Duration::from_millis(3) {
            return Err(Error::invalid(
                "watchdog_timeout",
                format!("{:?} is too short (at least 3 ms)", self.watchdog_timeout),
            ));
        }
        if self.watchdog_timeout > self.max_lease {
            return Err(Error::invalid(
                "watchdog_timeout",
                format!("{:?} exceeds max_lease", self.watchdog_timeout),
            ));
        }
        check_positive_ms("response_timeout", self.response_timeout)?;
        if let Some(ack) = self.replica_ack {
            if ack.replicas == 0 {
                return Err(Error::invalid("replica_ack", "needs at least 1 replica"));
            }
            // WAIT 0 would block forever; past half the lease the hold
            // would be half gone before it is confirmed.
            if ack.timeout.is_zero() || ack.timeout > self.watchdog_timeout / 2 {
                return Err(Error::invalid(
                    "replica_ack",
                    format!(
                        "timeout {:?} must be in 1 ms ..= watchdog_timeout / 2",
                        ack.timeout
                    ),
                ));
            }
        }
        check_positive_ms("connection_timeout", self.connection_timeout)?;
        self.adaptive
            .resolve(self.watchdog_timeout, self.max_lease)?;
        if self.waiter_ttl < Duration::from_millis(30) || self.waiter_ttl > self.max_lease {
            return Err(Error::invalid(
                "waiter_ttl",
                format!("{:?} is not in 30 ms ..= max_lease", self.waiter_ttl),
            ));
        }
        Ok(())
    }

    pub(crate) fn renew_period(&self) -> Duration {
        self.watchdog_timeout / 3
    }
}

fn check_positive_ms(argument: &'static str, d: Duration) -> Result<u64> {
    if d.is_zero() {
        return Err(Error::invalid(argument, "must be greater than zero"));
    }
    lease_millis(d).ok_or_else(|| Error::invalid(argument, format!("{d:?} is too large")))
}

/// Milliseconds for `PEXPIRE`, rounded up so a sub-millisecond lease never
/// becomes 0 (which Redis would take as "delete now"). `None` if it does not
/// fit Redis' signed 64-bit milliseconds.
pub(crate) fn lease_millis(d: Duration) -> Option<u64> {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).ok().filter(|ms| *ms <= i64::MAX as u64)
}

/// Validates an explicit lease against the client's cap; returns milliseconds.
pub(crate) fn validate_lease(settings: &Settings, lease: Duration) -> Result<u64> {
    let ms = check_positive_ms("lease", lease)?;
    if lease > settings.max_lease {
        return Err(Error::invalid(
            "lease",
            format!(
                "{lease:?} exceeds the client's max_lease of {:?}",
                settings.max_lease
            ),
        ));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_millisecond_leases_round_up_never_to_zero() {
        assert_eq!(lease_millis(Duration::from_nanos(1)), Some(1));
        assert_eq!(lease_millis(Duration::from_micros(1500)), Some(2));
        assert_eq!(lease_millis(Duration::from_millis(7)), Some(7));
    }

    #[test]
    fn leases_beyond_redis_range_are_unrepresentable() {
        assert_eq!(lease_millis(Duration::MAX), None);
    }

    #[test]
    fn default_settings_are_valid() {
        Settings::default().validate().unwrap();
    }

    #[test]
    fn braces_in_prefix_are_rejected() {
        let err = Settings::default()
            .set_prefix("a{b")
            .validate()
            .unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidArgument {
                argument: "prefix",
                ..
            }
        ));
    }

    #[test]
    fn a_max_lease_redis_would_refuse_is_rejected() {
        let err = Settings::default()
            .set_max_lease(Duration::from_millis(i64::MAX as u64))
            .validate()
            .unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidArgument {
                argument: "max_lease",
                ..
            }
        ));
        Settings::default()
            .set_max_lease(MAX_LEASE)
            .validate()
            .unwrap();
    }

    #[test]
    fn lease_cap_is_enforced() {
        let s = Settings::default().set_max_lease(Duration::from_secs(10));
        assert!(validate_lease(&s, Duration::from_secs(11)).is_err());
        assert!(validate_lease(&s, Duration::ZERO).is_err());
        assert_eq!(validate_lease(&s, Duration::from_secs(10)).unwrap(), 10_000);
    }
}
