//! Test support shared by every crate in the workspace: real `redis-server`
//! processes started per test (or per suite), on private unix sockets or free
//! TCP ports, killed and cleaned up on drop.
//!
//! Fault tests need more than start/stop, so a [`RedisServer`] can also be
//! paused (`SIGSTOP`), resumed (`SIGCONT`), killed (`SIGKILL`) and restarted on
//! the same address.
//!
//! ```no_run
//! let server = testkit::RedisServer::start();
//! let url = server.url(); // "redis+unix:///tmp/.../redis.sock"
//! # let _ = url;
//! ```

mod checker;
mod proxy;
mod sentinel;
mod sql;
pub use checker::{now_us, write_at, Event, FencedRegister, History, RegisterClient, Report};
pub use proxy::{Direction, FaultProxy, Mode};
pub use sentinel::{Sentinel, SentinelGroup, SERVICE as SENTINEL_SERVICE};
pub use sql::{MariaDbServer, PostgresServer};

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How a test server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A unix socket in the server's private temporary directory (the default:
    /// no port can clash with another test or with a system Redis).
    Unix,
    /// A free TCP port on 127.0.0.1.
    Tcp,
}

/// Options for [`RedisServer::start_with`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Unix socket or TCP.
    pub transport: Transport,
    /// `requirepass`, if any.
    pub password: Option<String>,
    /// Extra `--name value` arguments passed to redis-server.
    pub extra_args: Vec<String>,
    /// TCP port of a primary on 127.0.0.1 to replicate (`--replicaof`).
    pub replica_of: Option<u16>,
}

impl ServerOptions {
    /// These options with the append-only file on, synced as `fsync` says
    /// (`always`, `everysec` or `no`): a [`RedisServer::restart`] then
    /// keeps the data.
    pub fn with_aof(mut self, fsync: &str) -> Self {
        self.extra_args.extend([
            "--appendonly".into(),
            "yes".into(),
            "--appendfsync".into(),
            fsync.into(),
        ]);
        self
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            transport: Transport::Unix,
            password: None,
            extra_args: Vec::new(),
            replica_of: None,
        }
    }
}

/// A private `redis-server` process, killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    dir: PathBuf,
    port: Option<u16>,
    options: ServerOptions,
}

fn redis_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(path);
    }
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let candidate = Path::new(dir).join("redis-server");
        if candidate.exists() {
            return candidate;
        }
    }
    PathBuf::from("redis-server")
}

fn free_tcp_port() -> u16 {
    // Binding port 0 asks the kernel for a free port; we release it right
    // away and hand it to redis-server. The window for a clash is tiny and a
    // clash fails loudly at start-up rather than silently.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

fn unique_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hasp-redis-{}-{}", std::process::id(), n));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir for redis-server");
    dir
}

impl RedisServer {
    /// Starts a server on a private unix socket with no persistence.
    ///
    /// # Panics
    /// If `redis-server` is missing (with a message saying how to install it)
    /// or does not become ready within 10 s.
    pub fn start() -> Self {
        Self::start_with(ServerOptions::default())
    }

    /// Starts a server on a free TCP port on 127.0.0.1.
    pub fn start_tcp() -> Self {
        Self::start_with(ServerOptions {
            transport: Transport::Tcp,
            ..ServerOptions::default()
        })
    }

    /// Starts a server with the given options.
    pub fn start_with(options: ServerOptions) -> Self {
        let port = match options.transport {
            Transport::Tcp => Some(free_tcp_port()),
            Transport::Unix => None,
        };
        let mut server = Self {
            child: None,
            dir: unique_dir(),
            port,
            options,
        };
        server.spawn();
        server
    }

    pub(crate) fn socket_path(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    fn spawn(&mut self) {
        let binary = redis_server_binary();
        let mut cmd = Command::new(&binary);
        cmd.arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--daemonize")
            .arg("no")
            .arg("--loglevel")
            .arg("warning")
            // DEBUG SLEEP is one of the fault tests' nemeses.
            .arg("--enable-debug-command")
            .arg("local");
        match self.port {
            Some(port) => {
                cmd.arg("--port")
                    .arg(port.to_string())
                    .arg("--bind")
                    .arg("127.0.0.1");
            }
            None => {
                cmd.arg("--port")
                    .arg("0")
                    .arg("--unixsocket")
                    .arg(self.socket_path())
                    .arg("--unixsocketperm")
                    .arg("700");
            }
        }
        if let Some(password) = &self.options.password {
            cmd.arg("--requirepass").arg(password);
            cmd.arg("--masterauth").arg(password);
        }
        if let Some(port) = self.options.replica_of {
            cmd.arg("--replicaof")
                .arg("127.0.0.1")
                .arg(port.to_string());
        }
        for arg in &self.options.extra_args {
            cmd.arg(arg);
        }
        let log = std::fs::File::create(self.dir.join("redis.log")).expect("create redis.log");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log);
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "`{}` not found: the tests need redis-server. Run `scripts/ensure-deps.sh` \
                 (installs Debian's redis-server with apt-get) or set REDIS_SERVER=/path/to/redis-server",
                binary.display()
            ),
            Err(e) => panic!("failed to start {}: {e}", binary.display()),
        };
        // 10 s to start; loading a large data set on a loaded machine may
        // take longer, up to a minute.
        let started = Instant::now();
        let mut deadline = started + Duration::from_secs(10);
        while !self.answers_ping() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("redis-server exited with {status}: {}", self.log());
            }
            if Instant::now() >= deadline && self.is_loading() {
                deadline = (Instant::now() + Duration::from_secs(1))
                    .min(started + Duration::from_secs(60));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!(
                    "redis-server did not answer PING in time (10 s; 60 s while loading): {}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Whether the server answers an inline PING right now.
    fn answers_ping(&self) -> bool {
        self.ping_reply()
            .is_some_and(|r| r.starts_with(b"+PONG") || r.starts_with(b"-NOAUTH"))
    }

    /// Whether the server is up but still loading its data.
    fn is_loading(&self) -> bool {
        self.ping_reply()
            .is_some_and(|r| r.starts_with(b"-LOADING"))
    }

    /// The start of the server's answer to an inline PING, if it answers.
    fn ping_reply(&self) -> Option<Vec<u8>> {
        fn ping(mut stream: impl Read + Write) -> Option<Vec<u8>> {
            let mut reply = [0u8; 64];
            stream.write_all(b"PING\r\n").ok()?;
            let n = stream.read(&mut reply).ok()?;
            Some(reply[..n].to_vec())
        }
        let timeout = Some(Duration::from_millis(200));
        match self.port {
            Some(port) => {
                let s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
                s.set_read_timeout(timeout).ok()?;
                ping(s)
            }
            None => {
                let s = std::os::unix::net::UnixStream::connect(self.socket_path()).ok()?;
                s.set_read_timeout(timeout).ok()?;
                ping(s)
            }
        }
    }

    /// A URL for the `redis` crate (and so for `hasp::Client::open`).
    pub fn url(&self) -> String {
        let auth = self
            .options
            .password
            .as_ref()
            .map(|p| format!(":{p}@"))
            .unwrap_or_default();
        match self.port {
            Some(port) => format!("redis://{auth}127.0.0.1:{port}/"),
            None => match &self.options.password {
                Some(p) => format!("redis+unix://{}?pass={p}", self.socket_path().display()),
                None => format!("redis+unix://{}", self.socket_path().display()),
            },
        }
    }

    /// Arguments that point `redis-cli` / `redis-benchmark` at this server.
    pub fn cli_args(&self) -> Vec<String> {
        let mut args = match self.port {
            Some(port) => vec![
                "-p".into(),
                port.to_string(),
                "-h".into(),
                "127.0.0.1".into(),
            ],
            None => vec!["-s".into(), self.socket_path().display().to_string()],
        };
        if let Some(password) = &self.options.password {
            args.extend(["-a".into(), password.clone(), "--no-auth-warning".into()]);
        }
        args
    }

    /// The TCP port, for a server started with [`Transport::Tcp`].
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Starts a replica of `primary` (which must use TCP: replication has no
    /// unix-socket form) and waits until its link to the primary is up.
    pub fn start_replica_of(primary: &RedisServer) -> RedisServer {
        let port = primary.port.expect("replication needs a TCP primary");
        let replica = Self::start_with(ServerOptions {
            transport: Transport::Tcp,
            password: primary.options.password.clone(),
            replica_of: Some(port),
            ..ServerOptions::default()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(
                Instant::now() < deadline,
                "replica never linked to its primary"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        replica
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(pid.to_string())
                .status()
                .expect("run kill");
            assert!(status.success(), "kill -{signal} {pid} failed");
        }
    }

    /// Freezes the server (`SIGSTOP`): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Resumes a paused server (`SIGCONT`).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Kills the server (`SIGKILL`) and waits for it to exit. Its data is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket_path());
    }

    /// Starts the server again on the same address after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // A TCP port can linger briefly after the kill; retry until free.
            match self.port {
                Some(port) if TcpListener::bind(("127.0.0.1", port)).is_err() => {
                    assert!(Instant::now() < deadline, "port {port} never freed");
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => break,
            }
        }
        self.spawn();
    }

    /// Blocks the server for `seconds` with `DEBUG SLEEP` (returns when it
    /// is over). Unlike [`pause`](Self::pause), time runs on inside Redis:
    /// keys expire meanwhile as they would.
    pub fn debug_sleep(&self, seconds: f64) {
        self.cli(&["DEBUG", "SLEEP", &seconds.to_string()]);
    }

    /// Holds every client's commands for `millis` (`CLIENT PAUSE … ALL`);
    /// returns at once. Keys do not expire meanwhile.
    pub fn client_pause(&self, millis: u64) {
        self.cli(&["CLIENT", "PAUSE", &millis.to_string(), "ALL"]);
    }

    /// Runs a `redis-cli` command against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(self.cli_args())
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused server ignores SIGTERM but not SIGKILL; kill is what we want.
            self.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Several independent servers at once (for MultiLock/RedLock tests).
pub fn start_servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
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

/// One line of `CLUSTER NODES`: port, whether a master, slot ranges.
type NodeView = (u16, bool, Vec<(u16, u16)>);

/// A Redis Cluster of private servers on free TCP ports, every slot
/// assigned, no replicas; stopped when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes, each a master of a share of the slots.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as Redis requires) and joins them
    /// with `redis-cli --cluster create`; returns once the cluster is ok.
    pub fn start(masters: usize) -> Self {
        Self::start_with_replicas(masters, 0)
    }

    /// As [`start`](Self::start), with `replicas` replicas per master;
    /// returns once the cluster is ok and every replica is linked.
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Self {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(ServerOptions {
                    transport: Transport::Tcp,
                    extra_args: vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        "nodes.conf".into(),
                        "--cluster-node-timeout".into(),
                        "2000".into(),
                        // The bus port defaults to port + 10000, which may
                        // be taken, or past 65535 for a high free port.
                        "--cluster-port".into(),
                        free_tcp_port().to_string(),
                    ],
                    ..ServerOptions::default()
                })
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port.expect("tcp")))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                && (n.cli(&["ROLE"]).starts_with("master")
                    || n.cli(&["INFO", "replication"])
                        .contains("master_link_status:up"))
        }) {
            assert!(Instant::now() < deadline, "cluster never reached state ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// The node that is master of `slot` now (as the first answering node
    /// sees it).
    pub fn master_of(&self, slot: u16) -> &RedisServer {
        let port = self
            .nodes_view()
            .into_iter()
            .find(|(_, master, slots)| {
                *master && slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .map(|(port, _, _)| port)
            .expect("every slot has a master");
        self.node(port)
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port == Some(port))
            .expect("a node of this cluster")
    }

    /// `CLUSTER NODES` as (port, is master, slot ranges), read from the first
    /// node that answers.
    fn nodes_view(&self) -> Vec<NodeView> {
        let text = self
            .nodes
            .iter()
            .map(|n| n.cli(&["CLUSTER", "NODES"]))
            .find(|t| !t.is_empty())
            .unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                let master = fields.get(2)?.contains("master");
                let slots = fields
                    .iter()
                    .skip(8)
                    .filter(|f| !f.starts_with('['))
                    .filter_map(|range| {
                        let mut ends = range.split('-');
                        let a: u16 = ends.next()?.parse().ok()?;
                        let b: u16 = ends.next().map_or(Some(a), |b| b.parse().ok())?;
                        Some((a, b))
                    })
                    .collect();
                Some((port, master, slots))
            })
            .collect()
    }

    /// The node id of the node on `port`.
    fn id_of(&self, port: u16) -> String {
        self.node(port).cli(&["CLUSTER", "MYID"])
    }

    /// Moves `slot` (with its keys) from its master to the master on
    /// `to_port`, the way `redis-cli --cluster reshard` does: IMPORTING,
    /// MIGRATING, `MIGRATE` of every key, then `SETSLOT ... NODE` everywhere.
    pub fn migrate_slot(&self, slot: u16, to_port: u16) {
        let from = self.master_of(slot);
        let from_port = from.port.expect("tcp");
        let to = self.node(to_port);
        let (from_id, to_id) = (self.id_of(from_port), self.id_of(to_port));
        let slot_s = slot.to_string();
        to.cli(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id]);
        from.cli(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id]);
        loop {
            let keys = from.cli(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec![
                "MIGRATE".to_owned(),
                "127.0.0.1".to_owned(),
                to_port.to_string(),
                String::new(),
                "0".to_owned(),
                "5000".to_owned(),
                "KEYS".to_owned(),
            ];
            args.extend(keys.iter().map(|k| (*k).to_owned()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            from.cli(&args);
        }
        for node in &self.nodes {
            if node.cli(&["ROLE"]).starts_with("master") {
                node.cli(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
            }
        }
    }

    /// `redis://` URLs of every node (seed list for a cluster client).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
