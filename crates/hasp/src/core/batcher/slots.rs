//! Which Redis Cluster node serves which slot, as the batcher last asked.
//!
//! The batcher groups the operations it gathered by node and sends one call
//! per node (the batch function takes keys of several slots of one node). The map
//! may be behind the cluster (a slot migrated, a failover): an operation
//! that reaches a node that no longer serves its slot fails alone without
//! effect, is sent again, and the map is fetched afresh (`CLUSTER SLOTS`).

use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisResult, Value};

/// A fresh map is fetched at most this often.
const MIN_REFRESH: Duration = Duration::from_millis(50);

/// A node's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Node {
    pub(super) host: String,
    pub(super) port: u16,
}

impl Node {
    pub(super) fn route(&self) -> RoutingInfo {
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: self.host.clone(),
            port: self.port,
        })
    }
}

/// Slot → node.
#[derive(Debug)]
pub(super) struct SlotMap {
    nodes: Vec<Node>,
    /// Index into `nodes` per slot; `u16::MAX` for a slot nobody serves.
    owner: Vec<u16>,
    fetched: Instant,
    /// Someone found the map behind the cluster.
    stale: bool,
}

impl SlotMap {
    pub(super) fn empty() -> Self {
        Self {
            nodes: Vec::new(),
            owner: vec![u16::MAX; 16384],
            fetched: Instant::now() - MIN_REFRESH,
            stale: true,
        }
    }

    /// The node serving `slot`, if known.
    pub(super) fn node(&self, slot: u16) -> Option<&Node> {
        let i = *self.owner.get(usize::from(slot))?;
        self.nodes.get(usize::from(i))
    }

    /// The map is behind: fetch it again before the next call.
    pub(super) fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Fetches the map if it is stale (and was not fetched just now); a
    /// failure keeps the old one.
    pub(super) async fn refresh(&mut self, conn: &mut ClusterConnection) {
        if !self.stale || self.fetched.elapsed() < MIN_REFRESH {
            return;
        }
        self.fetched = Instant::now();
        match fetch(conn).await {
            Ok((nodes, owner)) => {
                self.nodes = nodes;
                self.owner = owner;
                self.stale = false;
            }
            Err(e) => tracing::debug!(error = %e, "CLUSTER SLOTS failed; keeping the old map"),
        }
    }
}

async fn fetch(conn: &mut ClusterConnection) -> RedisResult<(Vec<Node>, Vec<u16>)> {
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
    let reply = conn
        .route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), routing)
        .await?;
    let mut nodes: Vec<Node> = Vec::new();
    let mut owner = vec![u16::MAX; 16384];
    let Value::Array(ranges) = reply else {
        return Err(unexpected("CLUSTER SLOTS is not an array"));
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            continue;
        };
        let host = match master.first() {
            Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
            Some(Value::SimpleString(h)) => h.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            continue;
        };
        let node = Node {
            host,
            port: u16::try_from(*port).map_err(|_| unexpected("port out of range"))?,
        };
        let index = match nodes.iter().position(|n| *n == node) {
            Some(i) => i,
            None => {
                nodes.push(node);
                nodes.len() - 1
            }
        };
        let index = u16::try_from(index).map_err(|_| unexpected("too many nodes"))?;
        let (start, end) = (usize::try_from(*start), usize::try_from(*end));
        if let (Ok(start), Ok(end)) = (start, end) {
            for slot in owner.iter_mut().take(end.min(16383) + 1).skip(start) {
                *slot = index;
            }
        }
    }
    Ok((nodes, owner))
}

fn unexpected(what: &'static str) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Client, what))
}
