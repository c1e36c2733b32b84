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

/// Reconnection attempts behind one failing command. redis-rs' default (6,
/// backing off to 3.2 s) holds a command for over 6 s when Redis is gone:
/// an HTTP request hangs that long, and a service stopping without its
/// Redis took 23 s (measured). The next command tries again anyway.
pub const RECONNECT_RETRIES: usize = 2;

/// One multiplexed, auto-reconnecting connection to `redis_url`, with the
/// timeouts and retries above.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) for a bad URL or an unreachable
/// server.
pub async fn connect(redis_url: &str) -> Result<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(CONNECTION_TIMEOUT))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_max_delay(Duration::from_secs(1));
    Ok(ConnectionManager::new_with_config(redis::Client::open(redis_url)?, config).await?)
}
