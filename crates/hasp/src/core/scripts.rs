//! The batch function, in a Redis function library (`FUNCTION LOAD`,
//! `FCALL`; Redis 7.0 or later).
//!
//! A library is run once, when it is loaded: its helpers are made then, and
//! each call runs only the function's body. An `EVALSHA` script runs its
//! whole text on every call, defining each of its functions again: for a
//! call carrying one operation, a large share of Redis's work
//! (`benches/README.md`).
//!
//! Calls send `FCALL` and, when the server answers that the function is not
//! found (restarted without persistence, `FUNCTION FLUSH`), load the library
//! and retry once, so locking and renewal keep working after a server
//! restart. The function's name carries a hash of the library, so clients
//! of different hasp versions can share a server, each calling its own. The
//! command is built in one buffer ([`Library::call`]; redis-rs allocates per
//! argument otherwise) and sent with [`run`].

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, Script};

use crate::config::ReplicaAck;

/// The library's body: every change hasp makes to its objects (see `wire`),
/// one file per kind between the prelude and the batch function.
pub(crate) const BATCH_SOURCE: &str = concat!(
    include_str!("scripts/prelude.lua"),
    include_str!("scripts/lock.lua"),
    include_str!("scripts/plain_lock.lua"),
    include_str!("scripts/line.lua"),
    include_str!("scripts/fair_lock.lua"),
    include_str!("scripts/rw_lock.lua"),
    include_str!("scripts/semaphore.lua"),
    include_str!("scripts/latch.lua"),
    include_str!("scripts/lease.lua"),
    include_str!("scripts/dispatch.lua"),
);

/// Flags of the batch function:
/// - `allow-oom`: a Redis at `maxmemory` must still take releases and
///   renewals (a function without it is refused whole); an acquisition
///   there writes one small key.
const FLAGS: &str = "'allow-oom'";

/// The batch function for one server (or a Sentinel service's master).
pub(crate) static BATCH: LazyLock<Library> =
    LazyLock::new(|| Library::new(BATCH_SOURCE, "publish", FLAGS));

/// The batch function for a Redis Cluster: release messages go out with
/// `SPUBLISH`, to the shard that owns the lock's slot, where its waiters
/// listen with `SSUBSCRIBE` (a plain `PUBLISH` would reach every node). A
/// call may carry locks of several slots of one node
/// (`allow-cross-slot-keys`), each operation's keys in one slot.
#[cfg(feature = "cluster")]
pub(crate) static BATCH_SHARDED: LazyLock<Library> = LazyLock::new(|| {
    Library::new(
        BATCH_SOURCE,
        "spublish",
        &format!("{FLAGS}, 'allow-cross-slot-keys'"),
    )
});

/// A function library registering one function, `batch`.
pub(crate) struct Library {
    /// What `FUNCTION LOAD` is sent.
    source: String,
    /// The function's name: `hasp_` and 16 hex digits of the SHA-1 of the
    /// library.
    function: String,
}

impl Library {
    /// The library of `body` whose release messages go out with the
    /// command `publish` (`prelude.lua`'s `released`), its function flagged
    /// `flags`.
    fn new(body: &str, publish: &str, flags: &str) -> Self {
        let body = format!("local PUBLISH = '{publish}'\n{body}");
        let flags_line = format!("-- flags: {flags}\n");
        let hash = Script::new(&(flags_line + &body)).get_hash().to_owned();
        let id = &hash[..16];
        let function = format!("hasp_{id}");
        let source = format!(
            "#!lua name=hasp_{id}\n{body}\nredis.register_function{{function_name = '{function}', \
             callback = batch, flags = {{ {flags} }}}}\n"
        );
        Self { source, function }
    }

    /// The function's name.
    #[cfg(test)]
    pub(crate) fn function(&self) -> &str {
        &self.function
    }

    /// The library's source, as `FUNCTION LOAD` takes it.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// The start of an `FCALL` of the function with `keys` keys: append the
    /// keys, then the arguments, and pass it to [`run`]. `args` and `bytes`
    /// size the buffer (the total number and length of the keys and
    /// arguments to come).
    pub(crate) fn call(&self, keys: usize, args: usize, bytes: usize) -> Cmd {
        let mut cmd = Cmd::with_capacity(3 + args, 64 + bytes);
        cmd.arg("FCALL").arg(&self.function).arg(keys);
        cmd
    }

    /// `FUNCTION LOAD` of the library.
    fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg(&self.source);
        cmd
    }

    /// Loads the library (a server that has it already is fine).
    pub(crate) async fn load(&self, conn: &mut impl ConnectionLike) -> RedisResult<()> {
        match self.load_cmd().query_async::<redis::Value>(conn).await {
            Err(e) if already_loaded(&e) => Ok(()),
            result => result.map(drop),
        }
    }
}

/// The server does not have the function (restarted, `FUNCTION FLUSH`).
fn not_found(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// The library was loaded already (by another client, or a replica that
/// got it by replication).
fn already_loaded(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|detail| detail.contains("already exists"))
}

/// Loads the library into the server, so the first burst of calls after
/// connecting does not find the function missing all at once (each call
/// would then load and retry). Later losses are handled per call.
pub(crate) async fn preload(conn: &mut impl ConnectionLike) -> RedisResult<()> {
    BATCH.load(conn).await
}

/// Runs a [`Library::call`] command followed by `WAIT` for `ack`'s
/// replicas, in one pipeline (so the `WAIT` covers exactly this call's
/// writes); returns the function's reply and how many replicas
/// acknowledged. Loads the library and retries once if the server does not
/// have it.
pub(crate) async fn run_then_wait<T: FromRedisValue>(
    library: &Library,
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
        Err(e) if not_found(&e) => {
            library.load(conn).await?;
            pipe.query_async(conn).await
        }
        result => result,
    }
}

/// Runs a [`Library::call`] command on the cluster node `routing` names,
/// loading the library there and retrying once if it does not have it.
#[cfg(feature = "cluster")]
pub(crate) async fn run_routed(
    library: &Library,
    cmd: &Cmd,
    conn: &mut redis::cluster_async::ClusterConnection,
    routing: redis::cluster_routing::RoutingInfo,
) -> RedisResult<redis::Value> {
    // A routed command answers a server error as a value, not an error.
    let reply = conn.route_command(cmd.clone(), routing.clone()).await;
    match reply.and_then(redis::Value::extract_error) {
        Err(e) if not_found(&e) => {
            let loaded = conn
                .route_command(library.load_cmd(), routing.clone())
                .await
                .and_then(redis::Value::extract_error);
            match loaded {
                Err(e) if !already_loaded(&e) => return Err(e),
                _ => {}
            }
            conn.route_command(cmd.clone(), routing)
                .await
                .and_then(redis::Value::extract_error)
        }
        result => result,
    }
}

/// Runs a [`Library::call`] command, loading the library and retrying once
/// if the server does not have it.
pub(crate) async fn run<T: FromRedisValue>(
    library: &Library,
    cmd: &Cmd,
    conn: &mut impl ConnectionLike,
) -> RedisResult<T> {
    match cmd.query_async(conn).await {
        Err(e) if not_found(&e) => {
            library.load(conn).await?;
            cmd.query_async(conn).await
        }
        result => result,
    }
}

#[cfg(test)]
mod tests {
    use super::BATCH_SOURCE;

    #[test]
    fn no_two_kinds_register_one_opcode() {
        // A later `ops.xx = ` would silently replace an earlier kind's
        // operation (the library loads either way).
        let mut seen = std::collections::HashSet::new();
        for line in BATCH_SOURCE.lines() {
            if let Some(rest) = line.strip_prefix("ops.") {
                let code = rest.split(' ').next().unwrap_or_default();
                assert!(
                    seen.insert(code.to_owned()),
                    "opcode {code} registered twice"
                );
            }
        }
        assert!(seen.len() > 10, "found the registrations: {seen:?}");
    }
}
