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
#[cfg(feature = "sentinel")]
use std::{sync::Weak, time::Duration};

#[cfg(feature = "sentinel")]
use futures_util::StreamExt;
#[cfg(feature = "sentinel")]
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
#[cfg(feature = "sentinel")]
use redis::IntoConnectionInfo;
use redis::RedisResult;
use tokio::sync::watch;
#[cfg(feature = "sentinel")]
use tokio::sync::Mutex;

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
    Direct(redis::Client),
    #[cfg(feature = "sentinel")]
    Sentinel(Mutex<SentinelClient>),
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Direct(client) => write!(f, "Endpoint({})", client.get_connection_info().addr()),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(_) => f.write_str("Endpoint(sentinel)"),
        }
    }
}

impl Endpoint {
    /// The server `client` points at; TLS (for a `rediss://` address) as
    /// `tls` says.
    pub(crate) fn direct(client: redis::Client, tls: crate::tls::Connectors) -> Arc<Self> {
        Arc::new(Self {
            kind: Kind::Direct(client),
            generation: watch::Sender::new(0),
            tls,
        })
    }

    /// The current master of `service`, as the sentinels at `sentinels`
    /// say; connections to it use `node` (database, credentials, TCP
    /// settings). Sentinels named by `rediss://` are reached over TLS, and
    /// so is the master they name, with `tls`'s trust.
    #[cfg(feature = "sentinel")]
    pub(crate) fn sentinel(
        sentinels: Vec<redis::ConnectionInfo>,
        service: &str,
        node: SentinelNodeConnectionInfo,
        tls: Option<&crate::tls::Tls>,
    ) -> RedisResult<Arc<Self>> {
        let secure = sentinels
            .iter()
            .any(|s| matches!(s.addr(), redis::ConnectionAddr::TcpTls { .. }));
        let announcers = sentinels
            .iter()
            .cloned()
            .map(|info| crate::tls::client(info, tls))
            .collect::<RedisResult<Vec<_>>>()?;
        let client = match secure {
            false => SentinelClient::build(
                sentinels,
                String::from(service),
                Some(node),
                SentinelServerType::Master,
            )?,
            true => crate::tls::sentinel_client(sentinels, service, tls)?,
        };
        let endpoint = Arc::new(Self {
            kind: Kind::Sentinel(Mutex::new(client)),
            generation: watch::Sender::new(0),
            tls: crate::tls::Connectors::new(tls),
        });
        tokio::spawn(follow_master_switches(
            Arc::downgrade(&endpoint),
            announcers,
            service.to_owned(),
            Endpoint::stale,
        ));
        Ok(endpoint)
    }

    /// A client for the server to connect to now.
    pub(crate) async fn resolve(&self) -> RedisResult<redis::Client> {
        match &self.kind {
            Kind::Direct(client) => Ok(client.clone()),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
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

    /// The connectors of the lanes' TLS connections.
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

/// Listens to the sentinels' `+switch-master` announcements, on one
/// sentinel at a time (the next one when it fails), and calls `on_switch`
/// with what `owner` points to each time one names `service`. Ends when
/// `owner` is gone.
///
/// hasp's Sentinel clients move their connections on it; an application
/// that keeps its own connection to the master of the same service can
/// move it by the same rule. Waiting for `READONLY` is not enough: a
/// sentinel reconfigures the old master only when it next polls it, and
/// until then the old master takes writes the new one never sees.
///
/// # Cancel safety
/// Cancel safe: it only listens; dropping it stops the listening.
#[cfg(feature = "sentinel")]
pub async fn follow_master_switches<T>(
    owner: Weak<T>,
    sentinels: Vec<redis::Client>,
    service: String,
    on_switch: impl Fn(&T),
) {
    if sentinels.is_empty() {
        return;
    }
    let mut next = 0;
    loop {
        let sentinel = &sentinels[next % sentinels.len()];
        next += 1;
        match sentinel.get_async_pubsub().await {
            Ok(mut pubsub) => {
                if pubsub.subscribe("+switch-master").await.is_ok() {
                    let mut messages = pubsub.on_message();
                    loop {
                        let message = tokio::time::timeout(Duration::from_secs(1), messages.next());
                        match message.await {
                            Ok(Some(message)) => {
                                let payload: String = message.get_payload().unwrap_or_default();
                                // "<service> <old ip> <old port> <new ip> <new port>"
                                if payload.split(' ').next() == Some(service.as_str()) {
                                    match owner.upgrade() {
                                        Some(owner) => on_switch(&owner),
                                        None => return,
                                    }
                                }
                            }
                            Ok(None) => break, // the sentinel went away: the next one
                            Err(_) if owner.strong_count() == 0 => return,
                            Err(_) => {}
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "sentinel unreachable for announcements"),
        }
        if owner.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Parses sentinel URLs.
#[cfg(feature = "sentinel")]
pub(crate) fn sentinel_infos(urls: &[&str]) -> RedisResult<Vec<redis::ConnectionInfo>> {
    urls.iter().map(|u| u.into_connection_info()).collect()
}
