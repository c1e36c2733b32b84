//! A fair lock's operations on the floor: a lock's holds (registry,
//! watchdog, re-entry, guards) with acquisitions that wait in a line kept in
//! Redis (`line`) instead of racing, and releases that wake the head of the
//! line only (`fair_lock.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{HoldState, Lease};
use super::keys::LockKeys;
use super::waiters::Attempt;
use super::wire::fair_lock::FairOp;
use super::wire::semaphore::Place;
use super::wire::Op;
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
        if !wait {
            return match self.fair_attempt(keys, owner, lease, None).await? {
                Attempt::Done(hold) => Ok(Some(hold)),
                Attempt::Busy(_) => Ok(None),
            };
        }
        let (id, place) = self.new_place(1);
        let leave = Op::Fair(FairOp::Leave {
            keys: keys.clone(),
            member: place.member.clone(),
        });
        let attempt = || self.fair_attempt(keys, owner, lease, Some(place.clone()));
        self.wait_in_line(keys, id, leave, deadline, attempt).await
    }

    async fn fair_attempt(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
        place: Option<Place>,
    ) -> Result<Attempt<Arc<HoldState>>> {
        let lease_ms = self.lease_ms(lease);
        let op = Op::Fair(FairOp::Acquire {
            keys: keys.clone(),
            owner: owner.clone(),
            lease_ms,
            nonce: self.queue.nonce(),
            place,
        });
        self.take_hold(keys, owner, lease, lease_ms, op).await
    }

    /// The release of `holds` holds of `owner` on a fair lock: no hand-off
    /// (that would pass the lock inside this client, past the line).
    pub(super) fn fair_release(&self, keys: &Arc<LockKeys>, owner: &Owner, holds: u32) -> Op {
        Op::Fair(FairOp::Release {
            keys: keys.clone(),
            owner: owner.clone(),
            holds,
            nonce: self.queue.nonce(),
        })
    }
}
