//! The Lua scripts, built (and hashed) once per process.
//!
//! `Script::invoke_async` sends `EVALSHA` and, when the server answers
//! `NOSCRIPT` (restarted, or `SCRIPT FLUSH`), loads the script and retries
//! once, so renewal and locking keep working after a server restart.

use std::sync::LazyLock;

use redis::Script;

const SOURCES: [&str; 3] = [
    include_str!("scripts/batch.lua"),
    include_str!("scripts/force_release.lua"),
    include_str!("scripts/renew.lua"),
];

pub(crate) static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[0]));
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[1]));
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCES[2]));

/// Loads every script into the server's cache, so the first burst of calls
/// after connecting does not meet `NOSCRIPT` all at once (each call would
/// then load and retry). Later cache losses are handled per call.
pub(crate) async fn preload(conn: &mut redis::aio::ConnectionManager) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    for source in SOURCES {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    pipe.query_async(conn).await
}
