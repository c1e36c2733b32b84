//! A private `redis-server` process.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::LaunchError;

/// How a server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A unix socket in the server's private temporary directory (the default:
    /// no port can clash with another server or with a system Redis).
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
    /// The server binary (`None`: `$REDIS_SERVER`, else `redis-server`);
    /// `valkey-server` takes the same arguments.
    pub binary: Option<PathBuf>,
    /// Serve TLS only, on the TCP port (`rediss://`); the launcher itself
    /// talks to the server on a private unix socket beside it.
    pub tls: Option<TlsOptions>,
}

/// A TLS server's certificate, key and CA (PEM files; see
/// [`TestCa`](crate::tls::TestCa)).
#[derive(Debug, Clone)]
pub struct TlsOptions {
    /// The server's certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The CA clients' certificates (and replicas' masters') must chain to.
    pub ca: PathBuf,
    /// Whether clients must present a certificate of that CA
    /// (`tls-auth-clients yes`).
    pub client_certs: bool,
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
            binary: None,
            tls: None,
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

pub(crate) fn redis_server_binary() -> PathBuf {
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

/// A TCP port free on 127.0.0.1 right now (0 if none could be found: the
/// server's start then fails with a clear error).
pub fn free_tcp_port() -> u16 {
    // Binding port 0 asks the kernel for a free port; we release it right
    // away and hand it to redis-server. The window for a clash is tiny and a
    // clash fails loudly at start-up rather than silently.
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(0, |a| a.port())
}

/// Whether a start failed because a port was taken between choosing it and
/// binding it.
pub(crate) fn is_port_clash(e: &LaunchError) -> bool {
    e.to_string().contains("Address already in use")
}

pub(crate) fn unique_dir() -> Result<PathBuf, LaunchError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("hasp-redis-{}-{}", std::process::id(), n));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| LaunchError::io("creating a directory for redis-server", e))?;
    Ok(dir)
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
    ///
    /// # Panics
    /// As [`RedisServer::try_start_with`] fails (for tests).
    pub fn start_with(options: ServerOptions) -> Self {
        Self::try_start_with(options).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server with the given options, in a private directory that
    /// holds its data and log.
    ///
    /// # Errors
    /// [`LaunchError`] if `redis-server` is missing (the message says how to
    /// install it), exits, or does not answer within 10 s (60 s while it
    /// loads its data).
    pub fn try_start_with(options: ServerOptions) -> Result<Self, LaunchError> {
        // A free port can be taken by another process before redis-server
        // binds it (tests start servers in parallel): then try another.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let port = match (options.transport, &options.tls) {
                (Transport::Tcp, _) | (_, Some(_)) => Some(free_tcp_port()),
                (Transport::Unix, None) => None,
            };
            let mut server = Self {
                child: None,
                dir: unique_dir()?,
                port,
                options: options.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) if attempts < 5 && is_port_clash(&e) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The unix socket path (meaningful for [`Transport::Unix`]).
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    fn spawn(&mut self) -> Result<(), LaunchError> {
        let binary = self
            .options
            .binary
            .clone()
            .unwrap_or_else(redis_server_binary);
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
        match (self.port, &self.options.tls) {
            (Some(port), Some(tls)) => {
                cmd.arg("--port")
                    .arg("0")
                    .arg("--tls-port")
                    .arg(port.to_string())
                    .arg("--bind")
                    .arg("127.0.0.1")
                    .arg("--tls-cert-file")
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca)
                    .arg("--tls-auth-clients")
                    .arg(if tls.client_certs { "yes" } else { "no" })
                    .arg("--tls-replication")
                    .arg("yes")
                    // The launcher's own way in (pings, redis-cli).
                    .arg("--unixsocket")
                    .arg(self.socket_path())
                    .arg("--unixsocketperm")
                    .arg("700");
            }
            (Some(port), None) => {
                cmd.arg("--port")
                    .arg(port.to_string())
                    .arg("--bind")
                    .arg("127.0.0.1");
            }
            (None, _) => {
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
        let log = std::fs::File::create(self.dir.join("redis.log"))
            .map_err(|e| LaunchError::io("creating redis.log", e))?;
        cmd.stdin(Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(|e| LaunchError::io("opening redis.log", e))?,
            )
            .stderr(log);
        let mut child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(LaunchError::Missing(format!(
                    "`{}` not found: redis-server is needed. Run `scripts/ensure-deps.sh` \
                     (installs Debian's redis-server with apt-get) or set REDIS_SERVER=/path/to/redis-server",
                    binary.display()
                )))
            }
            Err(e) => return Err(LaunchError::io("starting redis-server", e)),
        };
        // 10 s to start; loading a large data set on a loaded machine may
        // take longer, up to a minute.
        let started = Instant::now();
        let mut deadline = started + Duration::from_secs(10);
        while !self.answers_ping() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LaunchError::Failed(format!(
                    "redis-server exited with {status}: {}",
                    self.log()
                )));
            }
            if Instant::now() >= deadline && self.is_loading() {
                deadline = (Instant::now() + Duration::from_secs(1))
                    .min(started + Duration::from_secs(60));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(LaunchError::Failed(format!(
                    "redis-server did not answer PING in time (10 s; 60 s while loading): {}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.child = Some(child);
        Ok(())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Whether the server answers an inline PING right now.
    fn answers_ping(&self) -> bool {
        self.ping_reply()
            .is_some_and(|r| r.starts_with(b"+PONG") || r.starts_with(b"-NOAUTH"))
    }

    /// Whether the server is up but still loading its data: it says so,
    /// or it took the connection and is too busy to answer within the
    /// ping's 200 ms (between chunks of loading, on a loaded machine).
    fn is_loading(&self) -> bool {
        self.ping_reply()
            .is_some_and(|r| r.starts_with(b"-LOADING") || r.is_empty())
    }

    /// The start of the server's answer to an inline PING, if it took the
    /// connection: empty if no answer came in time.
    fn ping_reply(&self) -> Option<Vec<u8>> {
        fn ping(mut stream: impl Read + Write) -> Option<Vec<u8>> {
            let mut reply = [0u8; 64];
            stream.write_all(b"PING\r\n").ok()?;
            match stream.read(&mut reply) {
                // Closed without a word.
                Ok(0) => None,
                Ok(n) => Some(reply[..n].to_vec()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    Some(Vec::new())
                }
                Err(_) => None,
            }
        }
        let timeout = Some(Duration::from_millis(200));
        match self.port.filter(|_| self.options.tls.is_none()) {
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
            Some(port) if self.options.tls.is_some() => {
                format!("rediss://{auth}127.0.0.1:{port}/")
            }
            Some(port) => format!("redis://{auth}127.0.0.1:{port}/"),
            None => match &self.options.password {
                Some(p) => format!("redis+unix://{}?pass={p}", self.socket_path().display()),
                None => format!("redis+unix://{}", self.socket_path().display()),
            },
        }
    }

    /// A plain URL for looking at the server behind a client's back: its
    /// [`url`](Self::url), or for a TLS server its private unix socket.
    pub fn control_url(&self) -> String {
        match &self.options.tls {
            Some(_) => match &self.options.password {
                Some(p) => format!("redis+unix://{}?pass={p}", self.socket_path().display()),
                None => format!("redis+unix://{}", self.socket_path().display()),
            },
            None => self.url(),
        }
    }

    /// Whether the server speaks TLS on its TCP port.
    pub fn is_tls(&self) -> bool {
        self.options.tls.is_some()
    }

    /// Arguments that point `redis-cli` / `redis-benchmark` at this server.
    pub fn cli_args(&self) -> Vec<String> {
        let mut args = match self.port.filter(|_| self.options.tls.is_none()) {
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

    /// The TCP port, for a server started with [`Transport::Tcp`] or TLS.
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
            tls: primary.options.tls.clone(),
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
            // The process is our child and runs: only a missing `kill`
            // could fail here, and then the fault is simply not injected.
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(pid.to_string())
                .status();
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

    /// Kills the server if it runs and starts it again on the same address
    /// and directory (its data survives only if it persists it).
    ///
    /// # Panics
    /// As [`RedisServer::try_restart`] fails (for tests).
    pub fn restart(&mut self) {
        self.try_restart().unwrap_or_else(|e| panic!("{e}"));
    }

    /// As [`RedisServer::restart`].
    ///
    /// # Errors
    /// [`LaunchError`] if the port stays taken for 10 s or the server does
    /// not start.
    pub fn try_restart(&mut self) -> Result<(), LaunchError> {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // A TCP port can linger briefly after the kill; retry until free.
            match self.port {
                Some(port) if TcpListener::bind(("127.0.0.1", port)).is_err() => {
                    if Instant::now() >= deadline {
                        return Err(LaunchError::Failed(format!("port {port} never freed")));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => break,
            }
        }
        self.spawn()
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

    /// Runs a `redis-cli` command against this server and returns its
    /// output (empty if `redis-cli` could not run).
    pub fn cli(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(self.cli_args())
            .args(args)
            .output()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
            .unwrap_or_default()
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
