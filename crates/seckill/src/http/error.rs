//! The API's one error type: each variant's doc names its status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::store::Refusal;

/// Everything a handler can answer besides success.
#[derive(Debug)]
pub enum ApiError {
    /// 401: no bearer token, or one that does not verify.
    Unauthorized(&'static str),
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
    /// 429: over the per-user or per-IP rate limit (names which).
    RateLimited(&'static str),
    /// 409 (404 for an unknown voucher): the sale refused the purchase.
    Refused(Refusal),
    /// 500: infrastructure failure; logged, never shown to the client.
    Internal(crate::Error),
}

impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> Self {
        match e {
            crate::Error::Invalid { field, reason } => ApiError::BadRequest {
                field: field.to_owned(),
                message: reason,
            },
            other => ApiError::Internal(other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message, field) = match self {
            ApiError::Unauthorized(why) => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                why.to_owned(),
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
                format!("no such {what}"),
                None,
            ),
            ApiError::BadRequest { field, message } => (
                StatusCode::BAD_REQUEST,
                "invalid_request",
                message,
                Some(field),
            ),
            ApiError::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "request body too large".into(),
                None,
            ),
            ApiError::RateLimited(which) => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!("too many requests for this {which}; slow down"),
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
                    Refusal::UnknownVoucher => (
                        StatusCode::NOT_FOUND,
                        "unknown_voucher",
                        "no such voucher on sale",
                    ),
                };
                (status, code, message.to_owned(), None)
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
        let mut body = json!({ "code": code, "message": message });
        if let Some(field) = field {
            body["field"] = json!(field);
        }
        (status, Json(body)).into_response()
    }
}
