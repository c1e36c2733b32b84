//! The service's settings: one type, [`Settings`], and one place for the
//! defaults, [`Layer::defaults`].
//!
//! A [`Layer`] is a partial set of settings: any field may be unset. Layers
//! stack, the upper winning field by field — defaults < a TOML file <
//! `SECKILL_*` environment variables < command-line flags — and the stack
//! resolves into a checked [`Settings`]. `Layer` is at once the file's
//! format (snake_case keys, unknown keys refused) and the flags of
//! `seckill serve` (clap reads each flag's environment variable in the
//! same layer, the flag winning), so a setting is declared once.
//!
//! | setting | flag / environment / file key | default |
//! |---|---|---|
//! | Redis URL | `--redis-url` `SECKILL_REDIS_URL` `redis_url` | `redis://127.0.0.1:6379/` |
//! | Redis TLS: CA to trust instead of the system's | `--redis-tls-ca-file` … `redis_tls_ca_file` | none |
//! | Redis TLS: client certificate and key | `--redis-tls-cert-file`, `--redis-tls-key-file` … | none |
//! | Redis TLS: the name servers' certificates must carry, when their addresses do not (not for a cluster) | `--redis-tls-server-name` … `redis_tls_server_name` | the address's host |
//! | Redis TLS: accept any certificate (development only) | `--redis-tls-insecure` … `redis_tls_insecure` | false |
//! | database URL (TLS in it: `?sslmode=verify-full&sslrootcert=ca.pem` for PostgreSQL, `?ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem` for MariaDB) | `--database-url` `SECKILL_DATABASE_URL` `database_url` | `sqlite://data/seckill.db` |
//! | listen address | `--listen` `SECKILL_LISTEN` `listen` | `127.0.0.1:8080` |
//! | token secret: signs the service's own tokens (HS256) | `--token-secret` `SECKILL_TOKEN_SECRET` `token_secret` | none: required unless `jwks` is set |
//! | identity provider's key set: a JWKS file or URL | `--jwks` … `jwks` | none |
//! | its tokens' issuer, audience | `--jwt-issuer`, `--jwt-audience` … | none: required with `jwks` |
//! | leeway for `exp`/`nbf` | `--jwt-leeway-s` … `jwt_leeway_s` | 30 |
//! | claim of the user id, of the roles, the operator role | `--jwt-user-claim`, `--jwt-role-claim`, `--jwt-admin-role` … | `sub`, `roles`, `seckill-admin` |
//! | key set reloaded every | `--jwks-refresh-ms` … `jwks_refresh_ms` | 300,000 |
//! | the first token format still taken (change-over only) | `--legacy-tokens` … `legacy_tokens` | false |
//! | purchase path | `--mode` `SECKILL_MODE` `mode` | `async` |
//! | sync path's user locks | `--user-locks` `SECKILL_USER_LOCKS` `user_locks` | `redis` |
//! | key prefix | `--prefix` `SECKILL_PREFIX` `prefix` | `seckill` |
//! | consumer name | `--consumer` `SECKILL_CONSUMER` `consumer` | `seckill-<host>-<pid>` |
//! | takeover after | `--reclaim-idle-ms` … `reclaim_idle_ms` | 30,000 |
//! | purchases/s per user | `--user-rate` … `user_rate` | 5 (0: off) |
//! | requests/s per IP | `--ip-rate` … `ip_rate` | 2,000 (0: off) |
//! | replicas to confirm | `--replica-ack` … `replica_ack` | 0 (off) |
//! | their timeout | `--replica-ack-timeout-ms` … `replica_ack_timeout_ms` | 100 |
//! | open connections | `--max-connections` … `max_connections` | 10,000 |
//! | of them from one address | `--max-connections-per-address` … `max_connections_per_address` | 1,000 (behind a proxy: as `max_connections`) |
//! | header/idle timeout | `--header-timeout-ms` … `header_timeout_ms` | 10,000 |
//! | body timeout | `--body-timeout-ms` … `body_timeout_ms` | 10,000 |
//! | payment window of a new voucher that names none | `--pay-within-ms` … `pay_within_ms` | 900,000 (15 min) |
//! | expiry sweep period | `--sweep-every-ms` … `sweep_every_ms` | 1,000 |
//! | payment provider (confirms by signed callback): its base URL | `--payment-provider` … `payment_provider` | none: the in-process stand-in, which approves at once |
//! | its API key; the secret its callbacks are signed with | `--payment-api-key`, `--payment-webhook-secret` … | none: both required with a provider |
//! | a callback's replay window | `--payment-webhook-tolerance-s` … `payment_webhook_tolerance_s` | 300 |

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::auth::{JwksSource, Provider, TokenPolicy};
use crate::domain::voucher::{DEFAULT_PAY_WITHIN, PAY_WITHIN_RANGE};
use crate::error::{Error, Result};
use crate::limits::{ConnectionLimits, Limit};
use crate::store::{RedisTls, ReplicaAck};

/// Which purchase path the service uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Redis fast path + durable pipeline.
    Async,
    /// Per-user lock + database transaction.
    Sync,
}

/// Where the sync path keeps its per-user locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UserLocks {
    /// `hasp` locks in Redis.
    Redis,
    /// `hasp-sql` locks in the service's database (table `hasp_locks`):
    /// the sync path then needs no Redis lock server.
    Database,
}

/// Everything a service needs to start, checked. Build one with
/// [`Settings::new`] (the defaults) and struct update syntax, or resolve
/// layers with [`Layer::resolve`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// Redis URL (`redis://…`, `redis+unix://…`, `redis+sentinel://…`,
    /// `redis+cluster://…`; `rediss…` for TLS).
    pub redis_url: String,
    /// What the Redis connections trust and present over TLS.
    pub redis_tls: RedisTls,
    /// Database URL (`sqlite://…`, `postgres://…`, `mysql://…`).
    pub database_url: String,
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// Secret that signs the service's own bearer tokens (never printed);
    /// `None`: only an identity provider's are taken.
    pub token_secret: Option<SecretString>,
    /// Which tokens are taken and whom they name.
    pub tokens: TokenPolicy,
    /// Purchase path.
    pub mode: Mode,
    /// Where the sync path keeps its per-user locks.
    pub user_locks: UserLocks,
    /// Prefix of every Redis key and lock name of the service.
    pub prefix: String,
    /// This instance's consumer name in the order pipeline (unique per
    /// instance).
    pub consumer: String,
    /// Pipeline entries pending this long on a (dead) consumer are taken
    /// over.
    pub reclaim_idle: Duration,
    /// Purchases per second per user (`None`: unlimited).
    pub user_limit: Option<Limit>,
    /// Requests per second per client IP (`None`: unlimited).
    pub ip_limit: Option<Limit>,
    /// Answer `accepted` only once this many Redis replicas have the order
    /// (`None`: once the primary has it). See README, "Durability".
    pub replica_ack: Option<ReplicaAck>,
    /// Connection cap and header, idle and body timeouts of the HTTP server.
    pub connections: ConnectionLimits,
    /// How long a buyer has to pay, for a voucher created without its own
    /// window.
    pub pay_within: Duration,
    /// How often the expiry sweep looks for due orders (one indexed query
    /// when none is due).
    pub sweep_every: Duration,
    /// For a demo on one machine only: `POST /api/demo/sign-in` hands a
    /// token for any user id, or the operator's, to whoever asks. Refused
    /// unless `listen` is a loopback address.
    pub demo_sign_in: bool,
    /// Who takes the buyers' money.
    pub payments: PaymentSettings,
}

/// Who takes the buyers' money.
#[derive(Debug, Clone)]
pub enum PaymentSettings {
    /// The in-process stand-in: approves every charge at once (for
    /// development and the tests).
    StandIn,
    /// A provider over HTTP that confirms by signed callback
    /// (`payments::provider`).
    Provider {
        /// Its base URL.
        url: String,
        /// The API key the service presents.
        api_key: SecretString,
        /// The secret its callbacks are signed with.
        webhook_secret: SecretString,
        /// How far a callback's signing time may be from now.
        tolerance: Duration,
    },
}

impl Settings {
    /// The defaults (see the module docs) with these three set.
    ///
    /// # Panics
    /// Never: the defaults are valid (a test checks it).
    pub fn new(
        redis_url: impl Into<String>,
        database_url: impl Into<String>,
        token_secret: impl Into<String>,
    ) -> Self {
        Layer {
            redis_url: Some(redis_url.into()),
            database_url: Some(database_url.into()),
            token_secret: Some(SecretString::from(token_secret.into())),
            ..Layer::default()
        }
        .resolve()
        .unwrap_or_else(|e| unreachable!("the default settings are valid: {e}"))
    }
}

/// Where the service's data lives: all that `migrate` and `reconcile` need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Storage {
    /// Redis URL.
    pub redis_url: String,
    /// What the Redis connections trust and present over TLS.
    pub redis_tls: RedisTls,
    /// Database URL.
    pub database_url: String,
    /// Key prefix.
    pub prefix: String,
}

/// Some settings, the rest unset: one layer of the stack (see the module
/// docs). The flags of `seckill serve` and the keys of its file.
#[derive(Debug, Default, Clone, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    /// Redis URL; rediss://, rediss+sentinel://, rediss+cluster:// for TLS [default: redis://127.0.0.1:6379/].
    #[arg(long, env = "SECKILL_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Redis TLS: PEM file of the CA certificates to trust instead of the system's (which honour SSL_CERT_FILE).
    #[arg(long, env = "SECKILL_REDIS_TLS_CA_FILE")]
    pub redis_tls_ca_file: Option<std::path::PathBuf>,
    /// Redis TLS: PEM file of the client certificate, for servers that ask for one (with --redis-tls-key-file).
    #[arg(long, env = "SECKILL_REDIS_TLS_CERT_FILE")]
    pub redis_tls_cert_file: Option<std::path::PathBuf>,
    /// Redis TLS: PEM file of the client certificate's private key.
    #[arg(long, env = "SECKILL_REDIS_TLS_KEY_FILE")]
    pub redis_tls_key_file: Option<std::path::PathBuf>,
    /// Redis TLS: the name every server's certificate must carry, when its address does not (an IP address, a Sentinel's announced master); not for a cluster [default: the address's host].
    #[arg(long, env = "SECKILL_REDIS_TLS_SERVER_NAME")]
    pub redis_tls_server_name: Option<String>,
    /// Redis TLS: accept any server certificate (encrypted, not authenticated: development only) [default: false].
    #[arg(long, env = "SECKILL_REDIS_TLS_INSECURE")]
    pub redis_tls_insecure: Option<bool>,
    /// Database URL: sqlite://FILE, postgres://…, mysql://…; TLS in the URL: ?sslmode=verify-full&sslrootcert=CA (PostgreSQL), ?ssl-mode=VERIFY_IDENTITY&ssl-ca=CA (MariaDB) [default: sqlite://data/seckill.db].
    #[arg(long, env = "SECKILL_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Listen address [default: 127.0.0.1:8080].
    #[arg(long, env = "SECKILL_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Secret signing the service's own bearer tokens, HS256 JWTs (at least 16 bytes; required unless --jwks is set).
    #[arg(long, env = "SECKILL_TOKEN_SECRET", hide_env_values = true, value_parser = secret)]
    pub token_secret: Option<SecretString>,
    /// An identity provider's public keys (RS256, ES256, EdDSA): a JWKS file, or an https:// URL fetched and refreshed.
    #[arg(long, env = "SECKILL_JWKS")]
    pub jwks: Option<String>,
    /// The issuer (iss) the identity provider's tokens must carry (required with --jwks).
    #[arg(long, env = "SECKILL_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// The audience (aud) they must carry (required with --jwks; the service's own tokens carry it too).
    #[arg(long, env = "SECKILL_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Seconds of leeway for exp and nbf [default: 30].
    #[arg(long, env = "SECKILL_JWT_LEEWAY_S")]
    pub jwt_leeway_s: Option<u64>,
    /// The claim holding the user id: a number, or a string made into a stable id [default: sub].
    #[arg(long, env = "SECKILL_JWT_USER_CLAIM")]
    pub jwt_user_claim: Option<String>,
    /// The claim holding the roles, a dotted path for a nested one (realm_access.roles) [default: roles].
    #[arg(long, env = "SECKILL_JWT_ROLE_CLAIM")]
    pub jwt_role_claim: Option<String>,
    /// The role that makes a token the operator's [default: seckill-admin].
    #[arg(long, env = "SECKILL_JWT_ADMIN_ROLE")]
    pub jwt_admin_role: Option<String>,
    /// Reload the key set this often [default: 300000].
    #[arg(long, env = "SECKILL_JWKS_REFRESH_MS")]
    pub jwks_refresh_ms: Option<u64>,
    /// Still take tokens of the first format (v1.<role>.<user>.<expiry>.<hmac>), for a change-over only: goes in the next release [default: false].
    #[arg(long, env = "SECKILL_LEGACY_TOKENS")]
    pub legacy_tokens: Option<bool>,
    /// Purchase path [default: async].
    #[arg(long, env = "SECKILL_MODE", value_enum)]
    pub mode: Option<Mode>,
    /// Where the sync path keeps its per-user locks [default: redis].
    #[arg(long, env = "SECKILL_USER_LOCKS", value_enum)]
    pub user_locks: Option<UserLocks>,
    /// Prefix of every Redis key and lock name of the service [default: seckill].
    #[arg(long, env = "SECKILL_PREFIX")]
    pub prefix: Option<String>,
    /// Consumer name of this instance in the order pipeline [default: seckill-HOST-PID].
    #[arg(long, env = "SECKILL_CONSUMER")]
    pub consumer: Option<String>,
    /// Take over pipeline entries left pending this long by a dead instance [default: 30000].
    #[arg(long, env = "SECKILL_RECLAIM_IDLE_MS")]
    pub reclaim_idle_ms: Option<u64>,
    /// Purchases per second per user, burst twice that, 0 = unlimited [default: 5].
    #[arg(long, env = "SECKILL_USER_RATE")]
    pub user_rate: Option<u32>,
    /// Requests per second per client IP, burst twice that, 0 = unlimited [default: 2000].
    #[arg(long, env = "SECKILL_IP_RATE")]
    pub ip_rate: Option<u32>,
    /// Answer `accepted` only once this many Redis replicas confirmed the order (WAIT), 0 = off [default: 0].
    #[arg(long, env = "SECKILL_REPLICA_ACK")]
    pub replica_ack: Option<u32>,
    /// How long to wait for those replicas before answering 503 `not_replicated` [default: 100].
    #[arg(long, env = "SECKILL_REPLICA_ACK_TIMEOUT_MS")]
    pub replica_ack_timeout_ms: Option<u64>,
    /// Open HTTP connections at most; more get a 503 and are closed [default: 10000].
    #[arg(long, env = "SECKILL_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Open HTTP connections from one client address at most; more get a 503 and are closed (behind a load balancer or proxy, where every connection comes from its address, set it to max_connections) [default: 1000].
    #[arg(long, env = "SECKILL_MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<usize>,
    /// A request's head must arrive within this, from the connection's start or the previous response (also the idle timeout) [default: 10000].
    #[arg(long, env = "SECKILL_HEADER_TIMEOUT_MS")]
    pub header_timeout_ms: Option<u64>,
    /// A request's body must arrive within this [default: 10000].
    #[arg(long, env = "SECKILL_BODY_TIMEOUT_MS")]
    pub body_timeout_ms: Option<u64>,
    /// How long a buyer has to pay, for a voucher created without its own window (100 ms to 7 days) [default: 900000].
    #[arg(long, env = "SECKILL_PAY_WITHIN_MS")]
    pub pay_within_ms: Option<u64>,
    /// How often the expiry sweep looks for due orders [default: 1000].
    #[arg(long, env = "SECKILL_SWEEP_EVERY_MS")]
    pub sweep_every_ms: Option<u64>,
    /// Demo only: the pages may sign anyone in as any user or the operator (refused unless listening on loopback) [default: false].
    #[arg(long, env = "SECKILL_DEMO_SIGN_IN")]
    pub demo_sign_in: Option<bool>,
    /// A payment provider that confirms by signed callback: its base URL (http:// or https://) [default: none, the in-process stand-in].
    #[arg(long, env = "SECKILL_PAYMENT_PROVIDER")]
    pub payment_provider: Option<String>,
    /// The API key presented to the payment provider (required with --payment-provider).
    #[arg(long, env = "SECKILL_PAYMENT_API_KEY", hide_env_values = true, value_parser = secret)]
    pub payment_api_key: Option<SecretString>,
    /// The secret the provider signs its callbacks with (required with --payment-provider).
    #[arg(long, env = "SECKILL_PAYMENT_WEBHOOK_SECRET", hide_env_values = true, value_parser = secret)]
    pub payment_webhook_secret: Option<SecretString>,
    /// How far a callback's signing time may be from now, in seconds [default: 300].
    #[arg(long, env = "SECKILL_PAYMENT_WEBHOOK_TOLERANCE_S")]
    pub payment_webhook_tolerance_s: Option<u64>,
}

/// A secret from the command line or the environment (a clap value
/// parser): wrapped at once, so it never prints.
///
/// # Errors
/// Never.
pub fn secret(value: &str) -> std::result::Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(value.to_owned()))
}

/// `seckill-<host>-<pid>`: unique per process across machines (a pid alone
/// is not: two hosts' instances would share a consumer).
fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    match host {
        Some(host) => format!("seckill-{host}-{}", std::process::id()),
        None => format!("seckill-{}", std::process::id()),
    }
}

impl Layer {
    /// The bottom layer: every default, and no token secret.
    pub fn defaults() -> Self {
        let connections = ConnectionLimits::default();
        Self {
            redis_url: Some("redis://127.0.0.1:6379/".into()),
            redis_tls_ca_file: None,
            redis_tls_cert_file: None,
            redis_tls_key_file: None,
            redis_tls_server_name: None,
            redis_tls_insecure: Some(false),
            database_url: Some("sqlite://data/seckill.db".into()),
            listen: Some(SocketAddr::from(([127, 0, 0, 1], 8080))),
            token_secret: None,
            jwks: None,
            jwt_issuer: None,
            jwt_audience: None,
            jwt_leeway_s: Some(30),
            jwt_user_claim: Some("sub".into()),
            jwt_role_claim: Some("roles".into()),
            jwt_admin_role: Some(crate::auth::ADMIN_ROLE.into()),
            jwks_refresh_ms: Some(300_000),
            legacy_tokens: Some(false),
            mode: Some(Mode::Async),
            user_locks: Some(UserLocks::Redis),
            prefix: Some("seckill".into()),
            consumer: Some(default_consumer()),
            reclaim_idle_ms: Some(30_000),
            user_rate: Some(5),
            ip_rate: Some(2_000),
            replica_ack: Some(0),
            replica_ack_timeout_ms: Some(100),
            max_connections: Some(connections.max_connections),
            max_connections_per_address: Some(connections.max_per_address),
            header_timeout_ms: Some(connections.header_timeout.as_millis() as u64),
            body_timeout_ms: Some(connections.body_timeout.as_millis() as u64),
            pay_within_ms: Some(DEFAULT_PAY_WITHIN.as_millis() as u64),
            sweep_every_ms: Some(1_000),
            demo_sign_in: Some(false),
            payment_provider: None,
            payment_api_key: None,
            payment_webhook_secret: None,
            payment_webhook_tolerance_s: Some(300),
        }
    }

    /// The layer a TOML file sets.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the file: unreadable, not TOML, an unknown
    /// key or a value of the wrong type.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::invalid("config", format!("reading {}: {e}", path.display())))?;
        toml::from_str(&text)
            .map_err(|e| Error::invalid("config", format!("in {}: {e}", path.display())))
    }

    /// This layer over `lower`: each field from here if set, else from
    /// `lower`.
    pub fn over(self, lower: Layer) -> Layer {
        Layer {
            redis_url: self.redis_url.or(lower.redis_url),
            redis_tls_ca_file: self.redis_tls_ca_file.or(lower.redis_tls_ca_file),
            redis_tls_cert_file: self.redis_tls_cert_file.or(lower.redis_tls_cert_file),
            redis_tls_key_file: self.redis_tls_key_file.or(lower.redis_tls_key_file),
            redis_tls_server_name: self.redis_tls_server_name.or(lower.redis_tls_server_name),
            redis_tls_insecure: self.redis_tls_insecure.or(lower.redis_tls_insecure),
            database_url: self.database_url.or(lower.database_url),
            listen: self.listen.or(lower.listen),
            token_secret: self.token_secret.or(lower.token_secret),
            jwks: self.jwks.or(lower.jwks),
            jwt_issuer: self.jwt_issuer.or(lower.jwt_issuer),
            jwt_audience: self.jwt_audience.or(lower.jwt_audience),
            jwt_leeway_s: self.jwt_leeway_s.or(lower.jwt_leeway_s),
            jwt_user_claim: self.jwt_user_claim.or(lower.jwt_user_claim),
            jwt_role_claim: self.jwt_role_claim.or(lower.jwt_role_claim),
            jwt_admin_role: self.jwt_admin_role.or(lower.jwt_admin_role),
            jwks_refresh_ms: self.jwks_refresh_ms.or(lower.jwks_refresh_ms),
            legacy_tokens: self.legacy_tokens.or(lower.legacy_tokens),
            mode: self.mode.or(lower.mode),
            user_locks: self.user_locks.or(lower.user_locks),
            prefix: self.prefix.or(lower.prefix),
            consumer: self.consumer.or(lower.consumer),
            reclaim_idle_ms: self.reclaim_idle_ms.or(lower.reclaim_idle_ms),
            user_rate: self.user_rate.or(lower.user_rate),
            ip_rate: self.ip_rate.or(lower.ip_rate),
            replica_ack: self.replica_ack.or(lower.replica_ack),
            replica_ack_timeout_ms: self.replica_ack_timeout_ms.or(lower.replica_ack_timeout_ms),
            max_connections: self.max_connections.or(lower.max_connections),
            max_connections_per_address: self
                .max_connections_per_address
                .or(lower.max_connections_per_address),
            header_timeout_ms: self.header_timeout_ms.or(lower.header_timeout_ms),
            body_timeout_ms: self.body_timeout_ms.or(lower.body_timeout_ms),
            pay_within_ms: self.pay_within_ms.or(lower.pay_within_ms),
            sweep_every_ms: self.sweep_every_ms.or(lower.sweep_every_ms),
            demo_sign_in: self.demo_sign_in.or(lower.demo_sign_in),
            payment_provider: self.payment_provider.or(lower.payment_provider),
            payment_api_key: self.payment_api_key.or(lower.payment_api_key),
            payment_webhook_secret: self.payment_webhook_secret.or(lower.payment_webhook_secret),
            payment_webhook_tolerance_s: self
                .payment_webhook_tolerance_s
                .or(lower.payment_webhook_tolerance_s),
        }
    }

    /// Where the data lives, from this layer over the defaults.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad prefix.
    pub fn storage(self) -> Result<Storage> {
        let all = self.over(Layer::defaults());
        let prefix = set(all.prefix, "prefix")?;
        if prefix.is_empty() || prefix.len() > 64 || prefix.contains(['{', '}', ' ']) {
            // Braces would break the keys' hash tags.
            return Err(Error::invalid(
                "prefix",
                "must be 1 to 64 bytes without braces or spaces",
            ));
        }
        let redis_tls = RedisTls {
            ca_file: all.redis_tls_ca_file,
            cert_file: all.redis_tls_cert_file,
            key_file: all.redis_tls_key_file,
            server_name: all.redis_tls_server_name,
            insecure: set(all.redis_tls_insecure, "redis_tls_insecure")?,
        };
        // Read now: a missing file or a bad name is a setting's error, not
        // a connection's.
        redis_tls.certificates()?;
        redis_tls.hasp()?;
        Ok(Storage {
            redis_url: set(all.redis_url, "redis_url")?,
            redis_tls,
            database_url: set(all.database_url, "database_url")?,
            prefix,
        })
    }

    /// The settings of this layer over the defaults, checked.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the setting: no token secret, a bad
    /// prefix, a duration outside 1 ms..1 h, zero connections, an empty
    /// consumer name.
    pub fn resolve(self) -> Result<Settings> {
        let all = self.over(Layer::defaults());
        let storage_layer = Layer {
            redis_url: all.redis_url.clone(),
            redis_tls_ca_file: all.redis_tls_ca_file.clone(),
            redis_tls_cert_file: all.redis_tls_cert_file.clone(),
            redis_tls_key_file: all.redis_tls_key_file.clone(),
            redis_tls_server_name: all.redis_tls_server_name.clone(),
            redis_tls_insecure: all.redis_tls_insecure,
            database_url: all.database_url.clone(),
            prefix: all.prefix.clone(),
            ..Layer::default()
        };
        let ms = |value: Option<u64>, name: &'static str| match value {
            Some(ms @ 1..=3_600_000) => Ok(Duration::from_millis(ms)),
            _ => Err(Error::invalid(name, "must be between 1 and 3,600,000 ms")),
        };
        let connections = ConnectionLimits {
            max_connections: match all.max_connections {
                Some(n @ 1..) => n,
                _ => return Err(Error::invalid("max_connections", "must be at least 1")),
            },
            max_per_address: match all.max_connections_per_address {
                Some(n @ 1..) => n,
                _ => {
                    return Err(Error::invalid(
                        "max_connections_per_address",
                        "must be at least 1",
                    ))
                }
            },
            header_timeout: ms(all.header_timeout_ms, "header_timeout_ms")?,
            body_timeout: ms(all.body_timeout_ms, "body_timeout_ms")?,
        };
        let replica_ack = match all.replica_ack.unwrap_or(0) {
            0 => None,
            replicas => Some(ReplicaAck {
                replicas,
                timeout: ms(all.replica_ack_timeout_ms, "replica_ack_timeout_ms")?,
            }),
        };
        let provider = match all.jwks.clone() {
            None => None,
            Some(jwks) => Some(Provider {
                jwks: JwksSource::parse(&jwks),
                issuer: all
                    .jwt_issuer
                    .clone()
                    .ok_or_else(|| Error::invalid("jwt_issuer", "required with jwks"))?,
                audience: all
                    .jwt_audience
                    .clone()
                    .ok_or_else(|| Error::invalid("jwt_audience", "required with jwks"))?,
                refresh: ms(all.jwks_refresh_ms, "jwks_refresh_ms")?,
            }),
        };
        let token_secret = all.token_secret.clone();
        if token_secret.is_none() && provider.is_none() {
            return Err(Error::invalid(
                "token_secret",
                "not set: use --token-secret, SECKILL_TOKEN_SECRET or token_secret in the config \
                 file, or name an identity provider's keys (--jwks)",
            ));
        }
        let tokens = TokenPolicy {
            provider,
            leeway: Duration::from_secs(set(all.jwt_leeway_s, "jwt_leeway_s")?),
            user_claim: set(all.jwt_user_claim.clone(), "jwt_user_claim")?,
            role_claim: set(all.jwt_role_claim.clone(), "jwt_role_claim")?,
            admin_role: set(all.jwt_admin_role.clone(), "jwt_admin_role")?,
            legacy: set(all.legacy_tokens, "legacy_tokens")?,
        };
        let storage = storage_layer.storage()?;
        let consumer = set(all.consumer, "consumer")?;
        if consumer.is_empty() {
            return Err(Error::invalid("consumer", "must not be empty"));
        }
        let listen = set(all.listen, "listen")?;
        let demo_sign_in = set(all.demo_sign_in, "demo_sign_in")?;
        if demo_sign_in && !listen.ip().is_loopback() {
            return Err(Error::invalid(
                "demo_sign_in",
                "hands anyone any token: only with a loopback listen address",
            ));
        }
        if demo_sign_in && token_secret.is_none() {
            return Err(Error::invalid(
                "demo_sign_in",
                "mints the service's own tokens: needs token_secret",
            ));
        }
        let payments = match all.payment_provider.clone() {
            None => PaymentSettings::StandIn,
            Some(url) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(Error::invalid(
                        "payment_provider",
                        format!("{url:?}: expected an http:// or https:// URL"),
                    ));
                }
                let required = |value: Option<SecretString>, name| {
                    value.ok_or_else(|| Error::invalid(name, "required with payment_provider"))
                };
                let tolerance = set(
                    all.payment_webhook_tolerance_s,
                    "payment_webhook_tolerance_s",
                )?;
                if !(1..=3600).contains(&tolerance) {
                    return Err(Error::invalid(
                        "payment_webhook_tolerance_s",
                        "must be 1 to 3,600 seconds",
                    ));
                }
                PaymentSettings::Provider {
                    url,
                    api_key: required(all.payment_api_key.clone(), "payment_api_key")?,
                    webhook_secret: required(
                        all.payment_webhook_secret.clone(),
                        "payment_webhook_secret",
                    )?,
                    tolerance: Duration::from_secs(tolerance),
                }
            }
        };
        Ok(Settings {
            redis_url: storage.redis_url,
            redis_tls: storage.redis_tls,
            database_url: storage.database_url,
            prefix: storage.prefix,
            listen,
            token_secret,
            tokens,
            mode: set(all.mode, "mode")?,
            user_locks: set(all.user_locks, "user_locks")?,
            consumer,
            reclaim_idle: ms(all.reclaim_idle_ms, "reclaim_idle_ms")?,
            user_limit: Limit::per_second(set(all.user_rate, "user_rate")?),
            ip_limit: Limit::per_second(set(all.ip_rate, "ip_rate")?),
            replica_ack,
            connections,
            pay_within: match all.pay_within_ms.map(Duration::from_millis) {
                Some(window) if PAY_WITHIN_RANGE.contains(&window) => window,
                _ => {
                    return Err(Error::invalid(
                        "pay_within_ms",
                        "must be between 100 and 604,800,000 ms (7 days)",
                    ))
                }
            },
            sweep_every: ms(all.sweep_every_ms, "sweep_every_ms")?,
            demo_sign_in,
            payments,
        })
    }
}

/// A setting's value; every one has a default but the secret, so `None`
/// here means a default is missing from [`Layer::defaults`].
fn set<T>(value: Option<T>, name: &'static str) -> Result<T> {
    value.ok_or_else(|| Error::invalid(name, "not set"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "seckill-settings-{}-{}.toml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).unwrap();
        path
    }

    fn with_secret() -> Layer {
        Layer {
            token_secret: Some(secret("a-secret-of-16-bytes+").unwrap()),
            ..Layer::default()
        }
    }

    /// The defaults are written once (`Layer::defaults`) and are
    /// what `Settings::new` and a resolve of nothing give alike.
    #[test]
    fn the_defaults_are_one_set_and_valid() {
        let resolved = with_secret().resolve().unwrap();
        let new = Settings::new(
            "redis://127.0.0.1:6379/",
            "sqlite://data/seckill.db",
            "a-secret-of-16-bytes+",
        );
        assert_eq!(format!("{resolved:?}"), format!("{new:?}"));
        assert_eq!(new.listen.port(), 8080);
        assert_eq!(new.prefix, "seckill");
        assert!(new.consumer.starts_with("seckill-"), "{}", new.consumer);
        assert!(new.consumer.ends_with(&std::process::id().to_string()));
        assert_eq!(new.user_limit.map(|l| l.per_second.get()), Some(5));
        assert_eq!(new.ip_limit.map(|l| l.per_second.get()), Some(2_000));
        assert!(new.replica_ack.is_none());
        assert_eq!(new.connections, ConnectionLimits::default());
    }

    /// Defaults < file < environment and flags (one layer: clap
    /// reads a flag's variable, the flag winning).
    #[test]
    fn upper_layers_win_field_by_field() {
        let path = write("listen = \"127.0.0.1:9000\"\ntoken_secret = \"file-secret-0123456789\"\nmode = \"sync\"\nip_rate = 0\nprefix = \"shop\"\n");
        let flags = Layer {
            listen: Some("127.0.0.1:9100".parse().unwrap()),
            prefix: Some("flags".into()),
            ..Layer::default()
        };
        let s = flags
            .over(Layer::from_file(&path).unwrap())
            .resolve()
            .unwrap();
        assert_eq!(s.listen.port(), 9100, "flag over file");
        assert_eq!(s.prefix, "flags", "flag over file");
        assert_eq!(
            s.token_secret
                .as_ref()
                .map(secrecy::ExposeSecret::expose_secret),
            Some("file-secret-0123456789")
        );
        assert_eq!(s.mode, Mode::Sync, "file over default");
        assert!(s.ip_limit.is_none(), "0 turns the limit off");
        assert!(s.user_limit.is_some(), "default");
        assert_eq!(s.database_url, "sqlite://data/seckill.db", "default");
        let _ = std::fs::remove_file(path);
    }

    /// The secret never prints, from any layer or the settings.
    #[test]
    fn the_secret_never_appears_in_debug_output() {
        let path = write("token_secret = \"file-secret-0123456789\"\n");
        let file = Layer::from_file(&path).unwrap();
        assert!(!format!("{file:?}").contains("file-secret"));
        let settings = file.resolve().unwrap();
        assert!(!format!("{settings:?}").contains("file-secret"));
        assert!(!format!("{settings:#?}").contains("file-secret"));
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn unknown_keys_bad_values_and_a_missing_secret_are_errors() {
        let typo = write("listen_addr = \"127.0.0.1:1\"\n");
        let err = Layer::from_file(&typo).unwrap_err();
        assert!(err.to_string().contains("listen_addr"), "{err}");
        let bad = write("mode = \"fast\"\n");
        assert!(Layer::from_file(&bad).is_err());
        let err = Layer::default().resolve().unwrap_err();
        assert!(err.to_string().contains("token_secret"), "{err}");
        for (layer, name) in [
            (
                Layer {
                    prefix: Some("a{b}".into()),
                    ..with_secret()
                },
                "prefix",
            ),
            (
                Layer {
                    prefix: Some(String::new()),
                    ..with_secret()
                },
                "prefix",
            ),
            (
                Layer {
                    reclaim_idle_ms: Some(0),
                    ..with_secret()
                },
                "reclaim_idle_ms",
            ),
            (
                Layer {
                    header_timeout_ms: Some(3_600_001),
                    ..with_secret()
                },
                "header_timeout_ms",
            ),
            (
                Layer {
                    max_connections: Some(0),
                    ..with_secret()
                },
                "max_connections",
            ),
            (
                Layer {
                    consumer: Some(String::new()),
                    ..with_secret()
                },
                "consumer",
            ),
            (
                Layer {
                    replica_ack: Some(1),
                    replica_ack_timeout_ms: Some(0),
                    ..with_secret()
                },
                "replica_ack_timeout_ms",
            ),
            (
                Layer {
                    redis_tls_server_name: Some("not a name".into()),
                    ..with_secret()
                },
                "redis_tls_server_name",
            ),
        ] {
            let err = layer.resolve().unwrap_err();
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
        for p in [typo, bad] {
            let _ = std::fs::remove_file(p);
        }
    }
}
