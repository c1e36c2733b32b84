//! A payment provider over HTTP, which confirms by signed callback.
//!
//! The service speaks a small protocol shaped like the widely used
//! providers' (an adapter maps a real one onto it; `seckill-tools
//! payments` serves it for tests and the demo), with the provider's API
//! key as a bearer token:
//!
//! | request | body | answer |
//! |---|---|---|
//! | `POST /v1/charges` | `{order_id, amount_minor, currency, idempotency_key}` | `{reference}`: asked; a `charge.succeeded` or `charge.failed` callback follows |
//! | `POST /v1/charges/{reference}/void` | none | `{}`: given back (at once) |
//! | `POST /v1/charges/{reference}/refunds` | `{amount_minor, currency, idempotency_key}` | `{}`: asked; a `refund.succeeded` or `refund.failed` callback follows |
//!
//! The same idempotency key answers the same charge or refund, however
//! often it is asked. A 402 is a refusal (asking again is refused again);
//! anything else that is not a success, or no answer within
//! [`REQUEST_TIMEOUT`], leaves the outcome unknown
//! ([`PaymentError::Unavailable`]): the service asks again with the same
//! key.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::json;

use super::{Charge, PaymentError, PaymentFuture, Payments, Receipt, Refund, Settlement};

/// How long one request to the provider may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A provider at an HTTP base URL.
#[derive(Debug, Clone)]
pub struct HttpProvider {
    base: String,
    api_key: SecretString,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct Created {
    reference: String,
}

impl HttpProvider {
    /// The provider at `base` (`http://host:port` or `https://…`, no
    /// trailing slash needed), authenticated by `api_key`.
    ///
    /// # Errors
    /// [`PaymentError::Unavailable`] if no HTTP client can be built.
    pub fn new(base: &str, api_key: SecretString) -> Result<Self, PaymentError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| PaymentError::Unavailable(format!("an HTTP client: {e}")))?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            api_key,
            http,
        })
    }

    /// `POST`s `body` to `path`; the answer's body, if a success.
    async fn post(
        &self,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<String, PaymentError> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(self.api_key.expose_secret());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| PaymentError::Unavailable(format!("the provider: {e}")))?;
        let status = answer.status();
        let text = answer
            .text()
            .await
            .map_err(|e| PaymentError::Unavailable(format!("the provider's answer: {e}")))?;
        if status.is_success() {
            return Ok(text);
        }
        if status == reqwest::StatusCode::PAYMENT_REQUIRED {
            return Err(PaymentError::Declined(text));
        }
        Err(PaymentError::Unavailable(format!(
            "the provider answered {status}: {text}"
        )))
    }
}

impl Payments for HttpProvider {
    fn charge<'a>(&'a self, charge: &'a Charge) -> PaymentFuture<'a, Receipt> {
        Box::pin(async move {
            let body = json!({
                "order_id": charge.order_id.to_string(),
                "amount_minor": charge.amount.minor(),
                "currency": charge.amount.currency().code(),
                "idempotency_key": charge.key,
            });
            let answer = self.post("/v1/charges", Some(body)).await?;
            let created: Created = serde_json::from_str(&answer).map_err(|e| {
                PaymentError::Unavailable(format!("the provider's answer to a charge: {e}"))
            })?;
            Ok(Receipt {
                reference: created.reference,
                amount: charge.amount,
                settlement: Settlement::Later,
            })
        })
    }

    fn confirms_by_callback(&self) -> bool {
        true
    }

    fn void<'a>(&'a self, receipt: &'a Receipt) -> PaymentFuture<'a, ()> {
        Box::pin(async move {
            let path = format!("/v1/charges/{}/void", encode(&receipt.reference));
            self.post(&path, None).await.map(|_| ())
        })
    }

    fn refund<'a>(&'a self, refund: &'a Refund) -> PaymentFuture<'a, Settlement> {
        Box::pin(async move {
            let body = json!({
                "amount_minor": refund.amount.minor(),
                "currency": refund.amount.currency().code(),
                "idempotency_key": refund.key,
            });
            let path = format!("/v1/charges/{}/refunds", encode(&refund.reference));
            self.post(&path, Some(body)).await?;
            Ok(Settlement::Later)
        })
    }
}

/// A reference as one path segment: anything but letters, digits, `-`
/// and `_` percent-encoded.
fn encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
