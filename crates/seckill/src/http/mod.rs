//! The HTTP JSON API.
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /healthz` | anyone | liveness |
//! | `GET /readyz` | anyone | readiness: Redis and the database answer (503 if not) |
//! | `GET /metrics` | anyone | Prometheus metrics |
//! | `GET /openapi.json` | anyone | the OpenAPI 3.0 document of these routes |
//! | `GET /` | anyone | the storefront page |
//! | `GET /admin` | anyone (its data: admin) | the operator console page |
//! | `GET /assets/{file}` | anyone | the pages' script and style sheet |
//! | `GET /api/live` | anyone | the sales and their stock as server-sent events |
//! | `GET /api/admin/live` | admin | the same with the instance's figures and health |
//! | `POST /api/demo/sign-in` | anyone, when enabled on loopback | a token for a user id or the operator (demo only) |
//! | `POST /api/vouchers` | admin | create a voucher and put its stock on sale |
//! | `GET /api/vouchers` | anyone | the newest 100 vouchers with live stock |
//! | `GET /api/vouchers/{id}` | anyone | a voucher with its live remaining stock |
//! | `POST /api/vouchers/{id}/seckill` | user | buy: an order id, or a refusal (`Room-Pass` header: the pass of a sale's waiting room) |
//! | `POST /api/vouchers/{id}/room` | user | join the sale's waiting room (again: the same place) |
//! | `GET /api/vouchers/{id}/room` | user | where the caller stands in it, and their pass once admitted |
//! | `PUT /api/vouchers/{id}/room` | admin | set, change, pause or resume the sale's waiting room |
//! | `DELETE /api/vouchers/{id}/room` | admin | the sale without a waiting room |
//! | `GET /api/vouchers/{id}/order` | user | the caller's order for the voucher and its state |
//! | `GET /api/orders` | user | the caller's stored orders, newest first (100 at most) |
//! | `GET /api/orders/{id}` | user | one stored order of the caller: its state and payment deadline |
//! | `POST /api/orders/{id}/pay` | user | pay a reserved order (`Idempotency-Key` header: the same key pays once) |
//! | `POST /api/orders/{id}/cancel` | user | cancel a reserved order: its unit goes back on sale |

mod error;
mod extract;
mod idle;
mod limits;
mod live;
mod orders;
mod pages;
mod payments;
pub(crate) mod room;
pub(crate) mod server;
mod vouchers;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

pub use error::ApiError;
pub use limits::{Limit, RateLimits};
pub use server::ConnectionLimits;

use crate::auth::Tokens;
use crate::db::Database;

/// What every handler shares: one reference-counted handle. axum clones
/// the state for every middleware and extractor that takes it, so a clone
/// must cost one count, not a copy of each part (the parts are in
/// [`Shared`], reached through `Deref`).
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// The handle to `shared`.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    /// The database.
    pub db: Database,
    /// Purchases, live stock and order status, whichever path decides.
    pub sales: Arc<crate::sale::Sales>,
    /// Payments, cancellations and expiry.
    pub orders: Arc<crate::order_life::OrderLife>,
    /// The payment window of a voucher created without its own.
    pub pay_within: std::time::Duration,
    /// Token verification.
    pub tokens: Tokens,
    /// Rate limits.
    pub limits: Arc<RateLimits>,
    /// Metrics.
    pub metrics: crate::metrics::Metrics,
    /// The live figures the pages watch and voucher reads answer from.
    pub live: Arc<crate::live::Live>,
    /// Whether `POST /api/demo/sign-in` hands out tokens (a loopback demo
    /// only; see [`Settings::demo_sign_in`](crate::settings::Settings::demo_sign_in)).
    pub demo_sign_in: bool,
    /// How the payment provider's callbacks are checked (`None`: the
    /// stand-in, which sends none; every callback is then a 401).
    pub webhook: Option<Webhook>,
    /// The sales' waiting rooms.
    pub rooms: Arc<crate::waiting_room::WaitingRooms>,
}

/// What checks a payment provider's callbacks.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// The secret they are signed with.
    pub secret: secrecy::SecretString,
    /// How far their signing time may be from now.
    pub tolerance: std::time::Duration,
}

/// The API's OpenAPI document (kept beside the routes; a test checks that
/// both list the same paths).
pub const OPENAPI: &str = include_str!("openapi.json");

/// Request bodies above this are refused (413) before parsing (the
/// purchase route, which reads none, takes at most 1 KiB).
const BODY_LIMIT: usize = 16 * 1024;

/// The routes every request may take without the per-IP limit: the probes.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// The API's router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route(
            "/openapi.json",
            get(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    OPENAPI,
                )
            }),
        )
        .route(
            "/metrics",
            get(|State(state): State<AppState>| async move { state.metrics.render() }),
        )
        .route("/", get(pages::storefront))
        .route("/admin", get(pages::console))
        .route("/assets/{file}", get(pages::asset))
        .route("/api/live", get(live::storefront))
        .route("/api/admin/live", get(live::console))
        .route("/api/demo/sign-in", post(pages::demo_sign_in))
        .route("/api/me", get(pages::me))
        .route("/api/vouchers", post(vouchers::create).get(vouchers::list))
        .route("/api/vouchers/{id}", get(vouchers::show))
        .route("/api/vouchers/{id}/seckill", post(vouchers::purchase))
        .route(
            "/api/vouchers/{id}/room",
            post(room::join)
                .get(room::standing)
                .put(room::set)
                .delete(room::remove),
        )
        .route("/api/vouchers/{id}/order", get(orders::for_voucher))
        .route("/api/orders", get(orders::mine))
        .route("/api/orders/{id}", get(orders::show))
        .route("/api/orders/{id}/pay", post(orders::pay))
        .route("/api/orders/{id}/cancel", post(orders::cancel))
        .route("/api/orders/{id}/refund", post(orders::refund))
        .route("/api/redemptions", post(orders::redeem))
        .route("/api/payments/events", post(payments::event))
        // Every answer is the JSON error shape, unknown routes and methods
        // included (axum's defaults are an empty 404 and 405).
        .fallback(|| async { error::ApiError::NotFound("route") })
        .method_not_allowed_fallback(|| async { error::ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(state.clone(), edge))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// What every answer says to a browser: the pages' script, style sheet and
/// icon come from this origin only, and nothing inline runs (a title that
/// slipped into the page as markup could not run a script); no page may be
/// framed (clickjacking of Buy or of the console); a body is read as the
/// type it is sent as; no address is passed on to another site.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
    base-uri 'none'; frame-ancestors 'none'";

/// Sets the headers of [`CONTENT_SECURITY_POLICY`]'s paragraph on an
/// answer that does not set them itself.
fn security_headers(headers: &mut axum::http::HeaderMap) {
    use axum::http::header::{
        CONTENT_SECURITY_POLICY as CSP, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
    };
    for (name, value) in [
        (CSP, CONTENT_SECURITY_POLICY),
        (X_FRAME_OPTIONS, "DENY"),
        (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (REFERRER_POLICY, "no-referrer"),
    ] {
        headers
            .entry(name)
            .or_insert(axum::http::HeaderValue::from_static(value));
    }
}

/// How long `/readyz` waits for each dependency: a readiness probe (with a
/// timeout of 1–5 s) must get a 503, not a timeout of its own, when one
/// hangs.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

async fn ready(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let check = |f| async move {
        match tokio::time::timeout(READY_TIMEOUT, f).await {
            Ok(Ok(())) => "ok",
            Ok(Err(_)) => "unreachable",
            Err(_) => "timeout",
        }
    };
    let (redis, db) = tokio::join!(
        check(Box::pin(state.sales.ping_redis()) as BoxedCheck<'_>),
        check(Box::pin(state.db.ping()) as BoxedCheck<'_>)
    );
    let body = axum::Json(serde_json::json!({ "redis": redis, "database": db }));
    if redis == "ok" && db == "ok" {
        (axum::http::StatusCode::OK, body).into_response()
    } else {
        // As every other 503 of the service: when to ask again.
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, error::RETRY_AFTER_SECS)],
            body,
        )
            .into_response()
    }
}

type BoxedCheck<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = crate::Result<()>> + Send + 'a>>;

/// The header carrying a request's id, taken from the client when it sends
/// a sensible one (a load balancer's), else made here; echoed in the answer
/// and recorded on the request's span, so a logged error can be traced to
/// its request.
pub const REQUEST_ID: &str = "x-request-id";

/// A client's request id, if it is 1 to 64 characters of `[A-Za-z0-9._-]`.
fn client_request_id(request: &Request) -> Option<axum::http::HeaderValue> {
    let value = request.headers().get(REQUEST_ID)?;
    let id = value.as_bytes();
    let sensible = (1..=64).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(b));
    sensible.then(|| value.clone())
}

/// A new request id: a random UUID (version 4). Ids only need to be told
/// apart in the logs, so they come from the thread's fast generator, not a
/// system call each.
fn new_request_id() -> axum::http::HeaderValue {
    let uuid = uuid::Builder::from_random_bytes(fastrand::u128(..).to_le_bytes()).into_uuid();
    let mut text = uuid::Uuid::encode_buffer();
    let text = uuid.hyphenated().encode_lower(&mut text);
    // Hex digits and hyphens are always a valid value.
    axum::http::HeaderValue::from_str(text)
        .unwrap_or_else(|_| axum::http::HeaderValue::from_static("unknown"))
}

/// Every request's way in and its answer's way out, in one middleware:
/// each `from_fn` layer costs every request a boxed future and a clone of
/// the routes behind it, and the purchase is answered in tens of
/// microseconds. In order:
///
/// * the request runs in a span (request id, method, route), and is
///   counted by route (the pattern, not the raw path) and outcome (`ok`,
///   or the status) and timed;
/// * one carrying `Transfer-Encoding` is refused, and one over its
///   client's per-IP limit (the probes excepted): [`limits::refuse_early`];
/// * every answer carries the browser security headers
///   ([`CONTENT_SECURITY_POLICY`]) and the request id.
///
/// It allocates nothing of its own beyond the id it makes when the client
/// sent none.
async fn edge(State(state): State<AppState>, request: Request, next: Next) -> Response {
    use tracing::Instrument;
    let route = request.extensions().get::<MatchedPath>().cloned();
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let id = client_request_id(&request).unwrap_or_else(new_request_id);
    let span = tracing::info_span!(
        "request",
        // Both kinds of id are ASCII: checked above, or a UUID.
        id = id.to_str().unwrap_or_default(),
        method = %request.method(),
        route = route,
    );
    let started = std::time::Instant::now();
    let probe = PROBES.contains(&route);
    let mut response = match limits::refuse_early(&state, &request, probe) {
        Some(refused) => refused,
        None => next.run(request).instrument(span).await,
    };
    security_headers(response.headers_mut());
    response.headers_mut().insert(REQUEST_ID, id);
    let status = response.status();
    let outcome = if status.is_success() {
        "ok"
    } else {
        status.as_str()
    };
    state
        .metrics
        .requests
        .with_label_values(&[route, outcome])
        .inc();
    state
        .metrics
        .latency
        .with_label_values(&[route])
        .observe(started.elapsed().as_secs_f64());
    response
}
