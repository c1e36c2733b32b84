//! Bearer tokens from an identity provider (`docs/guarantees.md`, service
//! 21): JWTs verified against its key set (a JWKS file or URL, refreshed),
//! issuer, audience, expiry and start checked, every forgery refused with
//! a 401, and the key set's rotation followed.

use seckill::testing as support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use reqwest::StatusCode;
use seckill::auth::{derived_user_id, JwksSource, Principal, Provider, TokenPolicy, Tokens};
use seckill::service::Service;
use seckill::settings::Settings;
use serde_json::{json, Value};
use testkit::{JwtKey, JwtKeyKind, RedisServer};

const SECRET: &str = "tokens-test-secret-0001";
const ISSUER: &str = "https://id.shop.test/";
const AUDIENCE: &str = "shop-api";

struct Shop {
    _redis: RedisServer,
    service: Service,
    base: String,
    http: reqwest::Client,
    dir: std::path::PathBuf,
}

impl Shop {
    /// A service taking the provider's tokens from `jwks` (and its own),
    /// refreshing the key set every 200 ms.
    async fn start(what: &str, jwks: JwksSource) -> Self {
        let redis = RedisServer::start();
        let dir =
            std::env::temp_dir().join(format!("seckill-tokens-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let database = format!("sqlite://{}/shop.db", dir.display());
        let service = Service::start(Settings {
            tokens: TokenPolicy {
                provider: Some(Provider {
                    jwks,
                    issuer: ISSUER.into(),
                    audience: AUDIENCE.into(),
                    refresh: Duration::from_millis(200),
                }),
                ..TokenPolicy::default()
            },
            ..support::settings(redis.url(), &database, SECRET)
        })
        .await
        .unwrap();
        Self {
            base: format!("http://{}", service.addr()),
            service,
            _redis: redis,
            http: reqwest::Client::new(),
            dir,
        }
    }

    /// `GET /api/me` with `token`: the status and the body.
    async fn me(&self, token: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .get(format!("{}/api/me", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn stop(self) {
        self.service.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(self.dir);
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token of `key` (naming it) with `claims`.
fn signed(key: &JwtKey, claims: Value) -> String {
    let (algorithm, encoding) = if key.jwk.contains(r#""kty":"EC""#) {
        let encoding = jsonwebtoken::EncodingKey::from_ec_pem(key.pem.as_bytes());
        (jsonwebtoken::Algorithm::ES256, encoding)
    } else {
        let encoding = jsonwebtoken::EncodingKey::from_ed_pem(key.pem.as_bytes());
        (jsonwebtoken::Algorithm::EdDSA, encoding)
    };
    let mut header = jsonwebtoken::Header::new(algorithm);
    header.kid = Some(key.kid.clone());
    jsonwebtoken::encode(&header, &claims, &encoding.unwrap()).unwrap()
}

fn claims(sub: &str) -> Value {
    let now = unix_now();
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 600})
}

/// A token with a header and claims of our own making, and `signature`.
fn raw_token(header: Value, claims: &Value, signature: &[u8]) -> String {
    let part = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
    format!(
        "{}.{}.{}",
        part(&header),
        part(claims),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// Service 21: a provider's tokens name their user (a number, or a stable
/// id made from any other subject) or the operator (its role claim); and
/// each forgery or mismatch is a 401 saying why: another issuer, another
/// audience, `alg: none`, an HMAC made with the provider's public key
/// (HS/RS-style confusion), an expired token, one not valid yet, an
/// unknown key, and the old token format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_tokens_are_verified_and_every_forgery_is_a_401() {
    let es = JwtKey::generate(JwtKeyKind::P256, "es-1").unwrap();
    let ed = JwtKey::generate(JwtKeyKind::Ed25519, "ed-1").unwrap();
    let dir = std::env::temp_dir().join(format!("seckill-jwks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, JwtKey::set(&[&es, &ed])).unwrap();
    let shop = Shop::start("forgeries", JwksSource::File(jwks.clone())).await;

    // Who tokens name.
    let (status, me) = shop.me(&signed(&es, claims("42"))).await;
    assert_eq!(
        (status, me["user_id"].as_i64()),
        (StatusCode::OK, Some(42)),
        "{me}"
    );
    let (status, me) = shop.me(&signed(&ed, claims("auth0|5f2e"))).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(
        me["user_id"].as_i64(),
        Some(derived_user_id(ISSUER, "auth0|5f2e"))
    );
    let mut operator = claims("ops-1");
    operator["roles"] = json!(["viewer", "seckill-admin"]);
    let (status, me) = shop.me(&signed(&es, operator)).await;
    assert_eq!(
        (status, me["role"].as_str()),
        (StatusCode::OK, Some("operator"))
    );
    // The service's own token still works beside them.
    let own = Tokens::new(SECRET.as_bytes()).unwrap();
    let (status, _) = shop
        .me(&own.mint(Principal::User(9), Duration::from_secs(60)))
        .await;
    assert_eq!(status, StatusCode::OK);

    let now = unix_now();
    let mut wrong_issuer = claims("1");
    wrong_issuer["iss"] = json!("https://evil.test/");
    let mut wrong_audience = claims("1");
    wrong_audience["aud"] = json!("another-api");
    let mut expired = claims("1");
    expired["exp"] = json!(now - 120);
    let mut early = claims("1");
    early["nbf"] = json!(now + 300);
    let mut no_exp = claims("1");
    no_exp.as_object_mut().unwrap().remove("exp");
    // An HMAC whose secret is the provider's public key, naming its key.
    let public = serde_json::from_str::<Value>(&es.jwk).unwrap();
    let confused = {
        use hmac::Mac;
        let header = json!({"alg": "HS256", "typ": "JWT", "kid": "es-1"});
        let part = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
        let input = format!("{}.{}", part(&header), part(&claims("1")));
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(public.to_string().as_bytes()).unwrap();
        mac.update(input.as_bytes());
        format!(
            "{input}.{}",
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    };
    let none = raw_token(json!({"alg": "none", "typ": "JWT"}), &claims("1"), b"");
    let unknown_key = {
        let stranger = JwtKey::generate(JwtKeyKind::P256, "stranger").unwrap();
        signed(&stranger, claims("1"))
    };
    let legacy = own
        .mint_legacy(Principal::User(1), Duration::from_secs(60))
        .unwrap();
    let cases = [
        (
            "another issuer",
            signed(&es, wrong_issuer),
            "another issuer",
        ),
        (
            "another audience",
            signed(&es, wrong_audience),
            "another audience",
        ),
        ("alg none", none, "malformed"),
        ("HMAC with the public key", confused, "signature"),
        ("expired", signed(&es, expired), "expired"),
        ("not valid yet", signed(&es, early), "not valid yet"),
        ("no expiry", signed(&es, no_exp), "expired"),
        ("unknown key", unknown_key, "unknown key"),
        ("old format", legacy, "old format"),
    ];
    for (what, token, why) in cases {
        let (status, body) = shop.me(&token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(why),
            "{what}: {message:?} does not say {why:?}"
        );
    }
    shop.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Service 21: the key set rotates: a new key is taken once the set has it
/// (an unknown key id loads it again), and a removed key is refused after
/// the next refresh; from a file and from a URL alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_key_set_is_followed_from_a_file_and_from_a_url() {
    let old = JwtKey::generate(JwtKeyKind::P256, "2026-01").unwrap();
    let new = JwtKey::generate(JwtKeyKind::Ed25519, "2026-02").unwrap();

    // A URL: a small server of the document the test changes.
    let document = Arc::new(Mutex::new(JwtKey::set(&[&old])));
    let served = document.clone();
    let app = axum::Router::new().route(
        "/.well-known/jwks.json",
        axum::routing::get(move || {
            let served = served.clone();
            async move { served.lock().unwrap().clone() }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/.well-known/jwks.json",
        listener.local_addr().unwrap()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = std::env::temp_dir().join(format!("seckill-rotation-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jwks.json");
    std::fs::write(&file, JwtKey::set(&[&old])).unwrap();

    for (what, source) in [
        ("file", JwksSource::File(file.clone())),
        ("url", JwksSource::Url(url)),
    ] {
        let shop = Shop::start(what, source).await;
        // One token of the old key, taken before the rotation: the
        // service's memory of verified tokens must not outlive the key.
        let taken_before = signed(&old, claims("1"));
        assert_eq!(shop.me(&taken_before).await.0, StatusCode::OK, "{what}");
        assert_eq!(
            shop.me(&signed(&new, claims("2"))).await.0,
            StatusCode::UNAUTHORIZED,
            "{what}"
        );
        // The provider adds its new key, then drops the old one.
        let both = JwtKey::set(&[&old, &new]);
        std::fs::write(&file, &both).unwrap();
        *document.lock().unwrap() = both;
        let taken = testkit::eventually(Duration::from_secs(10), || async {
            shop.me(&signed(&new, claims("2"))).await.0 == StatusCode::OK
        })
        .await;
        assert!(taken, "{what}: the new key was never taken");
        let only_new = JwtKey::set(&[&new]);
        std::fs::write(&file, &only_new).unwrap();
        *document.lock().unwrap() = only_new;
        let dropped = testkit::eventually(Duration::from_secs(10), || async {
            shop.me(&taken_before).await.0 == StatusCode::UNAUTHORIZED
        })
        .await;
        assert!(dropped, "{what}: the removed key was still taken");
        assert_eq!(
            shop.me(&signed(&new, claims("2"))).await.0,
            StatusCode::OK,
            "{what}"
        );
        // Back to the old set for the next source.
        std::fs::write(&file, JwtKey::set(&[&old])).unwrap();
        *document.lock().unwrap() = JwtKey::set(&[&old]);
        shop.stop().await;
    }
    let _ = std::fs::remove_dir_all(dir);
}
