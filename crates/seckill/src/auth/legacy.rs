//! The service's first token format, accepted only while the
//! `legacy_tokens` setting says so (see the module docs above): bearer
//! tokens HMAC-SHA256 signed, carrying a role, a user id and an expiry.
//!
//! Format: `v1.<role>.<user id>.<expiry, Unix seconds>.<signature>`, where
//! role is `u` (user) or `a` (admin) and the signature is the unpadded
//! base64url HMAC-SHA256 of everything before the last dot.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{Principal, TokenError};

/// Mints and verifies tokens of the first format with one secret.
#[derive(Clone)]
pub(crate) struct LegacyTokens {
    /// The keyed MAC, cloned per use (keying once).
    mac: Hmac<Sha256>,
}

impl LegacyTokens {
    /// Tokens signed with `secret` (its length checked by the caller).
    ///
    /// # Errors
    /// [`Error::Invalid`] if the MAC refuses the key (HMAC takes any).
    pub(crate) fn new(secret: &[u8]) -> crate::Result<Self> {
        let mac = Hmac::<Sha256>::new_from_slice(secret)
            .map_err(|e| crate::Error::invalid("token_secret", e.to_string()))?;
        Ok(Self { mac })
    }

    fn mac(&self, payload: &str) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(payload.as_bytes());
        mac
    }

    /// A token for `who`, valid for `ttl`.
    pub(crate) fn mint(&self, who: Principal, ttl: Duration) -> String {
        let expiry = unix_now().saturating_add(ttl.as_secs());
        let (role, user) = match who {
            Principal::User(id) => ("u", id),
            Principal::Admin => ("a", 0),
        };
        let payload = format!("v1.{role}.{user}.{expiry}");
        let signature = URL_SAFE_NO_PAD.encode(self.mac(&payload).finalize().into_bytes());
        format!("{payload}.{signature}")
    }

    /// Checks `token` and says whom it speaks for.
    ///
    /// # Errors
    /// A [`TokenError`] saying why it was refused.
    pub(crate) fn verify(&self, token: &str) -> Result<Principal, TokenError> {
        let (payload, signature) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Malformed)?;
        // Constant-time comparison.
        self.mac(payload)
            .verify_slice(&signature)
            .map_err(|_| TokenError::BadSignature)?;
        let mut parts = payload.split('.');
        let (Some("v1"), Some(role), Some(user), Some(expiry), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        let user: i64 = user.parse().map_err(|_| TokenError::Malformed)?;
        let expiry: u64 = expiry.parse().map_err(|_| TokenError::Malformed)?;
        if unix_now() >= expiry {
            return Err(TokenError::Expired);
        }
        match role {
            "u" if user > 0 => Ok(Principal::User(user)),
            "a" => Ok(Principal::Admin),
            _ => Err(TokenError::Malformed),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> LegacyTokens {
        LegacyTokens::new(b"0123456789abcdef-test").unwrap()
    }

    #[test]
    fn minted_tokens_verify_to_their_principal() {
        let t = tokens();
        let hour = Duration::from_secs(3600);
        assert_eq!(
            t.verify(&t.mint(Principal::User(42), hour)),
            Ok(Principal::User(42))
        );
        assert_eq!(
            t.verify(&t.mint(Principal::Admin, hour)),
            Ok(Principal::Admin)
        );
    }

    #[test]
    fn tampered_foreign_expired_and_garbage_tokens_are_refused() {
        let t = tokens();
        let good = t.mint(Principal::User(42), Duration::from_secs(3600));
        let tampered = good.replacen(".42.", ".43.", 1);
        assert_eq!(t.verify(&tampered), Err(TokenError::BadSignature));
        let other = LegacyTokens::new(b"another-secret-0123456789").unwrap();
        assert_eq!(other.verify(&good), Err(TokenError::BadSignature));
        assert_eq!(
            t.verify(&t.mint(Principal::User(1), Duration::ZERO)),
            Err(TokenError::Expired)
        );
        for garbage in ["", "abc", "v1.u.1.2", "v1.u.1.2.!!!", "...."] {
            assert!(t.verify(garbage).is_err(), "{garbage:?}");
        }
    }
}
