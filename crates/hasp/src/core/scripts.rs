//! The batch script, built (and hashed) once per process.
//!
//! Calls send `EVALSHA` and, when the server answers `NOSCRIPT` (restarted,
//! or `SCRIPT FLUSH`), load the script and retry once, so locking and
//! renewal keep working after a server restart. The command is built in one
//! buffer ([`evalsha`]; redis-rs's `ScriptInvocation` allocates per
//! argument) and sent with [`run`].

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisResult, Script, ServerErrorKind};

use crate::config::ReplicaAck;

/// The batch script: every change hasp makes to its objects (see `wire`),
/// one file per kind between the prelude and the dispatch loop; the kinds
/// other than the lock inside `load_kinds`, run only by calls that need
/// them (see `prelude.lua`).
pub(crate) const BATCH_SOURCE: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/lock.lua"),
    "\nlocal function load_kinds()\n",
    include_str!("scripts/line.lua"),
    include_str!("scripts/fair.lua"),
    include_str!("scripts/rw.lua"),
    include_str!("scripts/permits.lua"),
    include_str!("scripts/latch.lua"),
    include_str!("scripts/lease.lua"),
    "\nend\n",
    include_str!("scripts/dispatch.lua"),
);

pub(crate) static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(BATCH_SOURCE));

/// `batch.lua` for a Redis Cluster: release messages go out with
/// `SPUBLISH`, to the shard that owns the lock's slot, where its waiters
/// listen with `SSUBSCRIBE` (a plain `PUBLISH` would reach every node).
pub(crate) static BATCH_SHARDED: LazyLock<Script> =
    LazyLock::new(|| Script::new(&sharded_source()));

/// Loads the script into the server's cache, so the first burst of calls
/// after connecting does not meet `NOSCRIPT` all at once (each call would
/// then load and retry). Later cache losses are handled per call.
pub(crate) async fn preload(conn: &mut impl ConnectionLike) -> RedisResult<()> {
    BATCH.load_async(conn).await.map(drop)
}

/// The start of an `EVALSHA` of `script` with `keys` keys: append the keys,
/// then the arguments, and pass it to [`run`]. `args` and `bytes` size the
/// buffer (the total number and length of the keys and arguments to come).
pub(crate) fn evalsha(script: &Script, keys: usize, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + args, 64 + bytes);
    cmd.arg("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys);
    cmd
}

/// Runs an [`evalsha`] command of `script` followed by `WAIT` for `ack`'s
/// replicas, in one pipeline (so the `WAIT` covers exactly this call's
/// writes); returns the script's reply and how many replicas acknowledged.
/// Loads the script and retries once if the server does not have it.
pub(crate) async fn run_then_wait<T: FromRedisValue>(
    script: &Script,
    cmd: &Cmd,
    ack: ReplicaAck,
    conn: &mut impl ConnectionLike,
) -> RedisResult<(T, u32)> {
    let timeout_ms = u64::try_from(ack.timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    let mut pipe = redis::pipe();
    pipe.add_command(cmd.clone())
        .cmd("WAIT")
        .arg(ack.replicas)
        .arg(timeout_ms);
    match pipe.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            pipe.query_async(conn).await
        }
        result => result,
    }
}

/// Runs an [`evalsha`] command of `script` on the cluster node `routing`
/// names, loading the script there and retrying once if it does not have
/// it.
pub(crate) async fn run_routed(
    script: &Script,
    cmd: &Cmd,
    conn: &mut redis::cluster_async::ClusterConnection,
    routing: redis::cluster_routing::RoutingInfo,
) -> RedisResult<redis::Value> {
    // A routed command answers a server error as a value, not an error.
    let reply = conn.route_command(cmd.clone(), routing.clone()).await;
    match reply.and_then(redis::Value::extract_error) {
        Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(script_source(script));
            conn.route_command(load, routing.clone())
                .await
                .and_then(redis::Value::extract_error)?;
            conn.route_command(cmd.clone(), routing)
                .await
                .and_then(redis::Value::extract_error)
        }
        result => result,
    }
}

/// The source of one of this module's scripts.
fn script_source(script: &Script) -> String {
    if script.get_hash() == BATCH_SHARDED.get_hash() {
        sharded_source()
    } else {
        BATCH_SOURCE.to_owned()
    }
}

fn sharded_source() -> String {
    BATCH_SOURCE.replace("call('publish'", "call('spublish'")
}

/// Runs an [`evalsha`] command of `script`, loading the script and retrying
/// once if the server does not have it.
pub(crate) async fn run<T: FromRedisValue>(
    script: &Script,
    cmd: &Cmd,
    conn: &mut impl ConnectionLike,
) -> RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        result => result,
    }
}
