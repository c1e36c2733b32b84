//! A payment provider's callbacks: what they say, and how the service
//! knows the provider sent them.
//!
//! A callback is a JSON [`Event`] in the body of a `POST`, signed the way
//! the widely used providers sign theirs: the header
//! [`SIGNATURE_HEADER`] carries `t=<Unix seconds>,v1=<hex HMAC-SHA256>`,
//! the MAC over `"<t>.<body>"` with the secret the service and the
//! provider share. The service takes a callback only if one `v1` matches
//! (compared in constant time; several are allowed while a secret is
//! rotated) and `t` is within the replay window of its own clock, so a
//! callback overheard and sent again later is refused. Each event's `id`
//! is applied once (the service records it).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The header that carries a callback's signature.
pub const SIGNATURE_HEADER: &str = "Payment-Signature";

/// How far a callback's timestamp may be from the service's clock, unless
/// set otherwise.
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// The longest signature header taken: a timestamp and a few signatures
/// (a rotation signs with two secrets) fit many times over.
pub const MAX_SIGNATURE_HEADER: usize = 1024;

/// The most `v1` signatures one header may carry.
pub const MAX_SIGNATURES: usize = 4;

/// Why a callback was not taken as the provider's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No signature header, or one that does not parse.
    #[error("the callback has no readable {SIGNATURE_HEADER} header")]
    Missing,
    /// A header longer than [`MAX_SIGNATURE_HEADER`] or with more than
    /// [`MAX_SIGNATURES`] signatures: refused before any MAC is computed,
    /// so an unsigned caller cannot make the service hash its body over
    /// and over.
    #[error("the callback's {SIGNATURE_HEADER} header is too long or carries too many signatures")]
    Oversized,
    /// Signed outside the replay window.
    #[error("the callback was signed {0} s away from now: outside the replay window")]
    Stale(u64),
    /// No signature matches the body with the shared secret.
    #[error("the callback's signature does not match")]
    Mismatch,
}

/// What happened at the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A charge went through: the order may be marked paid.
    #[serde(rename = "charge.succeeded")]
    ChargeSucceeded,
    /// A charge was declined: the buyer may pay again.
    #[serde(rename = "charge.failed")]
    ChargeFailed,
    /// A refund went through.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    /// A refund was declined: the order stays paid.
    #[serde(rename = "refund.failed")]
    RefundFailed,
}

/// A provider's callback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The event's id at the provider: applied once.
    pub id: String,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// The charge it is about (a refund's event names the charge it
    /// refunds).
    pub reference: String,
    /// The order, as a string (it exceeds JavaScript's safe integers).
    pub order_id: String,
    /// The amount, in minor units.
    pub amount_minor: i64,
    /// Its ISO 4217 currency.
    pub currency: String,
}

/// The signature header of `body` signed with `secret` at `at`.
pub fn sign(secret: &[u8], at: SystemTime, body: &[u8]) -> String {
    let t = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mac = mac(secret, t, body).map(|m| m.finalize().into_bytes().to_vec());
    format!("t={t},v1={}", hex(&mac.unwrap_or_default()))
}

/// Checks that `header` signs `body` with `secret`, within `tolerance` of
/// `now`.
///
/// # Errors
/// [`SignatureError`] saying why not.
pub fn verify(
    secret: &[u8],
    header: Option<&str>,
    body: &[u8],
    now: SystemTime,
    tolerance: Duration,
) -> Result<(), SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    if header.len() > MAX_SIGNATURE_HEADER {
        return Err(SignatureError::Oversized);
    }
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<u64>().ok(),
            Some(("v1", v)) => {
                if signatures.len() == MAX_SIGNATURES {
                    return Err(SignatureError::Oversized);
                }
                signatures.extend(unhex(v));
            }
            _ => {}
        }
    }
    let (Some(t), false) = (timestamp, signatures.is_empty()) else {
        return Err(SignatureError::Missing);
    };
    let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let skew = now.abs_diff(t);
    if skew > tolerance.as_secs() {
        return Err(SignatureError::Stale(skew));
    }
    // One MAC over the body, whatever the number of signatures, each
    // compared in constant time: a forger learns nothing from how long it
    // took.
    let expected = mac(secret, t, body)
        .ok_or(SignatureError::Mismatch)?
        .finalize()
        .into_bytes();
    let matches = signatures
        .iter()
        .any(|signature| bool::from(expected[..].ct_eq(signature)));
    if matches {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The MAC of `"<t>.<body>"` (HMAC takes a key of any length: `None`
/// never happens).
fn mac(secret: &[u8], t: u64, body: &[u8]) -> Option<Hmac<Sha256>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).ok()?;
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(mac)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"whsec-test";

    /// A header with more signatures than a rotation needs, or longer than
    /// any honest one, is refused before a MAC is computed; one with as
    /// many as allowed is still checked, and the right one among them
    /// taken.
    #[test]
    fn a_header_stuffed_with_signatures_is_refused_unread() {
        let now = SystemTime::now();
        let body = br#"{"id":"evt_1"}"#;
        let good = sign(SECRET, now, body);
        let t = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let junk = format!(",v1={}", "00".repeat(32));
        let stuffed = format!("t={t}{}", junk.repeat(4_000));
        let tolerance = DEFAULT_TOLERANCE;
        assert_eq!(
            verify(SECRET, Some(&stuffed), body, now, tolerance),
            Err(SignatureError::Oversized)
        );
        let five = format!("t={t}{}", junk.repeat(MAX_SIGNATURES + 1));
        assert!(five.len() <= MAX_SIGNATURE_HEADER);
        assert_eq!(
            verify(SECRET, Some(&five), body, now, tolerance),
            Err(SignatureError::Oversized)
        );
        let v1 = good.split_once(",v1=").unwrap().1;
        let last_of_four = format!("t={t}{},v1={v1}", junk.repeat(MAX_SIGNATURES - 1));
        assert_eq!(
            verify(SECRET, Some(&last_of_four), body, now, tolerance),
            Ok(())
        );
    }

    #[test]
    fn a_signed_callback_is_taken_and_anything_else_is_not() {
        let now = SystemTime::now();
        let body = br#"{"id":"evt_1"}"#;
        let header = sign(SECRET, now, body);
        let tolerance = DEFAULT_TOLERANCE;
        assert_eq!(verify(SECRET, Some(&header), body, now, tolerance), Ok(()));
        // Another body, another secret, a forged MAC: refused.
        let other = br#"{"id":"evt_2"}"#;
        assert_eq!(
            verify(SECRET, Some(&header), other, now, tolerance),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"other", Some(&header), body, now, tolerance),
            Err(SignatureError::Mismatch)
        );
        let t = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let forged = format!("t={t},v1={}", "00".repeat(32));
        assert_eq!(
            verify(SECRET, Some(&forged), body, now, tolerance),
            Err(SignatureError::Mismatch)
        );
        // Replayed after the window, or signed in the future.
        let old = sign(SECRET, now - Duration::from_secs(301), body);
        assert!(matches!(
            verify(SECRET, Some(&old), body, now, tolerance),
            Err(SignatureError::Stale(301))
        ));
        let ahead = sign(SECRET, now + Duration::from_secs(600), body);
        assert!(matches!(
            verify(SECRET, Some(&ahead), body, now, tolerance),
            Err(SignatureError::Stale(_))
        ));
        // Missing or unreadable headers.
        for bad in [
            None,
            Some(""),
            Some("t=1"),
            Some("v1=00"),
            Some("t=x,v1=zz"),
        ] {
            assert_eq!(
                verify(SECRET, bad, body, now, tolerance),
                Err(SignatureError::Missing),
                "{bad:?}"
            );
        }
        // While a secret rotates, either signature is taken.
        let rotated = format!("{},v1={}", header, "ab".repeat(32));
        assert_eq!(verify(SECRET, Some(&rotated), body, now, tolerance), Ok(()));
    }

    #[test]
    fn events_read_as_providers_write_them() {
        let event: Event = serde_json::from_str(
            r#"{"id":"evt_9","type":"refund.succeeded","reference":"ch_1",
                "order_id":"42","amount_minor":1990,"currency":"CNY"}"#,
        )
        .unwrap();
        assert_eq!(event.kind, EventKind::RefundSucceeded);
        assert!(serde_json::from_str::<Event>(r#"{"id":"e","type":"charge.maybe"}"#).is_err());
    }
}
