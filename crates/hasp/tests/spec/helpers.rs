use std::time::Duration;

use hasp::{Client, Settings};
use testkit::RedisServer;

/// One private redis-server and ways to talk to it.
pub struct Ctx {
    pub server: RedisServer,
}

impl Ctx {
    pub fn new() -> Self {
        Self {
            server: RedisServer::start(),
        }
    }

    pub async fn client(&self) -> Client {
        Client::open(&self.server.url()).await.expect("open client")
    }

    pub async fn client_with(&self, settings: Settings) -> Client {
        Client::open_with(&self.server.url(), settings)
            .await
            .expect("open client")
    }

    /// A client whose watchdog timeout is short enough to test.
    pub async fn fast_watchdog_client(&self, timeout: Duration) -> Client {
        self.client_with(
            Settings::default()
                .set_watchdog_timeout(timeout)
                .set_response_timeout(Duration::from_millis(500)),
        )
        .await
    }

    /// A plain connection for inspecting Redis behind the library's back.
    pub async fn raw(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }
}

pub async fn query<T: redis::FromRedisValue>(
    conn: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

/// Subscribers of `channel` on the server (all clients).
pub async fn subscribers(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let reply: (String, i64) = {
        let mut cmd = redis::cmd("PUBSUB");
        cmd.arg("NUMSUB").arg(channel);
        cmd.query_async(conn).await.unwrap()
    };
    reply.1
}

/// The lock hash key and release channel of `name` under the default prefix.
pub fn lock_key(name: &str) -> String {
    let enc = name
        .replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D");
    format!("hasp:{{{enc}}}")
}

pub fn channel(name: &str) -> String {
    format!("{}:released", lock_key(name))
}

pub fn assert_not_held(err: hasp::Error) {
    assert!(
        matches!(err, hasp::Error::NotHeld { .. }),
        "expected NotHeld, got {err:?}"
    );
}

/// Whether `lock` can be taken (and is then released) within `limit`,
/// trying again while Redis answers with errors: the client recovered.
pub async fn lockable_within(lock: &hasp::Lock, limit: Duration) -> bool {
    testkit::eventually(limit, || {
        let lock = lock.clone();
        async move {
            match lock.try_lock().await {
                Ok(Some(guard)) => guard.unlock().await.is_ok(),
                _ => false,
            }
        }
    })
    .await
}
