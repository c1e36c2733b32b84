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
//! its holds (faults 5) — a failover may have lost them.
//!
//! Waiting for `READONLY` is not enough: a sentinel reconfigures the old
//! master only when it next polls it (seconds later), and until then the
//! old master takes writes that the new one never sees — renewals among
//! them, so leases run out on the new master. So a Sentinel endpoint also
//! listens to the sentinels' `+switch-master` announcements and moves every
//! connection as soon as one names its service.

use std::sync::Arc;

use redis::{ConnectionInfo, RedisResult};
use tokio::sync::watch;

#[cfg(feature = "sentinel")]
use super::sentinels::{follow_master_switches, Sentinels};

/// A client's server (see the module docs).
pub(crate) struct Endpoint {
    kind: Kind,
    /// Changes whenever connections must re-resolve the server.
    generation: watch::Sender<u64>,
    /// How the client's own connections (the batching lanes) speak TLS to
    /// a `rediss://` server.
    tls: crate::tls::Connectors,
}

enum Kind {
    Direct(Box<ConnectionInfo>),
    #[cfg(feature = "sentinel")]
    Sentinel(Sentinels),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Direct(info) => write!(f, "Endpoint({})", info.addr()),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(_) => f.write_str("Endpoint(sentinel)"),
        }
    }
}

impl Endpoint {
    /// The server at `info`; TLS (for a `rediss://` address) as `tls`
    /// says.
    pub(crate) fn direct(info: ConnectionInfo, tls: crate::tls::Connectors) -> Arc<Self> {
        Arc::new(Self {
            kind: Kind::Direct(Box::new(info)),
            generation: watch::Sender::new(0),
            tls,
        })
    }

    /// The current master of the service `sentinels` watch; connections
    /// to it speak TLS as the sentinels do, with the same trust.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(sentinels: Sentinels) -> Arc<Self> {
        let endpoint = Arc::new(Self {
            kind: Kind::Sentinel(sentinels.clone()),
            generation: watch::Sender::new(0),
            tls: sentinels.tls().clone(),
        });
        tokio::spawn(follow_master_switches(
            Arc::downgrade(&endpoint),
            sentinels,
            Endpoint::stale,
        ));
        endpoint
    }

    /// Where to connect now: the address, or the master the sentinels
    /// name.
    pub(crate) async fn resolve(&self) -> RedisResult<ConnectionInfo> {
        match &self.kind {
            Kind::Direct(info) => Ok(ConnectionInfo::clone(info)),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(sentinels) => sentinels.resolve().await,
        }
    }

    /// A connection found that its server is no longer the master: every
    /// connection re-resolves. (A direct endpoint has nowhere else to go.)
    pub(crate) fn stale(&self) {
        if self.is_sentinel() {
            tracing::info!("the master changed: reconnecting to the new one");
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// The connectors of the connections' TLS.
    pub(crate) fn tls(&self) -> &crate::tls::Connectors {
        &self.tls
    }

    /// Whether each connection asks the sentinels where the master is.
    pub(crate) fn is_sentinel(&self) -> bool {
        match self.kind {
            Kind::Direct(_) => false,
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(_) => true,
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
