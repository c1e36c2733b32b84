//! Bearer tokens: JSON Web Tokens (RFC 7519), stateless, so every
//! instance verifies any token on its own.
//!
//! Two kinds are taken:
//!
//! * **An identity provider's**, signed RS256, ES256 or EdDSA with a key of
//!   its published key set (`jwks`: a JWKS file, or a URL fetched and
//!   refreshed, [`keys`]). The token must name the key (`kid`), and the
//!   algorithm must be the one the key's type fixes, so a public key never
//!   serves as an HMAC secret; its issuer and audience must be the ones the
//!   settings name; `exp` is required, and `exp` and `nbf` are judged with
//!   a small leeway for clocks.
//! * **The service's own**, signed HS256 with the shared `token_secret`,
//!   issuer and audience `seckill`: what `seckill token`, the demo sign-in
//!   and the tools mint. No secret set, none is taken (a deployment that
//!   signs in through its identity provider alone leaves it unset).
//!
//! The user id is the claim the settings name (`sub` by default): a
//! number, or any other string, which becomes a stable id of its own (the
//! first 63 bits of SHA-256 over the issuer and the value), so users of an
//! identity provider whose subjects are not numbers buy as themselves. The
//! operator is a token whose role claim (`roles` by default: a string or an
//! array, a dotted path for a nested claim such as Keycloak's
//! `realm_access.roles`) holds the operator role (`seckill-admin` by
//! default).
//!
//! The service's first format (`v1.<role>.<user>.<expiry>.<hmac>`,
//! [`legacy`]) is refused unless `legacy_tokens` is on, which is meant for
//! the change-over only: it goes in the next release.

mod keys;
mod legacy;
mod verified;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
pub use keys::JwksSource;
use keys::KeySet;
use legacy::LegacyTokens;

/// Who a verified token speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal {
    /// A buyer.
    User(i64),
    /// An administrator (creates vouchers).
    Admin,
}

/// Why a token was refused (each a 401 saying so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a token: not a JWT (nor, with `legacy_tokens`, the first
    /// format), or a header or claim that does not parse.
    #[error("malformed token")]
    Malformed,
    /// The signature does not match: forged, or signed with another key.
    #[error("bad token signature")]
    BadSignature,
    /// Past its expiry (`exp`), or without one.
    #[error("token expired")]
    Expired,
    /// Before its start (`nbf`).
    #[error("token not valid yet")]
    NotYetValid,
    /// Issued by another issuer than the one the settings name.
    #[error("token from another issuer")]
    WrongIssuer,
    /// Meant for another audience than the one the settings name.
    #[error("token for another audience")]
    WrongAudience,
    /// Signed with a key the key set does not hold, or without naming one.
    #[error("token signed with an unknown key")]
    UnknownKey,
    /// An algorithm not taken here (`none`, a symmetric one for a key of
    /// the identity provider, or the service's own without a secret).
    #[error("token algorithm not accepted")]
    Algorithm,
    /// No user id in the claim the settings name.
    #[error("token names no user")]
    NoUser,
    /// The service's first format, while `legacy_tokens` is off.
    #[error("token of the old format (v1), no longer accepted")]
    Legacy,
}

/// What the service accepts as an identity provider's token (see the module
/// docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// Where its public keys are.
    pub jwks: JwksSource,
    /// The `iss` its tokens must carry.
    pub issuer: String,
    /// The `aud` its tokens must carry (one of them).
    pub audience: String,
    /// How often its key set is loaded again.
    pub refresh: Duration,
}

/// How tokens are verified and whom they name (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPolicy {
    /// The identity provider whose tokens are taken, if any.
    pub provider: Option<Provider>,
    /// Leeway for `exp` and `nbf`, for the clocks of other machines.
    pub leeway: Duration,
    /// The claim holding the user id.
    pub user_claim: String,
    /// The claim holding the roles (a dotted path for a nested one).
    pub role_claim: String,
    /// The role that makes a token the operator's.
    pub admin_role: String,
    /// Whether the first format is still taken.
    pub legacy: bool,
}

impl Default for TokenPolicy {
    /// The service's own tokens only; `sub` and `roles`, operator role
    /// `seckill-admin`, 30 s leeway, the first format refused.
    fn default() -> Self {
        Self {
            provider: None,
            leeway: Duration::from_secs(30),
            user_claim: "sub".into(),
            role_claim: "roles".into(),
            admin_role: ADMIN_ROLE.into(),
            legacy: false,
        }
    }
}

/// The operator role of the service's own tokens.
pub const ADMIN_ROLE: &str = "seckill-admin";

/// The issuer of the service's own tokens.
pub const LOCAL_ISSUER: &str = "seckill";

/// A key to sign the service's own development tokens with, other than the
/// shared secret: a PKCS#8 PEM private key of P-256 (ES256) or Ed25519
/// (EdDSA), under a key id an identity provider's key set can name.
pub struct SigningKey {
    algorithm: Algorithm,
    key: EncodingKey,
    kid: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("algorithm", &self.algorithm)
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The key in `pem` (PKCS#8), named `kid`.
    ///
    /// # Errors
    /// [`Error::Invalid`] if it is neither a P-256 nor an Ed25519 key.
    pub fn from_pem(pem: &[u8], kid: impl Into<String>) -> Result<Self> {
        let (algorithm, key) = if let Ok(key) = EncodingKey::from_ec_pem(pem) {
            (Algorithm::ES256, key)
        } else if let Ok(key) = EncodingKey::from_ed_pem(pem) {
            (Algorithm::EdDSA, key)
        } else {
            return Err(Error::invalid(
                "signing_key",
                "not a PKCS#8 PEM P-256 or Ed25519 private key",
            ));
        };
        Ok(Self {
            algorithm,
            key,
            kid: kid.into(),
        })
    }

    /// A token for `who`, valid for `ttl`, from `issuer` for `audience`.
    ///
    /// # Errors
    /// [`Error::Invalid`] if the key cannot sign.
    pub fn mint(
        &self,
        who: Principal,
        ttl: Duration,
        issuer: &str,
        audience: &str,
    ) -> Result<String> {
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, &claims(who, ttl, issuer, audience), &self.key)
            .map_err(|e| Error::invalid("signing_key", e.to_string()))
    }
}

fn claims(who: Principal, ttl: Duration, issuer: &str, audience: &str) -> Value {
    let now = unix_now();
    let (sub, roles) = match who {
        Principal::User(id) => (id.to_string(), vec![]),
        Principal::Admin => ("0".to_owned(), vec![ADMIN_ROLE]),
    };
    json!({
        "iss": issuer,
        "aud": audience,
        "sub": sub,
        "roles": roles,
        "iat": now,
        "exp": now.saturating_add(ttl.as_secs()),
    })
}

/// The service's own key: HS256 with the shared secret.
#[derive(Clone)]
struct Local {
    encoding: EncodingKey,
    decoding: DecodingKey,
    legacy: LegacyTokens,
}

/// Mints the service's own tokens and verifies every kind it takes (see
/// the module docs).
#[derive(Clone)]
pub struct Tokens {
    local: Option<Local>,
    provider: Option<(std::sync::Arc<KeySet>, Provider)>,
    policy: TokenPolicy,
    /// What a token's claims are checked against, made once from the
    /// policy: building it (sets of issuers, audiences, required claims)
    /// would otherwise cost a dozen allocations per request.
    checks: Checks,
    /// Tokens verified lately (shared by the clones).
    verified: std::sync::Arc<verified::Verified>,
}

/// The claim checks of each kind of token [`Tokens`] takes.
#[derive(Clone)]
struct Checks {
    /// The service's own (HS256, issuer and audience `seckill`).
    local: Validation,
    /// An identity provider's, one per algorithm its keys may use.
    provider: Vec<(Algorithm, Validation)>,
}

impl Checks {
    fn new(policy: &TokenPolicy) -> Self {
        let check = |algorithm, issuer: &str, audience: &str| {
            let mut validation = Validation::new(algorithm);
            validation.leeway = policy.leeway.as_secs();
            validation.validate_nbf = true;
            validation.set_required_spec_claims(&["exp", "iss", "aud"]);
            validation.set_issuer(&[issuer]);
            validation.set_audience(&[audience]);
            validation
        };
        Self {
            local: check(Algorithm::HS256, LOCAL_ISSUER, LOCAL_ISSUER),
            provider: policy.provider.as_ref().map_or_else(Vec::new, |p| {
                [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA]
                    .into_iter()
                    .map(|a| (a, check(a, &p.issuer, &p.audience)))
                    .collect()
            }),
        }
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("local", &self.local.as_ref().map(|_| "<redacted>"))
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// The service's own tokens, signed with `secret` (at least 16
    /// bytes), and nothing else.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a short secret.
    pub fn new(secret: &[u8]) -> Result<Self> {
        let policy = TokenPolicy::default();
        Ok(Self {
            local: Some(local(secret)?),
            provider: None,
            checks: Checks::new(&policy),
            verified: std::sync::Arc::new(verified::Verified::new()),
            policy,
        })
    }

    /// Tokens as `policy` says: the service's own with `secret` if given,
    /// an identity provider's if the policy names one (its key set loaded
    /// now).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a short secret, neither a secret nor a
    /// provider, or a key set that cannot be loaded.
    pub async fn open(secret: Option<&[u8]>, policy: TokenPolicy) -> Result<Self> {
        let local = secret.map(local).transpose()?;
        let provider = match &policy.provider {
            Some(provider) => {
                let keys = KeySet::load(provider.jwks.clone(), provider.refresh).await?;
                Some((std::sync::Arc::new(keys), provider.clone()))
            }
            None => None,
        };
        if local.is_none() && provider.is_none() {
            return Err(Error::invalid(
                "token_secret",
                "not set, and no identity provider (jwks) either: no token could be verified",
            ));
        }
        Ok(Self {
            local,
            provider,
            checks: Checks::new(&policy),
            verified: std::sync::Arc::new(verified::Verified::new()),
            policy,
        })
    }

    /// A token of the service's own for `who`, valid for `ttl`.
    ///
    /// # Errors
    /// [`Error::Invalid`] if no shared secret is set (or it cannot sign).
    pub fn try_mint(&self, who: Principal, ttl: Duration) -> Result<String> {
        let local = self
            .local
            .as_ref()
            .ok_or_else(|| Error::invalid("token_secret", "not set: no token can be minted"))?;
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(who, ttl, LOCAL_ISSUER, LOCAL_ISSUER),
            &local.encoding,
        )
        .map_err(|e| Error::invalid("token_secret", e.to_string()))
    }

    /// [`Tokens::try_mint`] for tokens made with [`Tokens::new`], which
    /// always have a secret (tests, tools).
    ///
    /// # Panics
    /// If these tokens have no shared secret.
    pub fn mint(&self, who: Principal, ttl: Duration) -> String {
        self.try_mint(who, ttl)
            .unwrap_or_else(|e| panic!("minting a token: {e}"))
    }

    /// A token of the first format (the `legacy_tokens` change-over).
    ///
    /// # Errors
    /// As [`Tokens::try_mint`].
    pub fn mint_legacy(&self, who: Principal, ttl: Duration) -> Result<String> {
        let local = self
            .local
            .as_ref()
            .ok_or_else(|| Error::invalid("token_secret", "not set: no token can be minted"))?;
        Ok(local.legacy.mint(who, ttl))
    }

    /// Starts loading the identity provider's key set again every refresh
    /// period, until `stop`; nothing without a provider.
    pub fn refresh_until_stopped(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let Some((keys, _)) = &self.provider else {
            return;
        };
        let keys = keys.clone();
        tokio::spawn(async move {
            let every = keys.refresh();
            loop {
                tokio::select! {
                    changed = stop.changed() => {
                        if changed.is_err() || *stop.borrow() {
                            return;
                        }
                    }
                    () = tokio::time::sleep(every) => keys.reload().await,
                }
            }
        });
    }

    /// Checks `token` and says whom it speaks for.
    ///
    /// # Errors
    /// A [`TokenError`] saying why it was refused.
    pub async fn verify(&self, token: &str) -> std::result::Result<Principal, TokenError> {
        let key_set = self
            .provider
            .as_ref()
            .map_or(0, |(keys, _)| keys.generation());
        if let Some(principal) = self.verified.get(token, unix_now(), key_set) {
            return Ok(principal);
        }
        if token.starts_with("v1.") {
            return match (&self.local, self.policy.legacy) {
                (Some(local), true) => {
                    tracing::debug!("a token of the first format, taken while legacy_tokens is on");
                    local.legacy.verify(token)
                }
                _ => Err(TokenError::Legacy),
            };
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let decoded = match header.alg {
            Algorithm::HS256 => {
                let local = self.local.as_ref().ok_or(TokenError::Algorithm)?;
                jsonwebtoken::decode::<Value>(token, &local.decoding, &self.checks.local)
                    .map(|data| (data.claims, LOCAL_ISSUER))
            }
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA => {
                let (keys, provider) = self.provider.as_ref().ok_or(TokenError::UnknownKey)?;
                let kid = header.kid.as_deref().ok_or(TokenError::UnknownKey)?;
                // Boxed: the service's own tokens, the common case, need
                // not carry the key set's future in theirs.
                let key = Box::pin(keys.key(kid))
                    .await
                    .ok_or(TokenError::UnknownKey)?;
                if key.algorithm != header.alg {
                    return Err(TokenError::Algorithm);
                }
                let (_, validation) = (self.checks.provider.iter())
                    .find(|(algorithm, _)| *algorithm == key.algorithm)
                    .ok_or(TokenError::Algorithm)?;
                jsonwebtoken::decode::<Value>(token, &key.key, validation)
                    .map(|data| (data.claims, provider.issuer.as_str()))
            }
            _ => return Err(TokenError::Algorithm),
        };
        let (claims, issuer) = decoded.map_err(|e| refusal(&e))?;
        let principal = self.principal(&claims, issuer)?;
        // `exp` is required and checked above; a token whose `exp` is not
        // a whole number of seconds is simply not kept.
        if let Some(exp) = claims.get("exp").and_then(Value::as_u64) {
            let usable_until = exp.saturating_add(self.policy.leeway.as_secs());
            self.verified.keep(token, principal, usable_until, key_set);
        }
        Ok(principal)
    }

    fn principal(
        &self,
        claims: &Value,
        issuer: &str,
    ) -> std::result::Result<Principal, TokenError> {
        let roles = claim(claims, &self.policy.role_claim);
        let admin = match roles {
            Some(Value::String(role)) => role.split(' ').any(|r| r == self.policy.admin_role),
            Some(Value::Array(roles)) => roles
                .iter()
                .any(|r| r.as_str() == Some(self.policy.admin_role.as_str())),
            _ => false,
        };
        if admin {
            return Ok(Principal::Admin);
        }
        let user = match claim(claims, &self.policy.user_claim) {
            Some(Value::Number(n)) => n.as_i64().filter(|id| *id > 0),
            Some(Value::String(s)) if !s.is_empty() => Some(match s.parse::<i64>() {
                Ok(id) if id > 0 => id,
                _ => derived_user_id(issuer, s),
            }),
            _ => None,
        };
        user.map(Principal::User).ok_or(TokenError::NoUser)
    }
}

/// A claim by a dotted path (`realm_access.roles`).
fn claim<'a>(claims: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(claims, |value, part| value.get(part))
}

/// The stable id of a user whose id claim is not a number: the first 63
/// bits of SHA-256 over the issuer and the value (never 0).
pub fn derived_user_id(issuer: &str, subject: &str) -> i64 {
    let digest = Sha256::new()
        .chain_update(issuer.as_bytes())
        .chain_update([0])
        .chain_update(subject.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    ((u64::from_be_bytes(first) >> 1) as i64).max(1)
}

fn refusal(e: &jsonwebtoken::errors::Error) -> TokenError {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => TokenError::NotYetValid,
        ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
        ErrorKind::InvalidAudience => TokenError::WrongAudience,
        ErrorKind::InvalidSignature => TokenError::BadSignature,
        ErrorKind::MissingRequiredClaim(claim) if claim == "exp" => TokenError::Expired,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => TokenError::Algorithm,
        _ => TokenError::Malformed,
    }
}

fn local(secret: &[u8]) -> Result<Local> {
    if secret.len() < 16 {
        return Err(Error::invalid("token_secret", "must be at least 16 bytes"));
    }
    Ok(Local {
        encoding: EncodingKey::from_secret(secret),
        decoding: DecodingKey::from_secret(secret),
        legacy: LegacyTokens::new(secret)?,
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Tokens {
        Tokens::new(b"0123456789abcdef-test").unwrap()
    }

    #[tokio::test]
    async fn the_services_own_tokens_verify_to_their_principal() {
        let t = tokens();
        let hour = Duration::from_secs(3600);
        for who in [Principal::User(42), Principal::Admin] {
            assert_eq!(t.verify(&t.mint(who, hour)).await, Ok(who));
        }
    }

    #[tokio::test]
    async fn tampered_foreign_expired_garbage_and_old_tokens_are_refused() {
        let t = tokens();
        let good = t.mint(Principal::User(42), Duration::from_secs(3600));
        let (head, rest) = good.split_once('.').unwrap();
        let (_, signature) = rest.split_once('.').unwrap();
        let forged_claims = base64::Engine::encode(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
            br#"{"iss":"seckill","aud":"seckill","sub":"43","exp":4102444800}"#,
        );
        let tampered = format!("{head}.{forged_claims}.{signature}");
        assert_eq!(t.verify(&tampered).await, Err(TokenError::BadSignature));
        let other = Tokens::new(b"another-secret-0123456789").unwrap();
        assert_eq!(other.verify(&good).await, Err(TokenError::BadSignature));
        // Expired beyond the leeway.
        let mut old = claims(Principal::User(1), Duration::ZERO, LOCAL_ISSUER, "seckill");
        old["exp"] = json!(unix_now() - 120);
        let expired = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &old,
            &EncodingKey::from_secret(b"0123456789abcdef-test"),
        )
        .unwrap();
        assert_eq!(t.verify(&expired).await, Err(TokenError::Expired));
        for garbage in ["", "abc", "a.b.c", "....", "v1.u.1.2.x"] {
            assert!(t.verify(garbage).await.is_err(), "{garbage:?}");
        }
        let v1 = t
            .mint_legacy(Principal::User(7), Duration::from_secs(60))
            .unwrap();
        assert_eq!(t.verify(&v1).await, Err(TokenError::Legacy));
        let allowing = Tokens {
            policy: TokenPolicy {
                legacy: true,
                ..TokenPolicy::default()
            },
            ..t.clone()
        };
        assert_eq!(allowing.verify(&v1).await, Ok(Principal::User(7)));
        assert!(Tokens::new(b"short").is_err());
    }

    /// A token taken again from the memory of verified tokens is refused
    /// once it expires, as one checked in full would be.
    #[tokio::test]
    async fn a_token_verified_before_is_refused_once_expired() {
        let policy = TokenPolicy {
            leeway: Duration::ZERO,
            ..TokenPolicy::default()
        };
        let t = Tokens {
            checks: Checks::new(&policy),
            policy,
            ..tokens()
        };
        let token = t.mint(Principal::User(9), Duration::from_secs(1));
        assert_eq!(t.verify(&token).await, Ok(Principal::User(9)));
        assert_eq!(t.verify(&token).await, Ok(Principal::User(9)));
        let exp = unix_now() + 1;
        // Time is the subject: wait until the clock is past `exp`.
        while unix_now() <= exp {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(t.verify(&token).await, Err(TokenError::Expired));
    }

    #[test]
    fn a_subject_that_is_not_a_number_gets_a_stable_positive_id() {
        let a = derived_user_id("https://id.example", "auth0|5f2");
        assert!(a > 0);
        assert_eq!(a, derived_user_id("https://id.example", "auth0|5f2"));
        assert_ne!(a, derived_user_id("https://other.example", "auth0|5f2"));
    }
}
