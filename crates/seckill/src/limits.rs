//! The service's limits as numbers, read from the settings and applied
//! by the HTTP server: connections and their timeouts, request rates.

use std::num::NonZeroU32;
use std::time::Duration;

/// Connection-level limits of the HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once. At the cap the connection idle longest
    /// is closed to make room for a new one; with none idle, a new one is
    /// answered 503 and closed.
    pub max_connections: usize,
    /// Connections open at once from one client IP address; more are
    /// answered 503 and closed. Behind a load balancer or a proxy every
    /// connection comes from its address: set this to `max_connections`.
    pub max_per_address: usize,
    /// Time for a request's head to arrive, counted from the connection's
    /// start or the previous response: also the idle timeout.
    pub header_timeout: Duration,
    /// Time for a request's body to arrive.
    pub body_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// 10,000 connections (the process needs descriptors for Redis, the
    /// database and its files too: keep this below `ulimit -n`), 1,000 of
    /// them from one address, 10 s for a request's head or an idle
    /// connection, 10 s for a body.
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_per_address: 1_000,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
        }
    }
}

/// Requests per second and burst; `None` turns a limit off.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    /// Sustained requests per second.
    pub per_second: NonZeroU32,
    /// Requests allowed at once above the sustained rate.
    pub burst: NonZeroU32,
}

impl Limit {
    /// `per_second` sustained with a burst of twice that; `None` for 0 (off).
    pub fn per_second(per_second: u32) -> Option<Self> {
        let rate = NonZeroU32::new(per_second)?;
        Some(Self {
            per_second: rate,
            burst: rate.saturating_mul(NonZeroU32::MIN.saturating_add(1)),
        })
    }
}
