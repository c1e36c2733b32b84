//! Per-user and per-IP rate limits (GCRA, via `governor`), per instance.
//!
//! Limits are kept in this instance's memory: with N instances behind a
//! balancer a client gets up to N times the rate. That bounds abuse without
//! a Redis round trip per request; the flash sale's correctness never
//! depends on them.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::response::{IntoResponse, Response};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::http::error::ApiError;
use crate::http::AppState;

pub use crate::limits::Limit;

/// The limiters of one instance.
#[derive(Debug, Default)]
pub struct RateLimits {
    per_user: Option<DefaultKeyedRateLimiter<i64>>,
    per_ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
}

impl RateLimits {
    /// Limiters for purchases per user and requests per client IP.
    pub fn new(per_user: Option<Limit>, per_ip: Option<Limit>) -> Arc<Self> {
        fn build<K: std::hash::Hash + Eq + Clone>(l: Limit) -> DefaultKeyedRateLimiter<K> {
            RateLimiter::keyed(Quota::per_second(l.per_second).allow_burst(l.burst))
        }
        Arc::new(Self {
            per_user: per_user.map(build),
            per_ip: per_ip.map(build),
        })
    }

    /// No limits (tests, benchmarks of the sale itself).
    pub fn off() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts a purchase of `user`; `Err` if over the limit.
    pub(crate) fn check_user(&self, user: i64) -> Result<(), ApiError> {
        match &self.per_user {
            Some(l) if l.check_key(&user).is_err() => Err(ApiError::RateLimited("user")),
            _ => Ok(()),
        }
    }

    fn check_ip(&self, ip: IpAddr) -> Result<(), ApiError> {
        match &self.per_ip {
            Some(l) if l.check_key(&ip).is_err() => Err(ApiError::RateLimited("ip")),
            _ => Ok(()),
        }
    }
}

/// What refuses a request before it reaches its route (see
/// [`super::edge`]): a `Transfer-Encoding` (see [`transfer_encoding`]),
/// then the per-IP limit, which the probes (`probe`) are spared.
pub(crate) fn refuse_early(state: &AppState, request: &Request, probe: bool) -> Option<Response> {
    if let Some(refused) = transfer_encoding(request) {
        return Some(refused);
    }
    if probe {
        return None;
    }
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())?;
    state
        .limits
        .check_ip(peer)
        .err()
        .map(IntoResponse::into_response)
}

/// The largest body the purchase route takes: it reads none, and a client
/// sending megabytes to it is refused at once, not ignored.
pub(crate) const PURCHASE_BODY_LIMIT: u64 = 1024;

/// A request that carries `Transfer-Encoding` is refused with a 400 naming
/// the header, and its connection closed. Bodies here are small JSON and
/// come with `Content-Length`; and a request with both headers is how
/// requests are smuggled past a proxy that reads the other one (RFC 9112
/// §6.3 lets a server refuse it). The HTTP parser drops a `Content-Length`
/// sent beside `Transfer-Encoding` before any middleware sees it, so the
/// only safe test is the encoding's presence.
fn transfer_encoding(request: &Request) -> Option<Response> {
    if !request
        .headers()
        .contains_key(axum::http::header::TRANSFER_ENCODING)
    {
        return None;
    }
    let mut refused = ApiError::BadRequest {
        field: "transfer-encoding".into(),
        message: "send the body with Content-Length: Transfer-Encoding is not accepted".into(),
    }
    .into_response();
    refused.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    Some(refused)
}
