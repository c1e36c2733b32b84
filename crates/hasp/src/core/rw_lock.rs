//! A read-write lock's operations on the floor: read and write holds are
//! holds of two kinds on one set of keys (registry, watchdog, re-entry,
//! guards, settlements as a lock's), and acquisitions wait in a line kept in
//! Redis (`line`) that gives waiting writers preference (`rw_lock.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{Found, HoldState, Lease};
use super::keys::{Kind, LockKeys};
use super::wire::rw_lock::RwAcquire;
use super::Core;
use crate::error::{Error, Result};
use hasp_owner::Owner;

impl Core {
    /// The keys of the read and the write side of the read-write lock
    /// called `name`, after checking the name.
    pub(crate) fn rw_keys(&self, name: &str) -> Result<(Arc<LockKeys>, Arc<LockKeys>)> {
        let lock = self.keys(name)?; // the same checks as a lock's name
        let prefix = &self.settings.prefix;
        Ok((
            Arc::new(LockKeys::rw(prefix, &lock.name, Kind::RwRead)),
            Arc::new(LockKeys::rw(prefix, &lock.name, Kind::RwWrite)),
        ))
    }

    /// Takes the side `keys` name (the other side's keys in `other`) for
    /// `owner`: re-enters a hold this client has, refuses an upgrade, else
    /// tries once or waits in line.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn acquire_rw(
        &self,
        keys: &Arc<LockKeys>,
        other: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
        deadline: Option<Instant>,
        wait: bool,
        prefer_readers: bool,
    ) -> Result<Option<Arc<HoldState>>> {
        if let Some(hold) = self.reenter(keys, owner, lease).await? {
            return Ok(Some(hold));
        }
        if keys.kind == Kind::RwWrite {
            if let Found::Live(_) = self.holds.find(other, owner) {
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
        self.acquire_in_line(keys, owner, lease, deadline, wait, how, tag)
            .await
    }
}
