//! Helpers for tests that drive a live service over HTTP (the service's
//! own and `seckill-tools`'): settings of a test instance, one on SQLite,
//! vouchers created and opened, purchases, and the service as a child
//! process. Built with the `testing` feature only.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::auth::{Principal, Tokens};
use crate::settings::Settings;
use serde_json::{json, Value};

/// One purchase of `voucher` by `user` at the instance `base`, with a
/// fresh token: the answer as it came (status and body unread).
pub async fn purchase(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    voucher: i64,
    user: i64,
) -> reqwest::Response {
    http.post(format!("{base}/api/vouchers/{voucher}/seckill"))
        .bearer_auth(tokens.mint(Principal::User(user), Duration::from_secs(600)))
        .send()
        .await
        .expect("the instance answers")
}

/// Settings of an in-process test instance: the defaults, listening on any
/// free port of 127.0.0.1, with no rate limits and no per-address
/// connection limit (every simulated user comes from 127.0.0.1, and tests
/// buy faster than a person).
pub fn settings(redis: impl Into<String>, database: impl Into<String>, secret: &str) -> Settings {
    let connections = crate::http::ConnectionLimits::default();
    Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        user_limit: None,
        ip_limit: None,
        connections: crate::http::ConnectionLimits {
            max_per_address: connections.max_connections,
            ..connections
        },
        // Expiry tests wait for the sweep: a tenth of a second apart.
        sweep_every: std::time::Duration::from_millis(100),
        ..Settings::new(redis, database, secret)
    }
}

/// The shipped service with [`settings`] on `redis` and a fresh SQLite file
/// in a directory of its own (`seckill-<what>-<pid>`, emptied first), and
/// that directory.
pub async fn start_on_sqlite(
    what: &str,
    redis: &testkit::RedisServer,
    secret: &str,
) -> (crate::service::Service, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("seckill-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let database = format!("sqlite://{}/shop.db", dir.display());
    let service = crate::service::Service::start(settings(redis.url(), database, secret))
        .await
        .unwrap();
    (service, dir)
}

/// Creates a voucher with `stock` units, on sale from a second ago for an
/// hour, through `base`'s API with an admin token; returns its id.
pub async fn open_voucher(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    title: &str,
    stock: i64,
) -> i64 {
    let now = now_ms();
    create_voucher(
        http,
        base,
        tokens,
        title,
        stock,
        now - 1000..now + 3_600_000,
    )
    .await
}

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Creates a voucher with `stock` units on sale during `window` (Unix
/// milliseconds) through `base`'s API with an admin token; returns its id.
pub async fn create_voucher(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    title: &str,
    stock: i64,
    window: std::ops::Range<i64>,
) -> i64 {
    create_voucher_from(
        http,
        base,
        tokens,
        json!({"title": title, "stock": stock, "begin_ms": window.start, "end_ms": window.end}),
    )
    .await
}

/// Creates a voucher from the request body `body` through `base`'s API
/// with an admin token; returns its id.
pub async fn create_voucher_from(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    body: Value,
) -> i64 {
    let voucher: Value = http
        .post(format!("{base}/api/vouchers"))
        .bearer_auth(tokens.mint(Principal::Admin, Duration::from_secs(600)))
        .json(&body)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    voucher["id"].as_i64().unwrap()
}

/// The `seckill` service binary: cargo's for this crate's tests; for
/// another crate's (the tools), the one beside the test binary's directory,
/// built by the same workspace run.
pub fn seckill_binary() -> std::path::PathBuf {
    if let Some(path) = option_env!("CARGO_BIN_EXE_seckill") {
        return path.into();
    }
    // target/<profile>/deps/<test> → target/<profile>/seckill
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("seckill");
    assert!(
        path.is_file(),
        "no seckill binary at {}: build it first (cargo build -p seckill)",
        path.display()
    );
    path
}

/// A `seckill serve` process on a free port of 127.0.0.1, killed when
/// dropped.
pub struct ServeProcess {
    child: std::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    port: u16,
    args: Vec<String>,
    secret: String,
}

impl ServeProcess {
    /// Starts `seckill serve` on `redis` and `database` as pipeline
    /// consumer `consumer`, signing tokens with `secret`; dead consumers'
    /// entries are taken over after 500 ms; no per-IP limit. Returns once
    /// it answers `/healthz`.
    pub async fn start(redis: &str, database: &str, consumer: &str, secret: &str) -> Self {
        Self::start_with(redis, database, consumer, secret, &[]).await
    }

    /// [`ServeProcess::start`] with `extra` flags after the others.
    pub async fn start_with(
        redis: &str,
        database: &str,
        consumer: &str,
        secret: &str,
        extra: &[&str],
    ) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let args: Vec<String> = [
            "serve",
            "--redis-url",
            redis,
            "--database-url",
            database,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--consumer",
            consumer,
            "--reclaim-idle-ms",
            "500",
            "--ip-rate",
            "0",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        let child = Self::spawn(&args, secret);
        let serve = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            port,
            args,
            secret: secret.to_owned(),
        };
        serve.wait_healthy().await;
        serve
    }

    fn spawn(args: &[String], secret: &str) -> std::process::Child {
        std::process::Command::new(seckill_binary())
            .args(args)
            .env("SECKILL_TOKEN_SECRET", secret)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start seckill serve")
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits (up to 30 s) until it answers `/healthz`.
    pub async fn wait_healthy(&self) {
        let http = reqwest::Client::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while http
            .get(format!("{}/healthz", self.base))
            .send()
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "service never became healthy"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends signal `sig` (`STOP`, `KILL`, `TERM`, ...).
    pub fn signal(&self, sig: &str) {
        assert!(std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success());
    }

    /// Sends `sig` and waits for the process to end.
    pub fn end(&mut self, sig: &str) {
        self.signal(sig);
        self.child.wait().unwrap();
    }

    /// Starts it again on the same port, after [`ServeProcess::end`].
    pub async fn restart(&mut self) {
        self.child = Self::spawn(&self.args, &self.secret);
        self.wait_healthy().await;
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
