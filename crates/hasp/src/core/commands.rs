//! The connection for read-only queries (`EXISTS`, `PTTL`, ...),
//! pipelined by all tasks of a client.
//!
//! To one address it is redis-rs's `ConnectionManager` (which reconnects by
//! itself); to a Sentinel service it is a multiplexed connection made again
//! to the current master whenever it breaks or the master changes
//! (`endpoint`).

#[cfg(feature = "sentinel")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "sentinel")]
use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "sentinel")]
use redis::AsyncConnectionConfig;
use redis::RedisResult;
#[cfg(feature = "sentinel")]
use tokio::sync::Mutex;

#[cfg(feature = "sentinel")]
use super::endpoint::Endpoint;
use super::scripts;
use crate::config::Settings;
#[cfg(feature = "cluster")]
use crate::error::is_redirect;
use crate::error::Result;

/// See the module docs.
pub(crate) enum Commands {
    Fixed(ConnectionManager),
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
    /// changed since it was made.
    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        let mut live = self.live.lock().await;
        let generation = self.endpoint.generation();
        if let Some((made_in, conn)) = &*live {
            if *made_in == generation {
                return Ok(conn.clone());
            }
        }
        let client = self.endpoint.resolve().await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *live = Some((generation, conn.clone()));
        Ok(conn)
    }
}

/// A connection to a Sentinel service's current master.
#[cfg(feature = "sentinel")]
pub(crate) struct Following {
    endpoint: Arc<Endpoint>,
    config: AsyncConnectionConfig,
    /// The live connection and the endpoint generation it was made in.
    live: Mutex<Option<(u64, MultiplexedConnection)>>,
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
    /// Connects to a fixed server and loads the script there.
    pub(crate) async fn fixed(client: redis::Client, settings: &Settings) -> Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(settings.response_timeout))
            .set_connection_timeout(Some(settings.connection_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let mut conn = ConnectionManager::new_with_config(client, config).await?;
        scripts::preload(&mut conn).await?;
        Ok(Commands::Fixed(conn))
    }

    /// Connects to the endpoint's current master and loads the script
    /// there.
    #[cfg(feature = "sentinel")]
    pub(crate) async fn following(endpoint: Arc<Endpoint>, settings: &Settings) -> Result<Self> {
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(settings.response_timeout))
            .set_connection_timeout(Some(settings.connection_timeout));
        let following = Following {
            endpoint,
            config,
            live: Mutex::new(None),
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
                if matches!(&result, Err(e) if e.is_connection_dropped() || e.is_io_error()) {
                    *following.live.lock().await = None;
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
            Err(e) if (e.is_connection_dropped() || e.is_io_error()) && !e.is_timeout() => {
                Ok(self.once(cmd).await?)
            }
            result => Ok(result?),
        }
    }
}
