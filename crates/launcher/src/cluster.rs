//! A private Redis Cluster.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::LaunchError;
use crate::redis::free_tcp_port;
use crate::redis::{RedisServer, ServerOptions, TlsOptions, Transport};

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
    ///
    /// # Panics
    /// As [`RedisCluster::try_start`] fails (for tests).
    pub fn start(masters: usize) -> Self {
        Self::start_with_replicas(masters, 0)
    }

    /// As [`start`](Self::start), with `replicas` replicas per master;
    /// returns once the cluster is ok and every replica is linked.
    ///
    /// # Panics
    /// As [`RedisCluster::try_start_with_replicas`] fails (for tests).
    pub fn start_with_replicas(masters: usize, replicas: usize) -> Self {
        Self::try_start_with_replicas(masters, replicas).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`start`](Self::start).
    ///
    /// # Errors
    /// As [`RedisCluster::try_start_with_replicas`].
    pub fn try_start(masters: usize) -> Result<Self, LaunchError> {
        Self::try_start_with_replicas(masters, 0)
    }

    /// As [`start_with_replicas`](Self::start_with_replicas).
    ///
    /// # Errors
    /// [`LaunchError`] for fewer than 3 masters, a node that does not start,
    /// a failed `redis-cli --cluster create`, or a cluster not ok in 20 s.
    pub fn try_start_with_replicas(masters: usize, replicas: usize) -> Result<Self, LaunchError> {
        Self::try_start_with_tls(masters, replicas, None)
    }

    /// As [`start_with_replicas`](Self::start_with_replicas), every node
    /// speaking TLS with `tls`'s certificates when given: to clients, and
    /// between the nodes (`tls-cluster yes`: the nodes announce their TLS
    /// ports).
    ///
    /// # Errors
    /// As [`RedisCluster::try_start_with_replicas`].
    pub fn try_start_with_tls(
        masters: usize,
        replicas: usize,
        tls: Option<TlsOptions>,
    ) -> Result<Self, LaunchError> {
        if masters < 3 {
            return Err(LaunchError::Failed(
                "a Redis Cluster needs at least 3 masters".into(),
            ));
        }
        let nodes = (0..masters * (1 + replicas))
            .map(|_| start_node(tls.clone()))
            .collect::<Result<Vec<RedisServer>, LaunchError>>()?;
        let addresses: Vec<String> = nodes
            .iter()
            .filter_map(RedisServer::port)
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let mut create = Command::new("redis-cli");
        if let Some(tls) = &tls {
            create
                .arg("--tls")
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.cert)
                .arg("--key")
                .arg(&tls.key);
        }
        let mut child = create
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| LaunchError::io("running redis-cli --cluster create", e))?;
        // redis-cli waits for the nodes to join with no end of its own.
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(LaunchError::Failed(
                        "redis-cli --cluster create: the nodes did not join in 30 s".into(),
                    ));
                }
            }
        };
        if !status.success() {
            let mut output = String::new();
            if let Some(mut out) = child.stdout.take() {
                let _ = std::io::Read::read_to_string(&mut out, &mut output);
            }
            return Err(LaunchError::Failed(format!(
                "cluster create failed: {output}"
            )));
        }
        let cluster = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                && (n.cli(&["ROLE"]).starts_with("master")
                    || n.cli(&["INFO", "replication"])
                        .contains("master_link_status:up"))
        }) {
            if Instant::now() >= deadline {
                return Err(LaunchError::Failed("cluster never reached state ok".into()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    /// The node that is master of `slot` now (as the first answering node
    /// sees it). In the middle of a failover that view can list the slot
    /// under no master for a moment: this asks again for up to ten
    /// seconds before it gives up.
    pub fn master_of(&self, slot: u16) -> &RedisServer {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let view = self.nodes_view();
            // A port that is not one of this cluster's nodes is a view in
            // flux (a node still being met): ask again.
            let node = view
                .iter()
                .find(|(_, master, slots)| {
                    *master && slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
                })
                .and_then(|(port, _, _)| self.nodes.iter().find(|n| n.port() == Some(*port)));
            match node {
                Some(node) => return node,
                None if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                None => panic!(
                    "no node of this cluster ({:?}) is master of slot {slot}: {view:?}",
                    self.nodes.iter().map(RedisServer::port).collect::<Vec<_>>()
                ),
            }
        }
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == Some(port))
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
        let from_port = from.port().expect("tcp");
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

    /// URLs of every node (seed list for a cluster client; `rediss://` on
    /// a TLS cluster).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}

/// One cluster node; a bus port taken between choosing and binding it (tests
/// start clusters in parallel) is chosen again.
fn start_node(tls: Option<TlsOptions>) -> Result<RedisServer, LaunchError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let tls_cluster = match tls {
            Some(_) => vec!["--tls-cluster".into(), "yes".into()],
            None => Vec::new(),
        };
        let started = RedisServer::try_start_with(ServerOptions {
            transport: Transport::Tcp,
            tls: tls.clone(),
            extra_args: [
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                "nodes.conf".into(),
                "--cluster-node-timeout".into(),
                "2000".into(),
                // The bus port defaults to port + 10000, which may be taken,
                // or past 65535 for a high free port.
                "--cluster-port".into(),
                free_tcp_port().to_string(),
            ]
            .into_iter()
            .chain(tls_cluster)
            .collect(),
            ..ServerOptions::default()
        });
        match started {
            Err(e) if attempts < 5 && crate::redis::is_port_clash(&e) => continue,
            other => return other,
        }
    }
}
