//! The service's Redis connection: one server, the master of a Sentinel
//! service, or a Redis Cluster.
//!
//! `redis_url` is a Redis URL (`redis://host:port/`, `redis+unix:///path`);
//! for a Sentinel service, `redis+sentinel://host:port,host:port/<service>`
//! (the sentinels, and the name they know the service by: `sentinel`); for
//! a cluster, `redis+cluster://host:port,host:port,...` (any of its nodes;
//! the rest are discovered). Every key of one voucher shares a hash
//! tag (`keys`), so each purchase script and each voucher's pipeline work
//! stays on one slot. The `rediss` forms (`rediss://`,
//! `rediss+sentinel://`, `rediss+cluster://`) speak TLS (`tls`).

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use hasp::sentinel::MasterConnection;

use super::sentinel::sentinel_service;
use super::tls::RedisTls;
use crate::error::{Error, Result};

/// How long a command may wait for its answer. redis-rs' default is 500 ms,
/// which a burst of thousands of purchases queued on one multiplexed
/// connection of a busy machine can exceed: the caller would get an error
/// for a purchase Redis may well have made. A script here runs in
/// microseconds; seconds of waiting mean queueing, not a dead server.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a (re)connection attempt may take.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// The scheme of a cluster's seed list.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

/// The scheme of a cluster's seed list, over TLS.
pub const CLUSTER_TLS_SCHEME: &str = "rediss+cluster://";

/// A cloneable, multiplexed connection to the service's Redis.
#[derive(Clone)]
pub enum RedisConn {
    /// One server, reconnected by the next command once it broke (a
    /// command is never sent again behind the caller's back, and none
    /// waits on reconnection attempts: when Redis is gone, an HTTP request
    /// fails within the connection timeout).
    Server(hasp::Connection),
    /// The master of a Sentinel service, followed through failovers.
    Sentinel(MasterConnection),
    /// A Redis Cluster, routed by slot. redis-rs sends no command twice (a
    /// purchase sent again could buy twice): a command turned away by a
    /// slot move or a failover fails, and the caller's retry lands right.
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RedisConn::Server(_) => "RedisConn::Server",
            RedisConn::Sentinel(_) => "RedisConn::Sentinel",
            RedisConn::Cluster(_) => "RedisConn::Cluster",
        })
    }
}

impl RedisConn {
    /// The master a Sentinel connection left at its last switch, if not
    /// taken since ([`MasterConnection::take_left_master`]): its last accepted
    /// orders may be on it alone. `None` for a server or a cluster.
    pub fn take_left_master(&self) -> Option<RedisConn> {
        match self {
            RedisConn::Sentinel(c) => c.take_left_master().map(RedisConn::Server),
            RedisConn::Server(_) | RedisConn::Cluster(_) => None,
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Server(c) => c.req_packed_command(cmd),
            RedisConn::Sentinel(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Server(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Sentinel(c) => c.req_packed_commands(cmd, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Server(c) => c.get_db(),
            RedisConn::Sentinel(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// The seed URLs of a `redis+cluster://` URL, or `None` for a plain one.
///
/// # Errors
/// [`Error::Invalid`] for a cluster URL without nodes.
pub fn cluster_seeds(redis_url: &str) -> Result<Option<Vec<String>>> {
    let (rest, scheme) = match redis_url.strip_prefix(CLUSTER_SCHEME) {
        Some(rest) => (rest, "redis"),
        None => match redis_url.strip_prefix(CLUSTER_TLS_SCHEME) {
            Some(rest) => (rest, "rediss"),
            None => return Ok(None),
        },
    };
    let seeds: Vec<String> = rest
        .trim_end_matches('/')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|node| format!("{scheme}://{node}/"))
        .collect();
    if seeds.is_empty() {
        return Err(Error::Invalid {
            field: "redis_url",
            reason: format!("{redis_url:?} names no cluster node"),
        });
    }
    Ok(Some(seeds))
}

/// One multiplexed connection to `redis_url` (see the module docs), with
/// the timeouts above; over TLS it trusts the system's roots
/// ([`connect_with`] for more).
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) for a bad URL or an unreachable
/// server.
pub async fn connect(redis_url: &str) -> Result<RedisConn> {
    connect_with(redis_url, &RedisTls::default()).await
}

/// [`connect`], with `tls`'s trust for a `rediss` URL.
///
/// # Errors
/// As [`connect`], and [`Error::Invalid`] for TLS files that cannot be
/// read.
pub async fn connect_with(redis_url: &str, tls: &RedisTls) -> Result<RedisConn> {
    if let Some(seeds) = cluster_seeds(redis_url)? {
        if tls.server_name.is_some() {
            return Err(Error::invalid(
                "redis_tls_server_name",
                "a Redis Cluster's nodes are verified by the names they announce \
                 (cluster-announce-hostname), not by one name: set none for a cluster",
            ));
        }
        let mut builder = redis::cluster::ClusterClientBuilder::new(seeds);
        if redis_url.starts_with(CLUSTER_TLS_SCHEME) {
            builder = builder.tls(tls.mode());
            if let (Some(certificates), false) = (tls.certificates()?, tls.insecure) {
                builder = builder.certs(certificates);
            }
        }
        let client = builder
            .retries(0)
            .response_timeout(RESPONSE_TIMEOUT)
            .connection_timeout(CONNECTION_TIMEOUT)
            .build()?;
        return Ok(RedisConn::Cluster(client.get_async_connection().await?));
    }
    if let Some((sentinels, service)) = sentinel_service(redis_url)? {
        return Ok(RedisConn::Sentinel(
            super::sentinel::connect(
                &sentinels,
                &service,
                tls,
                CONNECTION_TIMEOUT,
                RESPONSE_TIMEOUT,
            )
            .await?,
        ));
    }
    let info = redis::IntoConnectionInfo::into_connection_info(redis_url)?;
    let conn = hasp::Connection::connect(
        info,
        Some(&tls.hasp()?),
        CONNECTION_TIMEOUT,
        RESPONSE_TIMEOUT,
    )
    .await
    .map_err(Error::from_connection)?;
    Ok(RedisConn::Server(conn))
}

/// The ACL rules (`ACL SETUSER <user> on ><password> …`) that let a user
/// run the service with key prefix `prefix`: its keys (`~prefix:*`), the
/// purchase and return scripts and the commands they run, the order
/// streams' consumer group, the checks of the sale state's verification
/// (`INFO`, `SCRIPT EXISTS`/`LOAD`/`FLUSH`: the service flushes the scripts
/// of a server it must verify again, which on a shared Redis also drops
/// other applications' cached scripts), `WAIT` for replica
/// acknowledgement; and the rules of its locks ([`hasp::acl_rules`] for
/// hasp's default prefix). Nothing else.
///
/// ```
/// let rules = seckill::store::acl_rules("seckill");
/// assert!(rules.contains("~seckill:*") && rules.contains("~hasp:*"));
/// ```
pub fn acl_rules(prefix: &str) -> String {
    let commands = [
        "+eval",
        "+evalsha",
        "+script|load",
        "+script|exists",
        "+script|flush",
        "+info",
        "+multi",
        "+exec",
        "+incrby",
        "+expire",
        "+hsetnx",
        "+hmset",
        "+srem",
        "+sismember",
        "+smembers",
        "+xadd",
        "+xrange",
        "+xrevrange",
        "+xlen",
        "+xack",
        "+xdel",
        "+xreadgroup",
        "+xgroup|create",
        "+xpending",
        "+xclaim",
        // The pipeline consumers' signs of life (one sorted set).
        "+zadd",
        "+zrangebyscore",
        // The waiting rooms' lines (store/waiting_room.rs and its scripts).
        "+rpush",
        "+lrange",
        "+llen",
        "+scard",
        "+zremrangebyscore",
    ];
    format!(
        "{} ~{prefix}:* {}",
        hasp::acl_rules(hasp::Settings::default().prefix()),
        commands.join(" ")
    )
}

/// A hasp client on the same Redis as `redis_url`, over TLS with `tls`'s
/// trust for a `rediss` URL.
///
/// # Errors
/// As [`connect`]; [`Error::Lock`](crate::Error::Lock) if hasp cannot connect.
pub async fn lock_client(
    redis_url: &str,
    tls: &RedisTls,
    settings: hasp::Settings,
) -> Result<hasp::Client> {
    let settings = settings.set_tls(tls.hasp()?);
    if let Some((sentinels, service)) = sentinel_service(redis_url)? {
        let sentinels: Vec<&str> = sentinels.iter().map(String::as_str).collect();
        return Ok(hasp::Client::open_sentinel(&sentinels, &service, settings).await?);
    }
    Ok(match cluster_seeds(redis_url)? {
        Some(seeds) => {
            let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
            hasp::Client::open_cluster(&seeds, settings).await?
        }
        None => hasp::Client::open_with(redis_url, settings).await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_name_their_seeds() {
        assert_eq!(cluster_seeds("redis://a:1/").unwrap(), None);
        assert_eq!(
            cluster_seeds("redis+cluster://a:1,b:2/").unwrap(),
            Some(vec!["redis://a:1/".to_owned(), "redis://b:2/".to_owned()])
        );
        assert!(cluster_seeds("redis+cluster://").is_err());
    }
}
