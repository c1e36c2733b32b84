//! Where a client's server is: one address, or the current master of a
//! service that a group of Redis Sentinels watches.
//!
//! Every connection of a client (the batcher's, the pub/sub one, the one
//! for queries) asks the endpoint for its server each time it connects. For
//! a Sentinel service that is a fresh question to the sentinels, so a
//! reconnect after a failover lands on the new master. A connection that
//! learns the server it talks to is no longer the master (a write refused
//! with `READONLY`: the old master, demoted) says so ([`Endpoint::stale`]);
//! every other connection of the client then reconnects too
//! ([`Endpoint::generation`]), and the reconnect makes the client re-check
//! its holds (faults spec 5) — a failover may have lost them.

use std::sync::Arc;

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{IntoConnectionInfo, RedisResult};
use tokio::sync::{watch, Mutex};

/// A client's server (see the module docs).
pub(crate) struct Endpoint {
    kind: Kind,
    /// Changes whenever connections must re-resolve the server.
    generation: watch::Sender<u64>,
}

enum Kind {
    Direct(redis::Client),
    Sentinel(Mutex<SentinelClient>),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Direct(client) => write!(f, "Endpoint({})", client.get_connection_info().addr()),
            Kind::Sentinel(_) => f.write_str("Endpoint(sentinel)"),
        }
    }
}

impl Endpoint {
    /// The server `client` points at.
    pub(crate) fn direct(client: redis::Client) -> Arc<Self> {
        Arc::new(Self {
            kind: Kind::Direct(client),
            generation: watch::Sender::new(0),
        })
    }

    /// The current master of `service`, as the sentinels at `sentinels`
    /// say; connections to it use `node` (database, credentials, TCP
    /// settings).
    pub(crate) fn sentinel(
        sentinels: Vec<redis::ConnectionInfo>,
        service: &str,
        node: SentinelNodeConnectionInfo,
    ) -> RedisResult<Arc<Self>> {
        let client = SentinelClient::build(
            sentinels,
            service.to_owned(),
            Some(node),
            SentinelServerType::Master,
        )?;
        Ok(Arc::new(Self {
            kind: Kind::Sentinel(Mutex::new(client)),
            generation: watch::Sender::new(0),
        }))
    }

    /// A client for the server to connect to now.
    pub(crate) async fn resolve(&self) -> RedisResult<redis::Client> {
        match &self.kind {
            Kind::Direct(client) => Ok(client.clone()),
            Kind::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
        }
    }

    /// A connection found that its server is no longer the master: every
    /// connection re-resolves. (A direct endpoint has nowhere else to go.)
    pub(crate) fn stale(&self) {
        if matches!(self.kind, Kind::Sentinel(_)) {
            tracing::info!("the master changed: reconnecting to the new one");
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// The current generation, to compare with later.
    pub(crate) fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// Resolves when the generation changes.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

/// Parses sentinel URLs.
pub(crate) fn sentinel_infos(urls: &[&str]) -> RedisResult<Vec<redis::ConnectionInfo>> {
    urls.iter().map(|u| u.into_connection_info()).collect()
}
