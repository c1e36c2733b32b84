//! The reentrant lock's operations on the floor: taking it (one try, or
//! waiting in this client's line for its release message), and forcing it
//! free. A plain lock is this lock without its fencing counter: the same
//! operations, which its keys' kind sends under its own opcodes
//! (`plain_lock.lua`) or as native commands (`wire::native`). What every lock-like kind shares (re-entry, the hold's reply,
//! release, renewal) is the floor's own (`mod.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{HoldState, Lease};
use super::keys::{Kind, LockKeys};
use super::waiters::{self, ran_out, remaining, unconfirmed_as_busy, Attempt, RECHECK};
use super::wire::lock::LockOp;
use super::wire::{Op, Reply};
use super::{closed, unexpected, Core};
use crate::error::Result;
use hasp_owner::Owner;

impl Core {
    /// Takes (or re-enters) the lock for `owner`. Without `wait`, one try;
    /// with it, until acquired or `deadline`. `Ok(None)`: held by another
    /// owner when the time ran out.
    pub(crate) async fn acquire(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Arc<HoldState>>> {
        if let Some(hold) = self.reenter(keys, owner, lease).await? {
            return Ok(Some(hold));
        }
        if keys.kind == Kind::FairLock {
            return self.acquire_fair(keys, owner, lease, deadline, wait).await;
        }
        // Queue behind local waiters rather than barge past them.
        let behind_local_waiters = wait && self.waiters.has_waiters(&keys.channel);
        let mut ttl = None;
        if !behind_local_waiters {
            let first = self.attempt(keys, owner, lease, wait);
            let first = waiters::within_wait(deadline, first).await;
            let mut unconfirmed = None;
            let first = if wait {
                unconfirmed_as_busy(first, deadline, &mut unconfirmed)
            } else {
                first
            };
            match first? {
                Attempt::Done(hold) => return Ok(Some(hold)),
                Attempt::Busy(t) => ttl = t,
            }
            if !wait || remaining(deadline).is_zero() {
                return ran_out(unconfirmed);
            }
        }
        let lease_ms = self.lease_ms(lease);
        let waiter = self.waiters.join(keys, owner, lease_ms, &self.queue);
        // Wait for the subscription (a release before it would be missed),
        // but no longer than the lock's TTL: past it the next try is due.
        let confirm = remaining(deadline)
            .min(self.settings.response_timeout)
            .min(ttl.unwrap_or(RECHECK));
        waiter.ready(confirm).await;
        let attempt = || self.attempt(keys, owner, lease, true);
        let granted = |grant: waiters::Grant| {
            let confirmed = (grant.sent_at, lease_ms);
            Some(
                self.holds
                    .insert(keys, owner, grant.token, lease, confirmed, None),
            )
        };
        waiter
            .wait_for(deadline, ttl, behind_local_waiters, attempt, granted)
            .await
    }

    /// One try, never queuing: re-enters a hold this client has for `owner`,
    /// or asks Redis once. `flag_waiting` tells the holder's client that
    /// someone waits (it then frees the lock instead of handing it on).
    pub(crate) async fn try_once(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
        flag_waiting: bool,
    ) -> Result<Attempt<Arc<HoldState>>> {
        if let Some(hold) = self.reenter(keys, owner, lease).await? {
            return Ok(Attempt::Done(hold));
        }
        self.attempt(keys, owner, lease, flag_waiting).await
    }

    /// One acquire attempt (batched with whatever else is pending).
    async fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease: Lease,
        flag_waiting: bool,
    ) -> Result<Attempt<Arc<HoldState>>> {
        let lease_ms = self.lease_ms(lease);
        let op = Op::Lock(LockOp::Acquire {
            keys: keys.clone(),
            owner: owner.clone(),
            lease_ms,
            flag_waiting,
            nonce: self.queue.nonce(),
        });
        self.take_hold(keys, owner, lease, lease_ms, op).await
    }

    /// The keys of the plain lock called `name`, after checking the name.
    pub(crate) fn plain_keys(&self, name: &str) -> Result<Arc<LockKeys>> {
        let lock = self.keys(name)?; // the same checks as a lock's name
        Ok(Arc::new(LockKeys::plain(&self.settings.prefix, &lock.name)))
    }

    /// Frees the lock whoever holds it and wakes every client's waiters.
    pub(crate) async fn force_release(&self, keys: &Arc<LockKeys>) -> Result<bool> {
        let op = Op::Lock(LockOp::Force { keys: keys.clone() });
        match self.queue.call(op).await.map_err(|_| closed())?? {
            Reply::Forced(freed) => Ok(freed),
            other => Err(unexpected(keys, other)),
        }
    }
}
