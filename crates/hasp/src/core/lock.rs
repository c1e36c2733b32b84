//! The reentrant lock on the floor: taking it (one try, or waiting in this
//! client's line for its release message) and forcing it free. A plain lock
//! is this lock without its fencing counter: the same operations, which its
//! keys' kind sends under its own opcodes (`plain_lock.lua`) or as native
//! commands (`wire::native`). What every lock-like kind shares (re-entry,
//! the hold's reply, release, renewal) is the engine's own (`mod.rs`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{Claim, HoldState};
use super::keys::LockKeys;
use super::waiters::{self, ran_out, remaining, unconfirmed_as_busy, Attempt, RECHECK};
use super::wire::lock::LockOp;
use super::wire::{Op, Reply};
use super::{unexpected, Core};
use crate::error::Result;

/// The keys of the lock called `name`, after checking the name.
pub(crate) fn keys(core: &Core, name: &str) -> Result<Arc<LockKeys>> {
    core.keys(name, LockKeys::new)
}

/// The keys of the plain lock called `name`, after checking the name.
pub(crate) fn plain_keys(core: &Core, name: &str) -> Result<Arc<LockKeys>> {
    core.keys(name, LockKeys::plain)
}

/// Takes (or re-enters) the lock for the claim's owner. Without `wait`, one
/// try; with it, until acquired or `deadline`. `Ok(None)`: held by another
/// owner when the time ran out.
pub(crate) async fn acquire(
    core: &Core,
    claim: Claim<'_>,
    deadline: Option<Instant>,
    wait: bool,
) -> Result<Option<Arc<HoldState>>> {
    if let Some(hold) = core.reenter(claim).await? {
        return Ok(Some(hold));
    }
    let keys = claim.keys;
    // Queue behind local waiters rather than barge past them.
    let behind_local_waiters = wait && core.waiters.has_waiters(&keys.channel);
    let mut ttl = None;
    if !behind_local_waiters {
        let first = attempt(core, claim, wait);
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
    let lease_ms = core.lease_ms(claim.lease);
    let waiter = core.waiters.join(keys, claim.owner, lease_ms, &core.queue);
    // Wait for the subscription (a release before it would be missed), but
    // no longer than the lock's TTL: past it the next try is due.
    let confirm = remaining(deadline)
        .min(core.settings.response_timeout)
        .min(ttl.unwrap_or(RECHECK));
    waiter.ready(confirm).await;
    let again = || attempt(core, claim, true);
    let granted = |grant: waiters::Grant| {
        let confirmed = (grant.sent_at, lease_ms);
        Some(core.holds.insert(claim, grant.token, confirmed, None))
    };
    waiter
        .wait_for(deadline, ttl, behind_local_waiters, again, granted)
        .await
}

/// One try, never queuing: re-enters a hold this client has for the claim's
/// owner, or asks Redis once. `flag_waiting` tells the holder's client that
/// someone waits (it then frees the lock instead of handing it on).
pub(crate) async fn try_once(
    core: &Core,
    claim: Claim<'_>,
    flag_waiting: bool,
) -> Result<Attempt<Arc<HoldState>>> {
    if let Some(hold) = core.reenter(claim).await? {
        return Ok(Attempt::Done(hold));
    }
    attempt(core, claim, flag_waiting).await
}

/// One acquire attempt (batched with whatever else is pending).
async fn attempt(
    core: &Core,
    claim: Claim<'_>,
    flag_waiting: bool,
) -> Result<Attempt<Arc<HoldState>>> {
    let lease_ms = core.lease_ms(claim.lease);
    let op = Op::Lock(LockOp::Acquire {
        keys: claim.keys.clone(),
        owner: claim.owner.clone(),
        lease_ms,
        flag_waiting,
        nonce: core.queue.nonce(),
    });
    core.take_hold(claim, lease_ms, op).await
}

/// Frees the lock whoever holds it and wakes every client's waiters.
pub(crate) async fn force_release(core: &Core, keys: &Arc<LockKeys>) -> Result<bool> {
    let op = Op::Lock(LockOp::Force { keys: keys.clone() });
    match core.call(op).await? {
        Reply::Forced(freed) => Ok(freed),
        other => Err(unexpected(keys, other)),
    }
}
