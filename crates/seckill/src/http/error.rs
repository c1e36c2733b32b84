//! The API's one error type: each variant's doc names its status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::borrow::Cow;

use serde::Serialize;

use crate::domain::order::OrderState;
use crate::domain::purchase::Refusal;
use crate::payments::PaymentError;

/// Everything a handler can answer besides success.
#[derive(Debug)]
pub enum ApiError {
    /// 401: no bearer token, or one not in the `Bearer` scheme.
    Unauthorized(&'static str),
    /// 401: a bearer token that does not verify, and why.
    BadToken(crate::auth::TokenError),
    /// 403: a valid token without the right (user on an admin route).
    Forbidden,
    /// 404: no such resource.
    NotFound(&'static str),
    /// 400: a malformed request; names the field.
    BadRequest {
        /// The offending field (or `body`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// 413: the body exceeds the size limit.
    PayloadTooLarge,
    /// 408: the body did not arrive within the server's body timeout.
    RequestTimeout,
    /// 429: over the per-user or per-IP rate limit (names which).
    RateLimited(&'static str),
    /// 409 (404 for an unknown voucher): the sale refused the purchase.
    Refused(Refusal),
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 409: the order's state forbids the change (a paid order cannot be
    /// cancelled; a given-back order cannot be paid; a deadline passed; a
    /// used order cannot be refunded; a pending one, not stored yet, with
    /// `Retry-After`).
    OrderConflict(OrderState),
    /// 409: a refund or a redemption of an order not paid.
    NotPaid,
    /// 409: another payment of the order (another key) is under way.
    PaymentUnderWay,
    /// 409: a provider's callback that came before what it answers (the
    /// provider delivers it again).
    EventTooEarly,
    /// 402: the payment provider declined the charge.
    PaymentDeclined(String),
    /// 503 with `Retry-After`: a dependency is down, loading or too slow;
    /// names which. The request may be retried.
    Unavailable(Dependency),
    /// 503 with `Retry-After`: Redis lost this sale's state and it is being
    /// restored from the database; nothing was bought.
    Repairing,
    /// 503 with `Retry-After`: accepted by the Redis primary but not
    /// confirmed by enough replicas in time; the order may stand (check the
    /// order status before buying again).
    NotReplicated,
    /// 403: a waiting-room pass that does not let its bearer buy (forged,
    /// run out, someone else's, another sale's).
    Pass(crate::domain::waiting_room::PassError),
    /// 500: infrastructure failure; logged, never shown to the client.
    Internal(crate::Error),
}

/// What the service depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    /// The Redis deployment (stock, buyers, order stream, locks).
    Redis,
    /// The SQL database.
    Database,
    /// The payment provider.
    Payments,
}

impl Dependency {
    fn name(self) -> &'static str {
        match self {
            Dependency::Redis => "redis",
            Dependency::Database => "database",
            Dependency::Payments => "payments",
        }
    }
}

/// Seconds a client should wait before retrying after a 429 or a 503.
pub(crate) const RETRY_AFTER_SECS: &str = "1";

/// Whether a Redis error means "Redis is not available now" (down,
/// unreachable, loading its data, failing over) rather than a bug: what
/// hasp calls retryable.
fn redis_unavailable(e: &redis::RedisError) -> bool {
    hasp::Error::Redis(e.clone()).is_retryable()
}

/// Whether a database error means "the database is not available now".
fn database_unavailable(e: &sqlx::Error) -> bool {
    crate::db::is_unavailable(e)
}

impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> Self {
        match e {
            crate::Error::Invalid { field, reason } => ApiError::BadRequest {
                field: field.to_owned(),
                message: reason,
            },
            crate::Error::Redis(ref r) if redis_unavailable(r) => {
                ApiError::Unavailable(Dependency::Redis)
            }
            crate::Error::Lock(
                ref l @ (hasp::Error::Redis(_) | hasp::Error::NotReplicated { .. }),
            ) if l.is_retryable() => ApiError::Unavailable(Dependency::Redis),
            crate::Error::SaleUnverified => ApiError::Repairing,
            crate::Error::NotReplicated { .. } => ApiError::NotReplicated,
            crate::Error::Database(ref d) if database_unavailable(d) => {
                ApiError::Unavailable(Dependency::Database)
            }
            crate::Error::TableLock(hasp_sql::Error::Db(ref d)) if database_unavailable(d) => {
                ApiError::Unavailable(Dependency::Database)
            }
            crate::Error::Payment(PaymentError::Declined(why)) => ApiError::PaymentDeclined(why),
            crate::Error::Payment(PaymentError::Unavailable(_)) => {
                ApiError::Unavailable(Dependency::Payments)
            }
            crate::Error::PaymentUnderWay => ApiError::PaymentUnderWay,
            crate::Error::EventTooEarly => ApiError::EventTooEarly,
            crate::Error::Pass(why) => ApiError::Pass(why),
            other => ApiError::Internal(other),
        }
    }
}

/// The JSON shape of every error answer (`field` only where one is at
/// fault), written straight from the borrowed parts: most messages are
/// fixed texts, and a refused purchase is among the most frequent answers.
#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    message: &'a str,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message, field): (_, _, Cow<'static, str>, _) = match self {
            ApiError::Unauthorized(why) => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                why.into(),
                None,
            ),
            ApiError::BadToken(why) => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                why.to_string().into(),
                None,
            ),
            ApiError::Forbidden => (
                StatusCode::FORBIDDEN,
                "forbidden",
                "not allowed for this token".into(),
                None,
            ),
            ApiError::NotFound(what) => (
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no such {what}").into(),
                None,
            ),
            ApiError::BadRequest { field, message } => (
                StatusCode::BAD_REQUEST,
                "invalid_request",
                message.into(),
                Some(field),
            ),
            ApiError::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "request body too large".into(),
                None,
            ),
            ApiError::RequestTimeout => (
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body did not arrive in time".into(),
                None,
            ),
            ApiError::RateLimited(which) => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("too many requests for this {which}; slow down").into(),
                None,
            ),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method".into(),
                None,
            ),
            ApiError::OrderConflict(state) => {
                let (code, message) = match state {
                    OrderState::Paid => ("already_paid", "the order is paid"),
                    OrderState::Used => ("order_used", "the order was redeemed at its shop"),
                    OrderState::Refunding => (
                        "order_refunding",
                        "a refund of the order is under way",
                    ),
                    OrderState::Refunded => ("order_refunded", "the order was refunded"),
                    OrderState::Cancelled => ("order_cancelled", "the order was cancelled"),
                    OrderState::Expired | OrderState::Reserved => (
                        "order_expired",
                        "the order's payment deadline passed; its unit went back on sale",
                    ),
                    OrderState::Pending => (
                        "order_pending",
                        "the order is accepted and on its way to being stored: ask again in a moment",
                    ),
                    OrderState::Failed => (
                        "order_failed",
                        "the order could not be stored; nothing was bought",
                    ),
                };
                (StatusCode::CONFLICT, code, message.into(), None)
            }
            ApiError::PaymentUnderWay => (
                StatusCode::CONFLICT,
                "payment_under_way",
                "another payment of this order is under way: its outcome comes first".into(),
                None,
            ),
            ApiError::EventTooEarly => (
                StatusCode::CONFLICT,
                "event_too_early",
                "the callback came before what it answers: deliver it again later".into(),
                None,
            ),
            ApiError::NotPaid => (
                StatusCode::CONFLICT,
                "order_not_paid",
                "the order is not paid: only a paid order is refunded or redeemed".into(),
                None,
            ),
            ApiError::PaymentDeclined(why) => (
                StatusCode::PAYMENT_REQUIRED,
                "payment_declined",
                format!("the payment was declined: {why}").into(),
                None,
            ),
            ApiError::Unavailable(dependency) => {
                tracing::warn!(dependency = dependency.name(), "dependency unavailable");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("{} is unavailable; retry later", dependency.name()).into(),
                    None,
                )
            }
            ApiError::Repairing => (
                StatusCode::SERVICE_UNAVAILABLE,
                "sale_repairing",
                "the sale's state is being restored after a Redis failure; retry shortly".into(),
                None,
            ),
            ApiError::NotReplicated => (
                StatusCode::SERVICE_UNAVAILABLE,
                "not_replicated",
                "the purchase reached Redis but its replicas did not confirm it in time; it may stand: check your order before retrying".into(),
                None,
            ),
            ApiError::Refused(refusal) => {
                let (status, code, message) = match refusal {
                    Refusal::NotStarted => (
                        StatusCode::CONFLICT,
                        "sale_not_started",
                        "the sale has not started",
                    ),
                    Refusal::Ended => (StatusCode::CONFLICT, "sale_ended", "the sale has ended"),
                    Refusal::SoldOut => (StatusCode::CONFLICT, "sold_out", "sold out"),
                    Refusal::AlreadyBought => (
                        StatusCode::CONFLICT,
                        "already_bought",
                        "one order per user and voucher",
                    ),
                    Refusal::InProgress => (
                        StatusCode::CONFLICT,
                        "purchase_in_progress",
                        "another purchase of yours is being decided; check your order, then retry",
                    ),
                    Refusal::UnknownVoucher => (
                        StatusCode::NOT_FOUND,
                        "unknown_voucher",
                        "no such voucher on sale",
                    ),
                    Refusal::PassRequired => (
                        StatusCode::FORBIDDEN,
                        "pass_required",
                        "this sale has a waiting room: join it, and buy with the pass it gives when your turn comes",
                    ),
                };
                (status, code, message.into(), None)
            }
            ApiError::Pass(why) => {
                use crate::domain::waiting_room::PassError;
                let code = match why {
                    PassError::Forged => "pass_invalid",
                    PassError::Expired => "pass_expired",
                    PassError::NotYours => "pass_not_yours",
                    PassError::OtherSale => "pass_other_sale",
                };
                (StatusCode::FORBIDDEN, code, why.to_string().into(), None)
            }
            ApiError::Internal(e) => {
                tracing::error!(error = %e, error.debug = ?e, "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error".into(),
                    None,
                )
            }
        };
        let body = ErrorBody {
            code,
            field: field.as_deref(),
            message: &message,
        };
        let mut response = (status, Json(body)).into_response();
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) || code == "order_pending"
        {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code an answer can carry is in the OpenAPI document's enum
    /// (and `overloaded`, which the server loop writes itself).
    #[test]
    fn the_openapi_document_lists_every_error_code() {
        let doc: serde_json::Value = serde_json::from_str(crate::http::OPENAPI).unwrap();
        let listed = doc["components"]["schemas"]["Error"]["properties"]["code"]["enum"]
            .as_array()
            .expect("the Error schema's code enum")
            .clone();
        let field = |f: &str| ApiError::BadRequest {
            field: f.into(),
            message: String::new(),
        };
        let every = [
            ApiError::Unauthorized("x"),
            ApiError::Forbidden,
            ApiError::NotFound("x"),
            field("x"),
            ApiError::PayloadTooLarge,
            ApiError::RequestTimeout,
            ApiError::RateLimited("ip"),
            ApiError::MethodNotAllowed,
            ApiError::Unavailable(Dependency::Redis),
            ApiError::Repairing,
            ApiError::NotReplicated,
            ApiError::Internal(crate::Error::Protocol("x".into())),
            ApiError::Refused(Refusal::NotStarted),
            ApiError::Refused(Refusal::Ended),
            ApiError::Refused(Refusal::SoldOut),
            ApiError::Refused(Refusal::AlreadyBought),
            ApiError::Refused(Refusal::UnknownVoucher),
            ApiError::Refused(Refusal::InProgress),
            ApiError::Refused(Refusal::PassRequired),
            ApiError::Pass(crate::domain::waiting_room::PassError::Forged),
            ApiError::Pass(crate::domain::waiting_room::PassError::Expired),
            ApiError::Pass(crate::domain::waiting_room::PassError::NotYours),
            ApiError::Pass(crate::domain::waiting_room::PassError::OtherSale),
            ApiError::OrderConflict(OrderState::Paid),
            ApiError::OrderConflict(OrderState::Cancelled),
            ApiError::OrderConflict(OrderState::Expired),
            ApiError::OrderConflict(OrderState::Reserved),
            ApiError::OrderConflict(OrderState::Pending),
            ApiError::OrderConflict(OrderState::Used),
            ApiError::OrderConflict(OrderState::Refunding),
            ApiError::OrderConflict(OrderState::Refunded),
            ApiError::NotPaid,
            ApiError::PaymentUnderWay,
            ApiError::EventTooEarly,
            ApiError::PaymentDeclined("card".into()),
            ApiError::Unavailable(Dependency::Payments),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for error in every {
            let body = runtime
                .block_on(axum::body::to_bytes(
                    error.into_response().into_body(),
                    1 << 16,
                ))
                .unwrap();
            let code = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["code"].clone();
            assert!(listed.contains(&code), "{code} is not in the OpenAPI enum");
        }
        assert!(listed.contains(&serde_json::json!("overloaded")));
    }

    #[test]
    fn a_redis_that_is_down_or_loading_is_unavailable_not_internal() {
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(
            ApiError::from(crate::Error::Redis(refused)),
            ApiError::Unavailable(Dependency::Redis)
        ));
        let loading = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading),
            "loading",
        ));
        assert!(matches!(
            ApiError::from(crate::Error::Redis(loading)),
            ApiError::Unavailable(Dependency::Redis)
        ));
        let pool = crate::Error::Database(sqlx::Error::PoolTimedOut);
        assert!(matches!(
            ApiError::from(pool),
            ApiError::Unavailable(Dependency::Database)
        ));
        assert!(matches!(
            ApiError::from(crate::Error::SaleUnverified),
            ApiError::Repairing
        ));
        assert!(matches!(
            ApiError::from(crate::Error::NotReplicated {
                acked: 0,
                wanted: 1
            }),
            ApiError::NotReplicated
        ));
        for e in [ApiError::Repairing, ApiError::NotReplicated] {
            let response = e.into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert!(response.headers().contains_key("retry-after"));
        }
        let bug = crate::Error::Protocol("?".into());
        assert!(matches!(ApiError::from(bug), ApiError::Internal(_)));
    }
}
