//! A semaphore's operations in the batch call (`semaphore.lua`): its
//! permits' lifecycle (`hold`), and the operations on the pool as a whole.

use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;

use super::hold::{Acquire, Acquisition, Codes, HoldOp, Place};
use super::{Nonce, Op, Reply};
use crate::core::keys::LockKeys;
use hasp_owner::Owner;

/// One step of a semaphore's permits' life.
pub(crate) type PermitOp = HoldOp<PermitAcquire>;

/// A semaphore's acquisition: the permits (`Acquire::count`) are taken if
/// free; with a place, queued for (or the place refreshed) if not.
#[derive(Debug, Clone)]
pub(crate) struct PermitAcquire;

impl Acquisition for PermitAcquire {
    const CODES: Codes = Codes {
        release: "pr",
        extend: "pe",
        undo: "pu",
        settle: "ps",
        leave: "pq",
    };
    const FENCED: bool = false;
    const RENEWAL_SENDS_TOKEN: bool = false;
    const MOST_ARGS: usize = 7;

    fn write_acquire(&self, acquire: &Acquire, _keys: &LockKeys, cmd: &mut Cmd) {
        let op = if acquire.place.is_some() { "pw" } else { "pa" };
        cmd.arg(op)
            .arg(acquire.owner.id())
            .arg(acquire.count)
            .arg(acquire.lease_ms)
            .arg(acquire.nonce);
        if acquire.place.is_some() {
            Place::write(acquire.place.as_ref(), cmd);
        }
    }

    fn decode_acquire(&self, _keys: &LockKeys, code: i64) -> Option<Reply> {
        Some(match code {
            1 => Reply::Granted,
            0 => Reply::Busy { ttl: None },
            ms if ms < 0 => Reply::Busy {
                ttl: Some(Duration::from_millis(ms.unsigned_abs())),
            },
            _ => return None,
        })
    }

    fn wrap(op: PermitOp) -> Op {
        Op::Permits(op)
    }
}

/// How a capacity operation changes the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resize {
    /// Set it if none is set, with an expiry of the whole semaphore (ms; 0:
    /// none).
    Try { capacity: u64, expiry_ms: u64 },
    /// Set it.
    Set(u64),
    /// Add to it (negative: lower it), never below zero.
    Add(i64),
}

/// An operation on a semaphore's pool as a whole; each answers a number.
#[derive(Debug, Clone)]
pub(crate) enum PoolOp {
    /// Capacity minus the permits held.
    Available { keys: Arc<LockKeys> },
    /// Change the capacity.
    Resize { keys: Arc<LockKeys>, resize: Resize },
    /// Take every permit free now.
    Drain {
        keys: Arc<LockKeys>,
        owner: Owner,
        lease_ms: u64,
        nonce: Nonce,
    },
    /// Milliseconds left on `owner`'s lease.
    LeaseLeft { keys: Arc<LockKeys>, owner: Owner },
}

impl PoolOp {
    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        match self {
            PoolOp::Available { keys }
            | PoolOp::Resize { keys, .. }
            | PoolOp::Drain { keys, .. }
            | PoolOp::LeaseLeft { keys, .. } => keys,
        }
    }

    /// A drain's count is unknown: were its reply lost, its permits run out
    /// with their lease (nobody renews them).
    pub(super) fn needs_replicas(&self) -> bool {
        matches!(self, PoolOp::Drain { .. })
    }

    pub(super) fn size(&self) -> (usize, usize, usize) {
        let keys = self.keys();
        let owner = match self {
            PoolOp::Drain { owner, .. } | PoolOp::LeaseLeft { owner, .. } => owner.id().len(),
            PoolOp::Available { .. } | PoolOp::Resize { .. } => 0,
        };
        (5, 4, 5 * keys.lock.len() + 30 + owner + 60)
    }

    pub(super) fn write_keys(&self, cmd: &mut Cmd) {
        let keys = self.keys();
        cmd.arg(&*keys.lock);
        for key in keys.extra.iter() {
            cmd.arg(key);
        }
    }

    pub(super) fn write_args(&self, cmd: &mut Cmd) {
        match self {
            PoolOp::Available { .. } => {
                cmd.arg("pv");
            }
            PoolOp::Resize { resize, .. } => {
                match *resize {
                    Resize::Try {
                        capacity,
                        expiry_ms,
                    } => cmd.arg("pc").arg("try").arg(capacity).arg(expiry_ms),
                    Resize::Set(n) => cmd.arg("pc").arg("set").arg(n).arg(0),
                    Resize::Add(n) => cmd.arg("pc").arg("add").arg(n).arg(0),
                };
            }
            PoolOp::Drain {
                owner,
                lease_ms,
                nonce,
                ..
            } => {
                cmd.arg("pd").arg(owner.id()).arg(*lease_ms).arg(nonce);
            }
            PoolOp::LeaseLeft { owner, .. } => {
                cmd.arg("pl").arg(owner.id());
            }
        }
    }
}
