//! An identity provider's public keys (a JWKS document, RFC 7517), read
//! from a file or fetched from a URL, kept by key id and refreshed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};

use crate::error::{Error, Result};

/// Where the key set comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A JWKS file, read again at each refresh.
    File(PathBuf),
    /// An `https://` (or, for a local test, `http://`) URL, fetched again
    /// at each refresh.
    Url(String),
}

impl JwksSource {
    /// A file path or a URL, as the `jwks` setting gives it.
    pub fn parse(value: &str) -> Self {
        if value.starts_with("https://") || value.starts_with("http://") {
            JwksSource::Url(value.to_owned())
        } else {
            JwksSource::File(PathBuf::from(value))
        }
    }
}

/// One verifying key: the algorithm it signs with, and the key.
#[derive(Clone)]
pub(crate) struct Key {
    pub(crate) algorithm: Algorithm,
    pub(crate) key: DecodingKey,
}

/// The key set, by key id, and when it was last loaded.
pub(crate) struct KeySet {
    source: JwksSource,
    keys: RwLock<Arc<HashMap<String, Key>>>,
    loaded_at: Mutex<Instant>,
    /// How often it is loaded again; an unknown key id loads it again at
    /// most every tenth of this.
    refresh: Duration,
    http: reqwest::Client,
    /// How many times the set was loaded again: a verification made with
    /// an earlier set is not taken again (`verified.rs`).
    generation: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySet")
            .field("source", &self.source)
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl KeySet {
    /// Loads the key set from `source` once.
    ///
    /// # Errors
    /// [`Error::Invalid`] (`jwks`) if it cannot be read or fetched, does
    /// not parse, or holds no usable key.
    pub(crate) async fn load(source: JwksSource, refresh: Duration) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Error::invalid("jwks", e.to_string()))?;
        let set = Self {
            source,
            keys: RwLock::new(Arc::default()),
            loaded_at: Mutex::new(Instant::now()),
            refresh,
            http,
            generation: Default::default(),
        };
        let keys = set.fetch().await?;
        if keys.is_empty() {
            return Err(Error::invalid("jwks", "holds no RS256, ES256 or EdDSA key"));
        }
        *set.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
        Ok(set)
    }

    /// How often the set is loaded again.
    pub(crate) fn refresh(&self) -> Duration {
        self.refresh
    }

    /// How many times the set was loaded again since it was first.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The key with id `kid`; an unknown id loads the set again first (a
    /// rotation the refresh has not seen yet), at most every tenth of the
    /// refresh period.
    pub(crate) async fn key(&self, kid: &str) -> Option<Key> {
        if let Some(key) = self.current().get(kid) {
            return Some(key.clone());
        }
        let due = {
            let mut loaded_at = self.loaded_at.lock().unwrap_or_else(|p| p.into_inner());
            let due = loaded_at.elapsed() >= self.refresh / 10;
            if due {
                *loaded_at = Instant::now();
            }
            due
        };
        if due {
            self.reload().await;
        }
        self.current().get(kid).cloned()
    }

    fn current(&self) -> Arc<HashMap<String, Key>> {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Loads the set again; a failure keeps the keys it had (logged).
    pub(crate) async fn reload(&self) {
        match self.fetch().await {
            Ok(keys) => {
                *self.loaded_at.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
                self.generation
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the identity provider's keys could not be loaded again; keeping the last ones")
            }
        }
    }

    async fn fetch(&self) -> Result<HashMap<String, Key>> {
        let text = match &self.source {
            JwksSource::File(path) => std::fs::read_to_string(path)
                .map_err(|e| Error::invalid("jwks", format!("{}: {e}", path.display())))?,
            JwksSource::Url(url) => self
                .http
                .get(url)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| Error::invalid("jwks", format!("{url}: {e}")))?
                .text()
                .await
                .map_err(|e| Error::invalid("jwks", format!("{url}: {e}")))?,
        };
        let set: JwkSet = serde_json::from_str(&text)
            .map_err(|e| Error::invalid("jwks", format!("not a JWKS document: {e}")))?;
        let mut keys = HashMap::new();
        for jwk in &set.keys {
            let Some(kid) = jwk.common.key_id.clone() else {
                continue; // a key nothing can name
            };
            let Some(algorithm) = algorithm_of(&jwk.algorithm) else {
                continue; // an encryption key, or an algorithm not taken here
            };
            match DecodingKey::from_jwk(jwk) {
                Ok(key) => {
                    keys.insert(kid, Key { algorithm, key });
                }
                Err(e) => {
                    tracing::warn!(kid, error = %e, "a key of the set does not parse; skipped")
                }
            }
        }
        Ok(keys)
    }
}

/// The signing algorithm a key's type fixes: RS256 for RSA, ES256 for
/// P-256, EdDSA for Ed25519 (a token that names another for this key is
/// refused, so a public key can never serve as an HMAC secret).
fn algorithm_of(parameters: &AlgorithmParameters) -> Option<Algorithm> {
    match parameters {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            Some(Algorithm::ES256)
        }
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            Some(Algorithm::EdDSA)
        }
        _ => None,
    }
}
