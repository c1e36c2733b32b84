//! A semaphore's operations on the floor: permits taken, given back,
//! renewed and waited for with the machinery the lock uses (the batcher's
//! calls and settlements, the holds registry and watchdog, the waiters'
//! subscriptions), plus a queue in Redis so that waiters of every client
//! are served in order of arrival (`semaphore.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{Found, HoldState, Lease, ReleaseStep};
use super::keys::LockKeys;
use super::reply::{HoldReply, Undo};
use super::waiters::Attempt;
use super::wire::hold::{Acquire, Place, Step};
use super::wire::semaphore::{PermitAcquire, PoolOp, Resize};
use super::wire::{Op, Reply};
use super::{closed, Core};
use crate::error::{Error, Result};
use hasp_owner::Owner;

impl Core {
    /// The keys of the semaphore called `name`, after checking the name.
    pub(crate) fn semaphore_keys(&self, name: &str) -> Result<Arc<LockKeys>> {
        let lock = self.keys(name)?; // the same checks as a lock's name
        Ok(Arc::new(LockKeys::semaphore(
            &self.settings.prefix,
            &lock.name,
        )))
    }

    /// Takes `permits` for `owner`. Without `wait`, one try that never
    /// queues; with it, queues in Redis until they are taken or `deadline`
    /// passes (`Ok(None)`).
    pub(crate) async fn acquire_permits(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        permits: u32,
        lease: Lease,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Arc<HoldState>>> {
        if let Found::Stale { redis_holds } = self.holds.find(keys, owner) {
            // Its belief ran out, but Redis may still count its permits (the
            // lease ends there a little later): give them back first, or the
            // next grant's lease would revive them.
            self.release_permits_in_background(keys, owner, redis_holds);
        }
        if !wait {
            return match self.take_permits(keys, owner, permits, lease, None).await? {
                Attempt::Done(hold) => Ok(Some(hold)),
                Attempt::Busy(_) => Ok(None),
            };
        }
        let (id, place) = self.new_place(permits);
        let leave = Op::hold::<PermitAcquire>(
            keys,
            Step::Leave {
                member: place.member.clone(),
            },
        );
        let attempt = || self.take_permits(keys, owner, permits, lease, Some(place.clone()));
        self.wait_in_line(keys, id, leave, deadline, attempt).await
    }

    /// One try (batched with whatever else is pending).
    async fn take_permits(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        permits: u32,
        lease: Lease,
        place: Option<Place>,
    ) -> Result<Attempt<Arc<HoldState>>> {
        let sent_at = Instant::now();
        let lease_ms = self.lease_ms(lease);
        let acquire = Acquire {
            owner: owner.clone(),
            count: permits,
            lease_ms,
            nonce: self.queue.nonce(),
            place,
        };
        let op = Op::hold(keys, Step::Acquire(acquire, PermitAcquire));
        let undo = Undo::of(&op, &self.queue);
        let reply = HoldReply::new(self.queue.call(op), undo, |reply| {
            matches!(reply, Ok(Reply::Granted))
        });
        match reply.await.ok_or_else(closed)?? {
            Reply::Granted => {
                let confirmed = (sent_at, lease_ms);
                let hold = self
                    .holds
                    .insert_permits(keys, owner, permits, lease, confirmed);
                Ok(Attempt::Done(hold))
            }
            Reply::Busy { ttl } => Ok(Attempt::Busy(ttl)),
            other => Err(unexpected(keys, other)),
        }
    }

    /// Gives back `permits` of `hold` (one guard's).
    pub(crate) async fn release_permits(&self, hold: &Arc<HoldState>, permits: u32) -> Result<()> {
        if let ReleaseStep::NotHeld = self.holds.release_permits(hold, permits) {
            return Err(not_held(&hold.keys));
        }
        if hold.is_lost() {
            if !hold.is_gone() {
                self.release_permits_in_background(&hold.keys, &hold.owner, permits);
            }
            return Err(not_held(&hold.keys));
        }
        self.give_back(&hold.keys, &hold.owner, permits).await
    }

    /// Gives back `permits` of `owner` in Redis, whoever took them.
    pub(crate) async fn give_back(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        permits: u32,
    ) -> Result<()> {
        let op = Op::release(keys, owner, permits, self.queue.nonce());
        match self.queue.call(op).await.map_err(|_| closed())?? {
            Reply::Released | Reply::StillHeld => Ok(()),
            Reply::NotHeld => Err(not_held(keys)),
            other => Err(unexpected(keys, other)),
        }
    }

    /// Gives back one guard's permits without waiting for Redis (a dropped
    /// guard).
    pub(crate) fn release_permits_detached(&self, hold: &Arc<HoldState>, permits: u32) {
        if let ReleaseStep::Final { .. } = self.holds.release_permits(hold, permits) {
            if !hold.is_gone() {
                self.release_permits_in_background(&hold.keys, &hold.owner, permits);
            }
        }
    }

    /// Drops one guard's permits from the registry, leaving them in Redis
    /// (see `Permit::forget`).
    pub(crate) fn forget_permits(&self, hold: &Arc<HoldState>, permits: u32) {
        let _ = self.holds.release_permits(hold, permits);
    }

    fn release_permits_in_background(&self, keys: &Arc<LockKeys>, owner: &Owner, permits: u32) {
        self.queue
            .detach(Op::release(keys, owner, permits, self.queue.nonce()));
    }

    /// Takes every permit free now for `owner` (`Ok(None)`: none).
    pub(crate) async fn drain_permits(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
    ) -> Result<Option<(Arc<HoldState>, u32)>> {
        let sent_at = Instant::now();
        let lease_ms = self.lease_ms(lease);
        let op = Op::Pool(PoolOp::Drain {
            keys: keys.clone(),
            owner: owner.clone(),
            lease_ms,
            nonce: self.queue.nonce(),
        });
        let taken = match self.queue.call(op).await.map_err(|_| closed())?? {
            Reply::Value(n) => u32::try_from(n).unwrap_or(u32::MAX),
            other => return Err(unexpected(keys, other)),
        };
        if taken == 0 {
            return Ok(None);
        }
        let hold = self
            .holds
            .insert_permits(keys, owner, taken, lease, (sent_at, lease_ms));
        Ok(Some((hold, taken)))
    }

    /// Re-arms the lease of `owner`'s permits to `lease_ms` if it holds any
    /// (true); a hold of them in this client moves its belief end.
    pub(crate) async fn extend_permits(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease_ms: u64,
    ) -> Result<bool> {
        let sent_at = Instant::now();
        let op = Op::hold::<PermitAcquire>(
            keys,
            Step::Extend {
                owner: owner.clone(),
                lease_ms: Some(lease_ms),
                token: 0,
            },
        );
        let held = matches!(
            self.queue.call(op).await.map_err(|_| closed())??,
            Reply::Extended
        );
        if let Found::Live(hold) = self.holds.find(keys, owner) {
            if held {
                hold.confirm(sent_at, lease_ms);
            } else {
                hold.mark_gone();
            }
        }
        Ok(held)
    }

    /// The capacity minus the permits held.
    pub(crate) async fn available_permits(&self, keys: &Arc<LockKeys>) -> Result<i64> {
        let op = PoolOp::Available { keys: keys.clone() };
        self.pool_value(op).await
    }

    /// Milliseconds left on `owner`'s lease (negative: it holds none).
    pub(crate) async fn lease_left(&self, keys: &Arc<LockKeys>, owner: &Owner) -> Result<i64> {
        let op = PoolOp::LeaseLeft {
            keys: keys.clone(),
            owner: owner.clone(),
        };
        self.pool_value(op).await
    }

    /// An operation on a semaphore's pool, which answers a number (see
    /// `semaphore.lua`).
    async fn pool_value(&self, op: PoolOp) -> Result<i64> {
        let keys = op.keys().clone();
        match self
            .queue
            .call(Op::Pool(op))
            .await
            .map_err(|_| closed())??
        {
            Reply::Value(n) => Ok(n),
            other => Err(unexpected(&keys, other)),
        }
    }

    /// Changes the capacity: `Ok(false)` if a `Try` found one set.
    pub(crate) async fn resize(&self, keys: &Arc<LockKeys>, resize: Resize) -> Result<bool> {
        let op = PoolOp::Resize {
            keys: keys.clone(),
            resize,
        };
        match self.pool_value(op).await? {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(Error::invalid(
                "permits",
                "would lower the capacity below zero",
            )),
        }
    }
}

fn not_held(keys: &LockKeys) -> Error {
    Error::NotHeld {
        name: keys.name.to_string(),
    }
}

fn unexpected(keys: &LockKeys, reply: Reply) -> Error {
    Error::Protocol(format!(
        "semaphore {:?}: unexpected reply {reply:?}",
        keys.name
    ))
}
