//! The payment provider's callbacks: `POST /api/payments/events`.

use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use secrecy::ExposeSecret;
use serde_json::{json, Value};

use crate::http::error::ApiError;
use crate::http::AppState;
use crate::payments::events::{self, Event, SIGNATURE_HEADER};

/// Takes a provider's callback: its signature checked (within the replay
/// window), then applied once per event id. 200 with what was done (also
/// for an event applied before, or one refused and recorded); 401 for a
/// signature that does not hold; 409 `event_too_early` for a refund's
/// callback that came before the refund it answers (the provider delivers
/// it again); 401 for every callback while the service runs its stand-in,
/// which sends none.
#[tracing::instrument(name = "payment_event", skip_all, fields(event))]
pub(crate) async fn event(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    // Without a provider no callback can be verified: each is refused as
    // unsigned would be.
    let Some(webhook) = &state.webhook else {
        return Err(ApiError::Unauthorized(
            "this service runs the payment stand-in: it takes no callbacks",
        ));
    };
    let signature = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    let secret = webhook.secret.expose_secret().as_bytes();
    if let Err(why) = events::verify(
        secret,
        signature,
        &body,
        SystemTime::now(),
        webhook.tolerance,
    ) {
        tracing::warn!(error = %why, "a payment callback refused");
        return Err(ApiError::Unauthorized(match why {
            events::SignatureError::Missing => "the callback's signature is missing or unreadable",
            events::SignatureError::Oversized => {
                "the callback's signature header is too long or carries too many signatures"
            }
            events::SignatureError::Stale(_) => "the callback was signed outside the replay window",
            events::SignatureError::Mismatch => "the callback's signature does not match",
        }));
    }
    let event: Event = serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest {
        field: "body".into(),
        message: format!("not a payment event: {e}"),
    })?;
    tracing::Span::current().record("event", event.id.as_str());
    for (field, value, most) in [
        ("id", &event.id, 100),
        ("reference", &event.reference, 200),
        ("currency", &event.currency, 3),
    ] {
        if value.is_empty() || value.len() > most {
            return Err(ApiError::BadRequest {
                field: field.into(),
                message: format!("must be 1 to {most} bytes"),
            });
        }
    }
    let outcome = state.orders.apply_event(&event).await?;
    Ok(Json(json!({ "outcome": outcome.as_stored() })))
}
