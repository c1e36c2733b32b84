//! A semaphore on the floor: permits taken, given back, renewed and waited
//! for with the machinery the lock uses (the batcher's calls and
//! settlements, the holds registry and watchdog, the waiters'
//! subscriptions), plus a queue in Redis so that waiters of every client
//! are served in order of arrival (`semaphore.lua`).

use std::sync::Arc;
use std::time::Instant;

use super::holds::{Claim, Found, HoldState, ReleaseStep};
use super::keys::LockKeys;
use super::reply::{HoldReply, Undo};
use super::waiters::Attempt;
use super::wire::hold::{Acquire, Place, Step};
use super::wire::semaphore::{PermitAcquire, PoolOp, Resize};
use super::wire::{Op, Reply};
use super::{closed, Core};
use crate::error::{Error, Result};
use hasp_owner::Owner;

/// The keys of the semaphore called `name`, after checking the name.
pub(crate) fn keys(core: &Core, name: &str) -> Result<Arc<LockKeys>> {
    core.keys(name, LockKeys::semaphore)
}

/// Takes `permits` for the claim's owner. Without `wait`, one try that
/// never queues; with it, queues in Redis until they are taken or
/// `deadline` passes (`Ok(None)`).
pub(crate) async fn acquire(
    core: &Core,
    claim: Claim<'_>,
    permits: u32,
    deadline: Option<Instant>,
    wait: bool,
) -> Result<Option<Arc<HoldState>>> {
    let (keys, owner) = (claim.keys, claim.owner);
    if let Found::Stale { redis_holds } = core.holds.find(keys, owner) {
        // Its belief ran out, but Redis may still count its permits (the
        // lease ends there a little later): give them back first, or the
        // next grant's lease would revive them.
        release_in_background(core, keys, owner, redis_holds);
    }
    if !wait {
        return match take(core, claim, permits, None).await? {
            Attempt::Done(hold) => Ok(Some(hold)),
            Attempt::Busy(_) => Ok(None),
        };
    }
    let (id, place) = core.new_place(permits);
    let leave = Op::hold::<PermitAcquire>(
        keys,
        Step::Leave {
            member: place.member.clone(),
        },
    );
    let attempt = || take(core, claim, permits, Some(place.clone()));
    core.wait_in_line(keys, id, leave, deadline, attempt).await
}

/// One try (batched with whatever else is pending).
async fn take(
    core: &Core,
    claim: Claim<'_>,
    permits: u32,
    place: Option<Place>,
) -> Result<Attempt<Arc<HoldState>>> {
    let sent_at = Instant::now();
    let lease_ms = core.lease_ms(claim.lease);
    let acquire = Acquire {
        owner: claim.owner.clone(),
        count: permits,
        lease_ms,
        nonce: core.queue.nonce(),
        place,
    };
    let op = Op::hold(claim.keys, Step::Acquire(acquire, PermitAcquire));
    let undo = Undo::of(&op, &core.queue);
    let reply = HoldReply::new(core.queue.call(op), undo, |reply| {
        matches!(reply, Ok(Reply::Granted))
    });
    match reply.await.ok_or_else(closed)?? {
        Reply::Granted => {
            let confirmed = (sent_at, lease_ms);
            let hold = core.holds.insert_permits(claim, permits, confirmed);
            Ok(Attempt::Done(hold))
        }
        Reply::Busy { ttl } => Ok(Attempt::Busy(ttl)),
        other => Err(unexpected(claim.keys, other)),
    }
}

/// Gives back `permits` of `hold` (one guard's).
pub(crate) async fn release(core: &Core, hold: &Arc<HoldState>, permits: u32) -> Result<()> {
    if let ReleaseStep::NotHeld = core.holds.release_permits(hold, permits) {
        return Err(not_held(&hold.keys));
    }
    if hold.is_lost() {
        if !hold.is_gone() {
            release_in_background(core, &hold.keys, &hold.owner, permits);
        }
        return Err(not_held(&hold.keys));
    }
    give_back(core, &hold.keys, &hold.owner, permits).await
}

/// Gives back `permits` of `owner` in Redis, whoever took them.
pub(crate) async fn give_back(
    core: &Core,
    keys: &Arc<LockKeys>,
    owner: &Owner,
    permits: u32,
) -> Result<()> {
    let op = Op::release(keys, owner, permits, core.queue.nonce());
    match core.call(op).await? {
        Reply::Released | Reply::StillHeld => Ok(()),
        Reply::NotHeld => Err(not_held(keys)),
        other => Err(unexpected(keys, other)),
    }
}

/// Gives back one guard's permits without waiting for Redis (a dropped
/// guard).
pub(crate) fn release_detached(core: &Core, hold: &Arc<HoldState>, permits: u32) {
    if let ReleaseStep::Final { .. } = core.holds.release_permits(hold, permits) {
        if !hold.is_gone() {
            release_in_background(core, &hold.keys, &hold.owner, permits);
        }
    }
}

/// Drops one guard's permits from the registry, leaving them in Redis (see
/// `Permit::forget`).
pub(crate) fn forget(core: &Core, hold: &Arc<HoldState>, permits: u32) {
    let _ = core.holds.release_permits(hold, permits);
}

fn release_in_background(core: &Core, keys: &Arc<LockKeys>, owner: &Owner, permits: u32) {
    core.queue
        .detach(Op::release(keys, owner, permits, core.queue.nonce()));
}

/// Takes every permit free now for the claim's owner (`Ok(None)`: none).
pub(crate) async fn drain(core: &Core, claim: Claim<'_>) -> Result<Option<(Arc<HoldState>, u32)>> {
    let sent_at = Instant::now();
    let lease_ms = core.lease_ms(claim.lease);
    let op = Op::Pool(PoolOp::Drain {
        keys: claim.keys.clone(),
        owner: claim.owner.clone(),
        lease_ms,
        nonce: core.queue.nonce(),
    });
    let taken = match core.call(op).await? {
        Reply::Value(n) => u32::try_from(n).unwrap_or(u32::MAX),
        other => return Err(unexpected(claim.keys, other)),
    };
    if taken == 0 {
        return Ok(None);
    }
    let confirmed = (sent_at, lease_ms);
    let hold = core.holds.insert_permits(claim, taken, confirmed);
    Ok(Some((hold, taken)))
}

/// Re-arms the lease of `owner`'s permits to `lease_ms` if it holds any
/// (true); a hold of them in this client moves its belief end.
pub(crate) async fn extend(
    core: &Core,
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
    let held = matches!(core.call(op).await?, Reply::Extended);
    if let Found::Live(hold) = core.holds.find(keys, owner) {
        if held {
            hold.confirm(sent_at, lease_ms);
        } else {
            hold.mark_gone();
        }
    }
    Ok(held)
}

/// The capacity minus the permits held.
pub(crate) async fn available(core: &Core, keys: &Arc<LockKeys>) -> Result<i64> {
    let op = PoolOp::Available { keys: keys.clone() };
    pool_value(core, op).await
}

/// Milliseconds left on `owner`'s lease (negative: it holds none).
pub(crate) async fn lease_left(core: &Core, keys: &Arc<LockKeys>, owner: &Owner) -> Result<i64> {
    let op = PoolOp::LeaseLeft {
        keys: keys.clone(),
        owner: owner.clone(),
    };
    pool_value(core, op).await
}

/// An operation on a semaphore's pool, which answers a number (see
/// `semaphore.lua`).
async fn pool_value(core: &Core, op: PoolOp) -> Result<i64> {
    let keys = op.keys().clone();
    match core.call(Op::Pool(op)).await? {
        Reply::Value(n) => Ok(n),
        other => Err(unexpected(&keys, other)),
    }
}

/// Changes the capacity: `Ok(false)` if a `Try` found one set.
pub(crate) async fn resize(core: &Core, keys: &Arc<LockKeys>, resize: Resize) -> Result<bool> {
    let op = PoolOp::Resize {
        keys: keys.clone(),
        resize,
    };
    match pool_value(core, op).await? {
        1 => Ok(true),
        0 => Ok(false),
        _ => Err(Error::invalid(
            "permits",
            "would lower the capacity below zero",
        )),
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
