//! The connection for read-only queries (`EXISTS`, `PTTL`, ...),
//! pipelined by all tasks of a client.
//!
//! To one address it is a [`Connection`] (made again when it breaks); to a
//! Sentinel service it is one made again to the current master whenever it
//! breaks or the master changes (`endpoint`).

#[cfg(feature = "sentinel")]
use std::sync::{Arc, Mutex, MutexGuard};
#[cfg(any(feature = "sentinel", feature = "cluster"))]
use std::time::Duration;

use redis::RedisResult;

use super::endpoint::Endpoint;
use super::scripts;
use crate::config::Settings;
#[cfg(feature = "cluster")]
use crate::error::is_redirect;
use crate::error::Result;
#[cfg(feature = "sentinel")]
use crate::shared_attempt::SharedAttempt;
use crate::transport::Connection;

/// See the module docs.
pub(crate) enum Commands {
    Fixed(Connection),
    #[cfg(feature = "sentinel")]
    Following(Box<Following>),
    /// A Redis Cluster: routed by key. redis-rs does not retry (see the
    /// batcher); a read redirected by a slot move is sent again here.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

#[cfg(feature = "sentinel")]
impl Following {
    /// The live connection, made again if there is none or the master
    /// changed since it was made (one resolution at a time: the queries
    /// that waited for one that failed fail with it).
    async fn connection(&self) -> RedisResult<Connection> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let resolve = async {
            let generation = self.endpoint.generation();
            let info = self.endpoint.resolve().await?;
            let conn = Connection::new(
                info,
                self.endpoint.tls().clone(),
                self.connection_timeout,
                self.response_timeout,
            );
            *self.live() = Some((generation, conn.clone()));
            Ok(conn)
        };
        self.resolving.run(|| self.current(), resolve).await
    }

    /// The live connection, if it was made in the current generation.
    fn current(&self) -> Option<Connection> {
        let generation = self.endpoint.generation();
        self.live()
            .as_ref()
            .filter(|(made_in, _)| *made_in == generation)
            .map(|(_, conn)| conn.clone())
    }

    fn live(&self) -> MutexGuard<'_, Option<(u64, Connection)>> {
        // Every update is one store: a panic cannot leave it half-done.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connection to a Sentinel service's current master.
#[cfg(feature = "sentinel")]
pub(crate) struct Following {
    endpoint: Arc<Endpoint>,
    connection_timeout: Duration,
    response_timeout: Duration,
    /// The live connection and the endpoint generation it was made in.
    live: Mutex<Option<(u64, Connection)>>,
    resolving: SharedAttempt,
}

impl std::fmt::Debug for Commands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Commands::Fixed(_) => "Commands(fixed)",
            #[cfg(feature = "sentinel")]
            Commands::Following(_) => "Commands(following)",
            #[cfg(feature = "cluster")]
            Commands::Cluster(_) => "Commands(cluster)",
        })
    }
}

impl Commands {
    /// Connects to the endpoint's server (a fixed one) and loads the
    /// script there.
    pub(crate) async fn fixed(endpoint: &Endpoint, settings: &Settings) -> Result<Self> {
        let info = endpoint.resolve().await?;
        let mut conn = Connection::new(
            info,
            endpoint.tls().clone(),
            settings.connection_timeout,
            settings.response_timeout,
        );
        scripts::preload(&mut conn).await?;
        Ok(Commands::Fixed(conn))
    }

    /// Connects to the endpoint's current master and loads the script
    /// there.
    #[cfg(feature = "sentinel")]
    pub(crate) async fn following(endpoint: Arc<Endpoint>, settings: &Settings) -> Result<Self> {
        let following = Following {
            endpoint,
            connection_timeout: settings.connection_timeout,
            response_timeout: settings.response_timeout,
            live: Mutex::new(None),
            resolving: SharedAttempt::default(),
        };
        let mut conn = following.connection().await?;
        scripts::preload(&mut conn).await?;
        Ok(Commands::Following(Box::new(following)))
    }

    /// Loads the cluster form of the script on every master.
    #[cfg(feature = "cluster")]
    pub(crate) async fn cluster(mut conn: redis::cluster_async::ClusterConnection) -> Result<Self> {
        scripts::BATCH_SHARDED.load(&mut conn).await?;
        Ok(Commands::Cluster(conn))
    }

    async fn once<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        match self {
            Commands::Fixed(conn) => cmd.query_async(&mut conn.clone()).await,
            #[cfg(feature = "cluster")]
            Commands::Cluster(conn) => {
                let mut tries = 0;
                loop {
                    match cmd.query_async(&mut conn.clone()).await {
                        Err(e) if tries < 10 && is_redirect(&e) => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        result => return result,
                    }
                }
            }
            #[cfg(feature = "sentinel")]
            Commands::Following(following) => {
                let result = cmd.query_async(&mut following.connection().await?).await;
                if matches!(&result, Err(e) if crate::transport::broke(e)) {
                    *following.live() = None;
                }
                result
            }
        }
    }

    /// Runs a read-only command. Sent again once if the connection turns
    /// out broken (the server restarted, say: the first command fails and
    /// the connection is made again), which a read allows.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        match self.once(cmd).await {
            Err(e) if crate::transport::broke(&e) => Ok(self.once(cmd).await?),
            result => Ok(result?),
        }
    }
}
