//! A read-write lock on the floor: read and write holds are holds of two
//! kinds on one set of keys (registry, watchdog, re-entry, guards,
//! settlements as a lock's), and acquisitions wait in a line kept in Redis
//! (`line`) that gives waiting writers preference (`rw_lock.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{Claim, Found, HoldState};
use super::keys::{Kind, LockKeys};
use super::wire::rw_lock::RwAcquire;
use super::Core;
use crate::error::{Error, Result};

/// The keys of the read and the write side of the read-write lock called
/// `name`, after checking the name.
pub(crate) fn keys(core: &Core, name: &str) -> Result<(Arc<LockKeys>, Arc<LockKeys>)> {
    core.check_name(name)?;
    let prefix = &core.settings.prefix;
    Ok((
        Arc::new(LockKeys::rw(prefix, name, Kind::RwRead)),
        Arc::new(LockKeys::rw(prefix, name, Kind::RwWrite)),
    ))
}

/// Takes the side the claim's keys name (the other side's keys in `other`)
/// for its owner: re-enters a hold this client has, refuses an upgrade,
/// else tries once or waits in line.
pub(crate) async fn acquire(
    core: &Core,
    claim: Claim<'_>,
    other: &Arc<LockKeys>,
    deadline: Option<Instant>,
    wait: bool,
    prefer_readers: bool,
) -> Result<Option<Arc<HoldState>>> {
    if let Some(hold) = core.reenter(claim).await? {
        return Ok(Some(hold));
    }
    let keys = claim.keys;
    if keys.kind == Kind::RwWrite {
        if let Found::Live(_) = core.holds.find(other, claim.owner) {
            return Err(Error::UpgradeNotSupported {
                name: keys.name.to_string(),
            });
        }
    }
    // The member names the kind of waiter (see `rw_lock.lua`).
    let tag = match (keys.kind, prefer_readers) {
        (Kind::RwWrite, _) => 'W',
        (_, true) => 'P',
        _ => 'R',
    };
    let how = RwAcquire { prefer_readers };
    core.acquire_in_line(claim, deadline, wait, how, tag).await
}
