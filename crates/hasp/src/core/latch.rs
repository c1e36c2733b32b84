//! A count-down latch on the floor: writes through the
//! batcher (`latch.lua`), waiting through a [`Watch`](super::Watch) of its
//! channel (subscribe first, then read, so a completion between the two is
//! never missed).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::keys::LockKeys;
use super::waiters::remaining;
use super::wire::latch::LatchOp;
use super::wire::{Op, Reply};
use super::Core;
use crate::error::{Error, Result};

/// How often a waiting task reads the latch again without a message: a
/// latch that expires (or whose key is deleted behind hasp's back)
/// publishes nothing.
const RECHECK: Duration = Duration::from_secs(2);

/// The keys of the latch called `name`, after checking the name.
pub(crate) fn keys(core: &Core, name: &str) -> Result<Arc<LockKeys>> {
    core.keys(name, LockKeys::latch)
}

/// Runs a latch operation; its number (see `latch.lua`).
pub(crate) async fn run(core: &Core, op: LatchOp) -> Result<i64> {
    let name = op.keys().name.clone();
    match core.call(Op::Latch(op)).await? {
        Reply::Value(n) => Ok(n),
        other => Err(Error::Protocol(format!(
            "latch {name:?}: unexpected reply {other:?}"
        ))),
    }
}

/// The count left: `None` if never set (or expired, or deleted).
pub(crate) async fn count(core: &Core, keys: &LockKeys) -> Result<Option<u64>> {
    core.query(redis::cmd("HGET").arg(&*keys.lock).arg("n"))
        .await
}

/// Waits until the latch completes (true) or `deadline` passes (false).
/// A latch that is not set is [`Error::NotSet`] unless `until_set`; one
/// that disappears while counting is [`Error::Deleted`].
pub(crate) async fn wait(
    core: &Core,
    keys: &Arc<LockKeys>,
    deadline: Option<Instant>,
    until_set: bool,
) -> Result<bool> {
    let mut watch = core.watch(keys);
    let confirm = remaining(deadline).min(core.settings.response_timeout);
    watch.ready(confirm).await;
    let mut counting = false;
    loop {
        match count(core, keys).await? {
            Some(0) => return Ok(true),
            Some(_) => counting = true,
            None if counting => {
                return Err(Error::Deleted {
                    name: keys.name.to_string(),
                })
            }
            None if !until_set => {
                return Err(Error::NotSet {
                    name: keys.name.to_string(),
                })
            }
            None => {}
        }
        let left = remaining(deadline);
        if left.is_zero() {
            return Ok(false);
        }
        let _ = tokio::time::timeout(left.min(RECHECK), watch.freed()).await;
    }
}
