//! A fair lock on the floor: a lock's holds (registry, watchdog, re-entry,
//! guards) with acquisitions that wait in a line kept in Redis (`line`)
//! instead of racing, and releases that wake the head of the line only
//! (`fair_lock.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{Claim, HoldState};
use super::keys::LockKeys;
use super::wire::fair_lock::FairAcquire;
use super::Core;
use crate::error::Result;

/// The keys of the fair lock called `name`, after checking the name.
pub(crate) fn keys(core: &Core, name: &str) -> Result<Arc<LockKeys>> {
    core.keys(name, LockKeys::fair)
}

/// Takes (or re-enters) the fair lock for the claim's owner. Without
/// `wait`, one try that never queues; with it, a place in the line until
/// taken or `deadline` passes (`Ok(None)`).
pub(crate) async fn acquire(
    core: &Core,
    claim: Claim<'_>,
    deadline: Option<Instant>,
    wait: bool,
) -> Result<Option<Arc<HoldState>>> {
    if let Some(hold) = core.reenter(claim).await? {
        return Ok(Some(hold));
    }
    core.acquire_in_line(claim, deadline, wait, FairAcquire, '1')
        .await
}
