//! Test support shared by every crate in the workspace: the private servers
//! of the `launcher` crate (re-exported here), fault injection
//! ([`FaultProxy`]), the fenced register and history checker of the fault
//! suites, and small waiting helpers.
//!
//! ```no_run
//! let server = testkit::RedisServer::start();
//! let url = server.url(); // "redis+unix:///tmp/.../redis.sock"
//! # let _ = url;
//! ```

mod checker;
mod proxy;
pub use checker::{now_us, write_at, Event, FencedRegister, History, RegisterClient, Report};
pub use launcher::{
    free_tcp_port, CertificateUse, ChromeDriver, JwtKey, JwtKeyKind, LaunchError, MariaDbServer,
    PostgresServer, RedisCluster, RedisServer, Sentinel, SentinelGroup, ServerOptions, TestCa,
    TlsOptions, Transport, SENTINEL_SERVICE,
};
pub use proxy::{Direction, FaultProxy, Mode};

use std::time::{Duration, Instant};

/// Several independent servers at once (for MultiLock/RedLock tests).
pub fn start_servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

/// Shows the library's `tracing` logs in a test's output when `RUST_LOG` is
/// set (for example `RUST_LOG=hasp=debug`); does nothing otherwise, and
/// nothing on a second call. Printed through the test harness' capture, so
/// only a failing test's logs are shown.
pub fn logs() {
    if std::env::var_os("RUST_LOG").is_none() {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Polls `check` until it returns true or `limit` passes; returns whether it
/// did. For conditions that live in another process (a Redis server's
/// subscription count, a key's existence) where there is no event to await.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Raises this process' soft limit of open files to at least `wanted` (up
/// to the hard limit) and returns the limit now in force: tests that open
/// thousands of connections must not depend on a machine's default of 1,024.
pub fn raise_open_files_limit(wanted: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        }
    }
    limit.rlim_cur
}
