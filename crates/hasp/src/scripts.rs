//! The Lua scripts, built (and hashed) once per process.
//!
//! `Script::invoke_async` sends `EVALSHA` and, when the server answers
//! `NOSCRIPT` (restarted, or `SCRIPT FLUSH`), loads the script and retries
//! once, so renewal and locking keep working after a server restart.

use std::sync::LazyLock;

use redis::Script;

pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/force_release.lua")));
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));
