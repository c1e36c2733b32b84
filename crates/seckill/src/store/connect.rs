//! The service's Redis connection.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::Result;

/// How long a command may wait for its answer. redis-rs' default is 500 ms,
/// which a burst of thousands of purchases queued on one multiplexed
/// connection of a busy machine can exceed: the caller would get an error
/// for a purchase Redis may well have made. A script here runs in
/// microseconds; seconds of waiting mean queueing, not a dead server.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a (re)connection attempt may take.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// One multiplexed, auto-reconnecting connection to `redis_url`, with the
/// timeouts above.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) for a bad URL or an unreachable
/// server.
pub async fn connect(redis_url: &str) -> Result<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(CONNECTION_TIMEOUT));
    Ok(ConnectionManager::new_with_config(redis::Client::open(redis_url)?, config).await?)
}
