//! A private Sentinel group: a master, its replicas, and sentinels
//! watching them as one service.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::redis::{free_tcp_port, redis_server_binary, unique_dir};
use crate::redis::{RedisServer, ServerOptions, TlsOptions, Transport};

/// The service name the sentinels of a [`SentinelGroup`] watch.
pub const SERVICE: &str = "hasp";

/// One `redis-server --sentinel` process, killed when dropped.
#[derive(Debug)]
pub struct Sentinel {
    child: Child,
    dir: PathBuf,
    port: u16,
    /// Its TLS port, when the group speaks TLS.
    tls_port: Option<u16>,
}

impl Sentinel {
    fn start(master_port: u16, quorum: usize, tls: Option<&TlsOptions>) -> Self {
        let dir = unique_dir().expect("create a directory for a sentinel");
        let port = free_tcp_port();
        let tls_port = tls.map(|_| free_tcp_port());
        let config = dir.join("sentinel.conf");
        let mut text = format!(
            "port {port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor {SERVICE} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {SERVICE} 1000\n\
             sentinel failover-timeout {SERVICE} 3000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            dir.display()
        );
        if let (Some(tls), Some(tls_port)) = (tls, tls_port) {
            // Clients over TLS on its TLS port, and TLS to the servers it
            // watches; the plain port stays for the launcher's own checks.
            text.push_str(&format!(
                "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                tls.cert.display(),
                tls.key.display(),
                tls.ca.display()
            ));
        }
        std::fs::write(&config, text).expect("write sentinel.conf");
        let log = std::fs::File::create(dir.join("sentinel.log")).expect("create sentinel.log");
        let child = Command::new(redis_server_binary())
            .arg(&config)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("start redis-server --sentinel");
        let sentinel = Self {
            child,
            dir,
            port,
            tls_port,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sentinel.cli(&["PING"]).contains("PONG") {
            assert!(Instant::now() < deadline, "sentinel did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    /// The sentinel's URL (`rediss://` on its TLS port in a TLS group).
    pub fn url(&self) -> String {
        match self.tls_port {
            Some(port) => format!("rediss://127.0.0.1:{port}/"),
            None => format!("redis://127.0.0.1:{}/", self.port),
        }
    }

    /// Runs `redis-cli` against this sentinel; returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1"])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master, `replicas` replicas and `sentinels` sentinels (quorum: a
/// majority of them), all private; stopped when dropped.
#[derive(Debug)]
pub struct SentinelGroup {
    /// The sentinels.
    pub sentinels: Vec<Sentinel>,
    /// The servers: the master first at start; after a failover, ask
    /// [`master_port`](Self::master_port).
    pub servers: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Starts the group and returns once every sentinel knows the master
    /// and its replicas.
    pub fn start(replicas: usize, sentinels: usize) -> Self {
        Self::start_with_tls(replicas, sentinels, None)
    }

    /// As [`start`](Self::start), every server and sentinel speaking TLS
    /// with `tls`'s certificates (the sentinels to the servers too) when
    /// given.
    pub fn start_with_tls(replicas: usize, sentinels: usize, tls: Option<TlsOptions>) -> Self {
        let master = RedisServer::start_with(ServerOptions {
            transport: Transport::Tcp,
            tls: tls.clone(),
            ..ServerOptions::default()
        });
        let master_port = master.port().expect("tcp");
        let mut servers = vec![master];
        for _ in 0..replicas {
            let replica = RedisServer::start_replica_of(&servers[0]);
            servers.push(replica);
        }
        let sentinels: Vec<Sentinel> = (0..sentinels)
            .map(|_| Sentinel::start(master_port, sentinels / 2 + 1, tls.as_ref()))
            .collect();
        let group = Self { sentinels, servers };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !group.sentinels.iter().all(|s| {
            let known = s.cli(&["SENTINEL", "REPLICAS", SERVICE]);
            known.lines().filter(|l| l.trim() == "ip").count() >= replicas
        }) {
            assert!(Instant::now() < deadline, "sentinels never saw the group");
            std::thread::sleep(Duration::from_millis(50));
        }
        group
    }

    /// The sentinels' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// The master's port, as the first sentinel reports it.
    pub fn master_port(&self) -> u16 {
        let out = self.sentinels[0].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]);
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .expect("a master address")
    }

    /// The server that is master now.
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port();
        self.servers
            .iter()
            .find(|s| s.port() == Some(port))
            .expect("the master is one of the group's servers")
    }

    /// Waits (up to `limit`) until the server on `port` follows the current
    /// master with its link up, as a demoted master does once a sentinel
    /// has reconfigured it and it has synchronised; returns whether it did.
    pub fn wait_until_replica(&self, port: u16, limit: Duration) -> bool {
        let Some(server) = self.servers.iter().find(|s| s.port() == Some(port)) else {
            return false;
        };
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let role = server.cli(&["ROLE"]);
            let mut lines = role.lines().map(str::trim);
            if lines.next() == Some("slave")
                && lines.nth(1).and_then(|p| p.parse().ok()) == Some(self.master_port())
                && lines.next() == Some("connected")
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Forces a failover (`SENTINEL FAILOVER`) and returns once a replica
    /// is master and the sentinel reports it (the old master is demoted
    /// later, when a sentinel next polls it); returns the new master's
    /// port.
    pub fn failover(&self) -> u16 {
        let old = self.master_port();
        let deadline = Instant::now() + Duration::from_secs(20);
        // A sentinel learns of the replicas from the master's INFO, every
        // few seconds: until it has seen one with its link up it answers
        // NOGOODSLAVE, and a busy machine stretches that.
        loop {
            let reply = self.sentinels[0].cli(&["SENTINEL", "FAILOVER", SERVICE]);
            if reply.contains("OK") {
                break;
            }
            assert!(
                reply.contains("NOGOODSLAVE") && Instant::now() < deadline,
                "SENTINEL FAILOVER: {reply}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        loop {
            let now = self.master_port();
            if now != old {
                let new_master = self.servers.iter().find(|s| s.port() == Some(now));
                if new_master.is_some_and(|s| s.cli(&["ROLE"]).starts_with("master")) {
                    return now;
                }
            }
            assert!(Instant::now() < deadline, "the failover did not complete");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
