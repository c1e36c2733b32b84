//! A read-write lock's operations on the floor: read and write holds are
//! holds of two kinds on one set of keys (registry, watchdog, re-entry,
//! guards, settlements as a lock's), and acquisitions wait in a line kept in
//! Redis (`line`) that gives waiting writers preference (`rw_lock.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{Found, HoldState, Lease};
use super::keys::{Kind, LockKeys};
use super::waiters::Attempt;
use super::wire::rw_lock::RwOp;
use super::wire::semaphore::Place;
use super::wire::Op;
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
        let attempt =
            |place: Option<Place>| self.rw_attempt(keys, owner, lease, place, prefer_readers);
        if !wait {
            return match attempt(None).await? {
                Attempt::Done(hold) => Ok(Some(hold)),
                Attempt::Busy(_) => Ok(None),
            };
        }
        let (id, mut place) = self.new_place(1);
        // The member names the kind of waiter (see `rw_lock.lua`).
        let kind = match (keys.kind, prefer_readers) {
            (Kind::RwWrite, _) => 'W',
            (_, true) => 'P',
            _ => 'R',
        };
        place.member = format!("{kind}|{id}").into();
        let leave = Op::Rw(RwOp::Leave {
            keys: keys.clone(),
            member: place.member.clone(),
        });
        let again = || attempt(Some(place.clone()));
        self.wait_in_line(keys, id, leave, deadline, again).await
    }

    async fn rw_attempt(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
        place: Option<Place>,
        prefer_readers: bool,
    ) -> Result<Attempt<Arc<HoldState>>> {
        let lease_ms = self.lease_ms(lease);
        let op = Op::Rw(RwOp::Acquire {
            keys: keys.clone(),
            owner: owner.clone(),
            lease_ms,
            nonce: self.queue.nonce(),
            place,
            prefer_readers,
        });
        self.take_hold(keys, owner, lease, lease_ms, op).await
    }

    /// The release of `holds` holds of `owner` on one side of a read-write
    /// lock.
    pub(super) fn rw_release(&self, keys: &Arc<LockKeys>, owner: &Owner, holds: u32) -> Op {
        Op::Rw(RwOp::Release {
            keys: keys.clone(),
            owner: owner.clone(),
            holds,
            nonce: self.queue.nonce(),
        })
    }
}
