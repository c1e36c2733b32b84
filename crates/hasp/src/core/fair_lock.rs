//! A fair lock's operations on the floor: a lock's holds (registry,
//! watchdog, re-entry, guards) with acquisitions that wait in a line kept in
//! Redis (`line`) instead of racing, and releases that wake the head of the
//! line only (`fair_lock.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{HoldState, Lease};
use super::keys::LockKeys;
use super::wire::fair_lock::FairAcquire;
use super::Core;
use crate::error::Result;
use hasp_owner::Owner;

impl Core {
    /// The keys of the fair lock called `name`, after checking the name.
    pub(crate) fn fair_keys(&self, name: &str) -> Result<Arc<LockKeys>> {
        let lock = self.keys(name)?; // the same checks as a lock's name
        Ok(Arc::new(LockKeys::fair(&self.settings.prefix, &lock.name)))
    }

    /// Takes the fair lock (re-entries are handled by the caller). Without
    /// `wait`, one try that never queues.
    pub(super) async fn acquire_fair(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Arc<HoldState>>> {
        self.acquire_in_line(keys, owner, lease, deadline, wait, FairAcquire, '1')
            .await
    }
}
