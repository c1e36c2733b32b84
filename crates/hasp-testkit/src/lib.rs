//! What hasp's lock suites (spec, faults, family) share: the deployment
//! they run on (`HASP_SPEC_DEPLOYMENT`: one server, a cluster, or a TLS
//! server with a restricted ACL user), a test's context of servers and
//! clients, raw connections to look into Redis, and readings of a lock's
//! keys.

use std::time::Duration;

use hasp::{Client, Settings};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use testkit::{RedisCluster, RedisServer, ServerOptions, TestCa, Transport};

/// Where the suite runs: `HASP_SPEC_DEPLOYMENT=cluster` runs every test on a
/// private 3-master Redis Cluster instead of one redis-server (multi 21);
/// the tests about one server's faults then inject them into the master
/// that serves their lock. `HASP_SPEC_DEPLOYMENT=tls` runs them on one
/// server that speaks TLS only (lock 35), every client trusting a private
/// CA and logging in as a user with no more rights than
/// [`hasp::acl_rules`] gives (lock 37).
pub fn on_cluster() -> bool {
    std::env::var("HASP_SPEC_DEPLOYMENT").is_ok_and(|d| d == "cluster")
}

/// Whether the suite runs on a TLS server (see [`on_cluster`]).
pub fn on_tls() -> bool {
    std::env::var("HASP_SPEC_DEPLOYMENT").is_ok_and(|d| d == "tls")
}

/// The private CA of a TLS run, made once per test process.
pub fn test_ca() -> &'static TestCa {
    static CA: std::sync::OnceLock<TestCa> = std::sync::OnceLock::new();
    CA.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hasp-suite-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TestCa::create(dir).expect("a test CA")
    })
}

/// The user a TLS run's clients log in as, and its password.
pub const ACL_USER: &str = "locks";
const ACL_PASSWORD: &str = "locks-password";

/// The server arguments that make [`ACL_USER`], with the rules hasp
/// documents for its default prefix, and the prefix one test uses (`shop`).
fn restricted_user() -> Vec<String> {
    let rules = format!("{} ~shop:* &shop:*", hasp::acl_rules("hasp"));
    ["--user", ACL_USER, "on", &format!(">{ACL_PASSWORD}")]
        .into_iter()
        .map(str::to_owned)
        .chain(rules.split(' ').map(str::to_owned))
        .collect()
}

/// The environment variable that gives a child process the parent's CA.
pub const CA_FILE_VAR: &str = "HASP_TEST_CA_FILE";

/// The CA certificate clients trust on a TLS run: the parent's, in a
/// child process.
pub fn ca_file() -> std::path::PathBuf {
    match std::env::var_os(CA_FILE_VAR) {
        Some(file) => file.into(),
        None if on_tls() => test_ca().ca_file(),
        None => std::path::PathBuf::new(), // a plain run trusts nothing
    }
}

/// `settings` trusting the test CA on a TLS run.
pub fn with_trust(settings: Settings) -> Settings {
    if !on_tls() {
        return settings;
    }
    settings.set_tls(
        hasp::Tls::new()
            .with_ca_file(ca_file())
            .expect("the test CA"),
    )
}

enum Deployment {
    Server(RedisServer),
    Cluster(RedisCluster),
}

/// Private Redis for one test, and ways to talk to it.
pub struct Ctx {
    deployment: Deployment,
}

impl Default for Ctx {
    fn default() -> Self {
        Self::new()
    }
}

impl Ctx {
    pub fn new() -> Self {
        Self {
            deployment: if on_cluster() {
                Deployment::Cluster(RedisCluster::start(3))
            } else if on_tls() {
                Deployment::Server(RedisServer::start_with(ServerOptions {
                    transport: Transport::Tcp,
                    tls: Some(test_ca().server_options(false)),
                    // In the configuration: it outlives a restart.
                    extra_args: restricted_user(),
                    ..ServerOptions::default()
                }))
            } else {
                Deployment::Server(RedisServer::start())
            },
        }
    }

    /// The URLs a client opens: the server's (as the restricted user on a
    /// TLS run), or the cluster's nodes.
    pub fn urls(&self) -> Vec<String> {
        match &self.deployment {
            Deployment::Server(server) if on_tls() => vec![server.url().replacen(
                "rediss://",
                &format!("rediss://{ACL_USER}:{ACL_PASSWORD}@"),
                1,
            )],
            Deployment::Server(server) => vec![server.url()],
            Deployment::Cluster(cluster) => cluster.urls(),
        }
    }

    /// Plain URLs to look at the servers behind the clients' backs (a TLS
    /// server's private unix socket).
    pub fn control_urls(&self) -> Vec<String> {
        match &self.deployment {
            Deployment::Server(server) => vec![server.control_url()],
            Deployment::Cluster(cluster) => cluster.urls(),
        }
    }

    /// The one server (suites that never run on a cluster: the faults suite).
    #[allow(dead_code)] // the faults suite shares this file; the spec suite does not call it
    pub fn server(&self) -> &RedisServer {
        match &self.deployment {
            Deployment::Server(server) => server,
            Deployment::Cluster(_) => panic!("this test needs one server, not a cluster"),
        }
    }

    /// The one server, to kill or restart.
    #[allow(dead_code)] // as `server`
    pub fn server_mut(&mut self) -> &mut RedisServer {
        match &mut self.deployment {
            Deployment::Server(server) => server,
            Deployment::Cluster(_) => panic!("this test needs one server, not a cluster"),
        }
    }

    /// The server that holds lock `name`: the one server, or the master of
    /// the lock's slot.
    pub fn server_of(&mut self, name: &str) -> &mut RedisServer {
        match &mut self.deployment {
            Deployment::Server(server) => server,
            Deployment::Cluster(cluster) => {
                let slot: u16 = cluster.nodes[0]
                    .cli(&["CLUSTER", "KEYSLOT", &lock_key(name)])
                    .parse()
                    .expect("a slot");
                let port = cluster.master_of(slot).port();
                cluster
                    .nodes
                    .iter_mut()
                    .find(|n| n.port() == port)
                    .expect("the master is a node")
            }
        }
    }

    pub async fn client(&self) -> Client {
        self.client_with(Settings::default()).await
    }

    pub async fn client_with(&self, settings: Settings) -> Client {
        open(&self.urls(), settings).await.expect("open client")
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

    /// A plain connection for inspecting Redis behind the library's back
    /// (on a cluster: routed by key; `KEYS`, `FUNCTION FLUSH` and the like go
    /// to every node).
    pub async fn raw(&self) -> Raw {
        match &self.deployment {
            Deployment::Server(server) => Raw::Server(
                redis::Client::open(server.control_url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            ),
            Deployment::Cluster(cluster) => Raw::Cluster(
                redis::cluster::ClusterClient::new(cluster.urls())
                    .unwrap()
                    .get_async_connection()
                    .await
                    .unwrap(),
            ),
        }
    }

    /// Calls of the batch function (`FCALL`) the servers have run so far, every node
    /// together.
    pub async fn batch_calls(&self) -> u64 {
        self.command_calls("fcall").await
    }

    /// Calls of `command` (lower case) the servers have run so far, every
    /// node together.
    pub async fn command_calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        let mut calls = 0;
        for url in self.control_urls() {
            let mut conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
                .unwrap();
            calls += info
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
        }
        calls
    }
}

/// A client of `urls`: one server's URL, or a cluster's seeds.
pub async fn open(urls: &[String], settings: Settings) -> hasp::Result<Client> {
    let settings = with_trust(settings);
    if on_cluster() {
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        Client::open_cluster(&seeds, settings).await
    } else {
        Client::open_with(&urls[0], settings).await
    }
}

/// A raw connection: one server's, or a cluster's.
#[derive(Clone)]
pub enum Raw {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Raw {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Raw::Server(c) => c.req_packed_command(cmd),
            Raw::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Raw::Server(c) => c.req_packed_commands(cmd, offset, count),
            Raw::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Raw::Server(c) => c.get_db(),
            Raw::Cluster(c) => c.get_db(),
        }
    }
}

pub async fn query<T: redis::FromRedisValue>(conn: &mut Raw, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

/// Subscribers of `channel` on the server (all clients); on a cluster, of
/// the sharded channel on every node.
pub async fn subscribers(conn: &mut Raw, channel: &str) -> i64 {
    let sub = if on_cluster() {
        "SHARDNUMSUB"
    } else {
        "NUMSUB"
    };
    let reply: Value = redis::cmd("PUBSUB")
        .arg(sub)
        .arg(channel)
        .query_async(conn)
        .await
        .unwrap();
    let counts: std::collections::HashMap<String, i64> = redis::from_redis_value(reply).unwrap();
    counts.get(channel).copied().unwrap_or(0)
}

/// Every channel someone subscribes to (sharded ones on a cluster).
pub async fn channels(conn: &mut Raw) -> Vec<String> {
    let sub = if on_cluster() {
        "SHARDCHANNELS"
    } else {
        "CHANNELS"
    };
    query(conn, &["PUBSUB", sub]).await
}

/// A lock as Redis holds it: its value `<count> <nonce> <flag> <owner>`.
#[derive(Debug, PartialEq, Eq)]
pub struct Hold {
    pub count: u32,
    /// The id of the client whose tasks wait, `*` for several, `-` for none.
    pub flag: String,
    pub owner: String,
}

/// The hold Redis has for lock `name`, if any.
pub async fn hold_in_redis(raw: &mut Raw, name: &str) -> Option<Hold> {
    let value: Option<String> = query(raw, &["GET", &lock_key(name)]).await;
    let value = value?;
    let mut fields = value.splitn(4, ' ');
    let count = fields.next().and_then(|c| c.parse().ok());
    let (_nonce, flag) = (fields.next(), fields.next());
    // The owner may hold spaces; the token comes last.
    let owner = fields
        .next()
        .and_then(|rest| rest.rsplit_once(' '))
        .map(|(owner, _token)| owner);
    match (count, flag, owner) {
        (Some(count), Some(flag), Some(owner)) => Some(Hold {
            count,
            flag: flag.to_owned(),
            owner: owner.to_owned(),
        }),
        _ => panic!("not a lock's value: {value:?}"),
    }
}

/// The lock key and release channel of `name` under the default prefix.
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

/// Whether the server offers conditional commands (`DELIFEQ`: Valkey 9).
pub async fn has_conditional_commands(raw: &mut Raw) -> bool {
    let reply: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .query_async(raw)
        .await
        .unwrap();
    matches!(reply, redis::Value::Array(entries) if entries.first().is_some_and(|e| *e != redis::Value::Nil))
}
