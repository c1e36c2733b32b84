//! `seckill serve`'s settings: flags, then `SECKILL_*` environment
//! variables, then a TOML file (`--config`), then defaults — the first that
//! sets a value wins. Unknown keys in the file are an error.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use seckill::http::{ConnectionLimits, Limit};
use seckill::service::{Mode, ServiceConfig};
use seckill::store::ReplicaAck;
use secrecy::SecretString;

/// A secret from the command line or the environment.
pub(crate) fn secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(value.to_owned()))
}
use serde::Deserialize;

/// Flags (and their environment variables) of `seckill serve`.
#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// A TOML file with any of the settings below (snake_case keys).
    #[arg(long, env = "SECKILL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Redis URL [default: redis://127.0.0.1:6379/].
    #[arg(long, env = "SECKILL_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Database URL: sqlite://FILE, postgres://…, mysql://… [default: sqlite://data/seckill.db].
    #[arg(long, env = "SECKILL_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Listen address [default: 127.0.0.1:8080].
    #[arg(long, env = "SECKILL_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Secret signing bearer tokens (at least 16 bytes; required).
    #[arg(long, env = "SECKILL_TOKEN_SECRET", hide_env_values = true, value_parser = secret)]
    pub token_secret: Option<SecretString>,
    /// Purchase path [default: async].
    #[arg(long, env = "SECKILL_MODE", value_enum)]
    pub mode: Option<Mode>,
    /// Consumer name of this instance in the order pipeline [default: seckill-PID].
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
    /// Prefix of every Redis key and lock name of the service [default: seckill].
    #[arg(long, env = "SECKILL_PREFIX")]
    pub prefix: Option<String>,
    /// Open HTTP connections at most; more get a 503 and are closed [default: 10000].
    #[arg(long, env = "SECKILL_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// A request's head must arrive within this, from the connection's start or the previous response (also the idle timeout) [default: 10000].
    #[arg(long, env = "SECKILL_HEADER_TIMEOUT_MS")]
    pub header_timeout_ms: Option<u64>,
    /// A request's body must arrive within this [default: 10000].
    #[arg(long, env = "SECKILL_BODY_TIMEOUT_MS")]
    pub body_timeout_ms: Option<u64>,
}

/// The same settings, from the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    redis_url: Option<String>,
    database_url: Option<String>,
    listen: Option<SocketAddr>,
    token_secret: Option<SecretString>,
    mode: Option<Mode>,
    consumer: Option<String>,
    reclaim_idle_ms: Option<u64>,
    user_rate: Option<u32>,
    ip_rate: Option<u32>,
    replica_ack: Option<u32>,
    replica_ack_timeout_ms: Option<u64>,
    max_connections: Option<usize>,
    header_timeout_ms: Option<u64>,
    body_timeout_ms: Option<u64>,
    prefix: Option<String>,
}

impl ServeArgs {
    /// Resolves every setting.
    ///
    /// # Errors
    /// An unreadable or invalid file, or no token secret anywhere.
    pub fn resolve(self) -> anyhow::Result<ServiceConfig> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                toml::from_str::<FileSettings>(&text)
                    .with_context(|| format!("in {}", path.display()))?
            }
            None => FileSettings::default(),
        };
        let defaults = ConnectionLimits::default();
        let ms = |flag: Option<u64>, file: Option<u64>, default: Duration, name: &str| {
            let ms = flag.or(file).map_or(default.as_millis() as u64, |ms| ms);
            anyhow::ensure!(
                (1..=3_600_000).contains(&ms),
                "{name} must be between 1 and 3,600,000 ms"
            );
            Ok(Duration::from_millis(ms))
        };
        let connections = ConnectionLimits {
            max_connections: self
                .max_connections
                .or(file.max_connections)
                .unwrap_or(defaults.max_connections),
            header_timeout: ms(
                self.header_timeout_ms,
                file.header_timeout_ms,
                defaults.header_timeout,
                "header_timeout_ms",
            )?,
            body_timeout: ms(
                self.body_timeout_ms,
                file.body_timeout_ms,
                defaults.body_timeout,
                "body_timeout_ms",
            )?,
        };
        anyhow::ensure!(
            connections.max_connections >= 1,
            "max_connections must be at least 1"
        );
        Ok(ServiceConfig {
            connections,
            redis_url: self
                .redis_url
                .or(file.redis_url)
                .unwrap_or_else(|| "redis://127.0.0.1:6379/".into()),
            database_url: self
                .database_url
                .or(file.database_url)
                .unwrap_or_else(|| "sqlite://data/seckill.db".into()),
            listen: self
                .listen
                .or(file.listen)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
            token_secret: self.token_secret.or(file.token_secret).context(
                "no token secret: set --token-secret, SECKILL_TOKEN_SECRET or token_secret in the config file",
            )?,
            mode: self.mode.or(file.mode).unwrap_or(Mode::Async),
            prefix: {
                let prefix = self
                    .prefix
                    .or(file.prefix)
                    .unwrap_or_else(|| "seckill".into());
                anyhow::ensure!(
                    !prefix.is_empty()
                        && prefix.len() <= 64
                        && !prefix.contains(['{', '}', ' ']),
                    "prefix must be 1 to 64 bytes without braces or spaces (braces would break the keys' hash tags)"
                );
                prefix
            },
            consumer: self
                .consumer
                .or(file.consumer)
                .unwrap_or_else(|| format!("seckill-{}", std::process::id())),
            reclaim_idle: Duration::from_millis(
                self.reclaim_idle_ms.or(file.reclaim_idle_ms).unwrap_or(30_000),
            ),
            user_limit: Limit::per_second(self.user_rate.or(file.user_rate).unwrap_or(5)),
            ip_limit: Limit::per_second(self.ip_rate.or(file.ip_rate).unwrap_or(2_000)),
            replica_ack: match self.replica_ack.or(file.replica_ack).unwrap_or(0) {
                0 => None,
                replicas => Some(ReplicaAck {
                    replicas,
                    timeout: Duration::from_millis(
                        self.replica_ack_timeout_ms
                            .or(file.replica_ack_timeout_ms)
                            .unwrap_or(100),
                    ),
                }),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "seckill-config-{}-{}.toml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let path = write("listen = \"127.0.0.1:9000\"\ntoken_secret = \"file-secret-0123456789\"\nmode = \"sync\"\nip_rate = 0\n");
        let args = ServeArgs {
            config: Some(path.clone()),
            listen: Some("127.0.0.1:9100".parse().unwrap()),
            ..ServeArgs::default()
        };
        let c = args.resolve().unwrap();
        assert_eq!(c.listen.port(), 9100, "flag wins");
        assert_eq!(
            secrecy::ExposeSecret::expose_secret(&c.token_secret),
            "file-secret-0123456789",
            "file fills the rest"
        );
        assert!(
            !format!("{c:?}").contains("file-secret"),
            "the secret must never print"
        );
        assert_eq!(c.mode, Mode::Sync);
        assert!(c.ip_limit.is_none(), "0 turns the limit off");
        assert!(c.user_limit.is_some(), "default");
        assert_eq!(c.database_url, "sqlite://data/seckill.db");
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn unknown_keys_bad_values_and_a_missing_secret_are_errors() {
        let typo = write("listen_addr = \"127.0.0.1:1\"\n");
        let err = ServeArgs {
            config: Some(typo.clone()),
            ..Default::default()
        }
        .resolve()
        .unwrap_err();
        assert!(format!("{err:#}").contains("listen_addr"), "{err:#}");
        let bad = write("mode = \"fast\"\n");
        assert!(ServeArgs {
            config: Some(bad.clone()),
            ..Default::default()
        }
        .resolve()
        .is_err());
        let err = ServeArgs::default().resolve().unwrap_err();
        assert!(err.to_string().contains("token secret"), "{err}");
        for p in [typo, bad] {
            let _ = std::fs::remove_file(p);
        }
    }
}
