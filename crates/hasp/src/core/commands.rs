//! The connection for read-only queries (`EXISTS`, `PTTL`, ...),
//! pipelined by all tasks of a client.
//!
//! To one address it is a [`Connection`] (made again when it breaks); to a
//! Sentinel service it follows the current master (`following`).

#[cfg(feature = "sentinel")]
use std::sync::Arc;
#[cfg(feature = "cluster")]
use std::time::Duration;

use redis::RedisResult;

use super::endpoint::Endpoint;
#[cfg(feature = "sentinel")]
use super::following::Following;
use super::scripts;
use crate::config::Settings;
#[cfg(feature = "cluster")]
use crate::error::is_redirect;
use crate::error::Result;
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
        let following = Following::new(
            endpoint,
            settings.connection_timeout,
            settings.response_timeout,
        );
        let (made, mut conn) = following.connection().await?;
        following.after(made, scripts::preload(&mut conn).await)?;
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
                let (made, mut conn) = following.connection().await?;
                following.after(made, cmd.query_async(&mut conn).await)
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
