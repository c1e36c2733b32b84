//! Request extractors: bearer authentication and JSON bodies whose errors
//! name the field.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::auth::Principal;
use crate::http::error::ApiError;
use crate::http::room::PASS_HEADER;
use crate::http::AppState;

async fn principal(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let header = parts
        .headers
        .get(AUTHORIZATION)
        .ok_or(ApiError::Unauthorized("missing bearer token"))?;
    let token = header
        .to_str()
        .ok()
        .and_then(|h| {
            // The scheme is case-insensitive (RFC 9110 §11.1).
            let (scheme, token) = h.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim_start())
        })
        .ok_or(ApiError::Unauthorized(
            "expected `Authorization: Bearer <token>`",
        ))?;
    state.tokens.verify(token).await.map_err(ApiError::BadToken)
}

/// The `{id}` segment of a route as an integer; anything else is a 400
/// naming the field `id` (axum's own rejection is plain text).
#[derive(Debug, Clone, Copy)]
pub struct PathId(pub i64);

impl FromRequestParts<AppState> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bad = |message: &str| ApiError::BadRequest {
            field: "id".to_owned(),
            message: message.to_owned(),
        };
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| bad("missing path segment"))?;
        raw.parse()
            .map(PathId)
            .map_err(|_| bad("must be a 64-bit integer"))
    }
}

/// Whoever a valid bearer token speaks for.
#[derive(Debug, Clone, Copy)]
pub struct Bearer(pub Principal);

impl FromRequestParts<AppState> for Bearer {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        principal(parts, state).await.map(Bearer)
    }
}

/// A signed-in buyer.
#[derive(Debug, Clone, Copy)]
pub struct User(pub i64);

impl FromRequestParts<AppState> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match principal(parts, state).await? {
            Principal::User(id) => Ok(User(id)),
            Principal::Admin => Err(ApiError::Forbidden),
        }
    }
}

/// An administrator.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        match principal(parts, state).await? {
            Principal::Admin => Ok(Admin),
            Principal::User(_) => Err(ApiError::Forbidden),
        }
    }
}

/// A JSON body; a malformed one is a 400 naming the field where serde
/// could tell it.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(bad_json(rejection)),
        }
    }
}

fn bad_json(rejection: JsonRejection) -> ApiError {
    if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::PayloadTooLarge;
    }
    // The body did not arrive in time (the server's body timeout).
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&rejection);
    while let Some(e) = cause {
        if e.is::<tower_http::timeout::TimeoutError>() {
            return ApiError::RequestTimeout;
        }
        cause = e.source();
    }
    let message = rejection.body_text();
    // A syntax error inside a string (a lone UTF-16 surrogate escape, say)
    // carries the path of the field being read, as a data error does.
    let field = match rejection {
        JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => field_of(&message),
        _ => None,
    };
    ApiError::BadRequest {
        field: field.unwrap_or("body").to_owned(),
        message,
    }
}

/// The field a serde error is about: axum reports `<path>: <error>` after
/// its own words, serde itself ``missing field `x` ``, ``unknown field
/// `x` `` or ``duplicate field `x` ``.
fn field_of(message: &str) -> Option<&str> {
    let detail = ["target type: ", "body as JSON: "]
        .iter()
        .find_map(|prefix| message.split_once(prefix).map(|(_, d)| d))
        .unwrap_or(message);
    if ["missing field", "unknown field", "duplicate field"]
        .iter()
        .any(|kind| detail.starts_with(kind))
    {
        return detail.split('`').nth(1);
    }
    detail
        .split_once(": ")
        .map(|(path, _)| path)
        .filter(|path| !path.is_empty() && !path.contains(' '))
}

#[cfg(test)]
mod tests {
    use super::field_of;

    #[test]
    fn fields_are_found_in_serde_messages() {
        let t = "Failed to deserialize the JSON body into the target type: ";
        assert_eq!(
            field_of(&format!(
                "{t}stock: invalid type: string \"x\", expected i64"
            )),
            Some("stock")
        );
        assert_eq!(
            field_of(&format!("{t}missing field `title` at line 1 column 2")),
            Some("title")
        );
        assert_eq!(
            field_of(&format!("{t}unknown field `colour`, expected one of")),
            Some("colour")
        );
        assert_eq!(
            field_of(&format!("{t}invalid type: map, expected a string")),
            None
        );
    }
}

/// The client's `Idempotency-Key` header: 1 to 64 characters of
/// `[A-Za-z0-9._-]`; missing or otherwise, a 400 naming the header.
#[derive(Debug, Clone)]
pub struct IdempotencyKey(pub String);

/// The header a payment carries its client-chosen key in.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

impl FromRequestParts<AppState> for IdempotencyKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        let bad = |message: &str| ApiError::BadRequest {
            field: "Idempotency-Key".to_owned(),
            message: message.to_owned(),
        };
        let key = parts
            .headers
            .get(IDEMPOTENCY_KEY)
            .ok_or_else(|| bad("missing: a payment needs a key of the client's choosing"))?
            .to_str()
            .map_err(|_| bad("must be 1 to 64 characters of [A-Za-z0-9._-]"))?;
        let sensible = (1..=64).contains(&key.len())
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !sensible {
            return Err(bad("must be 1 to 64 characters of [A-Za-z0-9._-]"));
        }
        Ok(IdempotencyKey(key.to_owned()))
    }
}

/// The waiting room's pass a purchase carries in its [`PASS_HEADER`], if
/// any: the one header the purchase reads, taken without copying the
/// request's others.
#[derive(Debug, Clone)]
pub struct RoomPass(pub Option<axum::http::HeaderValue>);

impl FromRequestParts<AppState> for RoomPass {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &AppState,
    ) -> Result<Self, std::convert::Infallible> {
        Ok(RoomPass(parts.headers.get(PASS_HEADER).cloned()))
    }
}

/// A route that reads no body: a declared body over
/// [`PURCHASE_BODY_LIMIT`](super::limits::PURCHASE_BODY_LIMIT) bytes is a
/// 413 before anything else is looked at (an extractor, not a layer: a
/// layer costs each request a boxed future).
#[derive(Debug, Clone, Copy)]
pub struct NoBody;

impl FromRequestParts<AppState> for NoBody {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &AppState) -> Result<Self, ApiError> {
        let declared = parts
            .headers
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > super::limits::PURCHASE_BODY_LIMIT) {
            return Err(ApiError::PayloadTooLarge);
        }
        Ok(NoBody)
    }
}
