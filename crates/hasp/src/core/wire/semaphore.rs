//! A semaphore's operations in the batch call (`semaphore.lua`): encoded and
//! decoded here, beside the lock's in the parent module.

use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;

use super::{Nonce, Op, Reply};
use crate::core::keys::LockKeys;
use hasp_owner::Owner;

/// A waiter's place in a semaphore's queue: the member `<k>|<waiter id>`
/// and how long the place lasts unless the waiter asks again.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) member: Arc<str>,
    pub(crate) ttl_ms: u64,
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

/// One operation on a semaphore.
#[derive(Debug, Clone)]
pub(crate) enum PermitOp {
    /// Take `permits` for `owner`; with a `place`, queue for them if they
    /// are not free (or refresh the place).
    Acquire {
        keys: Arc<LockKeys>,
        owner: Owner,
        permits: u32,
        lease_ms: u64,
        nonce: Nonce,
        place: Option<Place>,
    },
    /// Give back `permits` of `owner`.
    Release {
        keys: Arc<LockKeys>,
        owner: Owner,
        permits: u32,
        nonce: Nonce,
    },
    /// Re-arm the lease of `owner`'s permits (`None`: only check them).
    Extend {
        keys: Arc<LockKeys>,
        owner: Owner,
        lease_ms: Option<u64>,
    },
    /// Undo the acquisition `nonce` if it was applied.
    Undo {
        keys: Arc<LockKeys>,
        owner: Owner,
        permits: u32,
        nonce: Nonce,
    },
    /// Apply the release `nonce` unless it was applied.
    Settle {
        keys: Arc<LockKeys>,
        owner: Owner,
        permits: u32,
        nonce: Nonce,
    },
    /// Leave the queue.
    Leave {
        keys: Arc<LockKeys>,
        member: Arc<str>,
    },
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

impl PermitOp {
    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        match self {
            PermitOp::Acquire { keys, .. }
            | PermitOp::Release { keys, .. }
            | PermitOp::Extend { keys, .. }
            | PermitOp::Undo { keys, .. }
            | PermitOp::Settle { keys, .. }
            | PermitOp::Leave { keys, .. }
            | PermitOp::Available { keys }
            | PermitOp::Resize { keys, .. }
            | PermitOp::Drain { keys, .. }
            | PermitOp::LeaseLeft { keys, .. } => keys,
        }
    }

    pub(super) fn is_extend(&self) -> bool {
        matches!(self, PermitOp::Extend { .. })
    }

    pub(super) fn needs_replicas(&self) -> bool {
        matches!(
            self,
            PermitOp::Acquire { .. }
                | PermitOp::Drain { .. }
                | PermitOp::Extend {
                    lease_ms: Some(_),
                    ..
                }
        )
    }

    /// See [`Op::settlement`].
    pub(super) fn settlement(&self) -> Vec<Op> {
        let op = match self {
            PermitOp::Acquire {
                keys,
                owner,
                permits,
                nonce,
                ..
            } => PermitOp::Undo {
                keys: keys.clone(),
                owner: owner.clone(),
                permits: *permits,
                nonce: *nonce,
            },
            PermitOp::Release {
                keys,
                owner,
                permits,
                nonce,
            } => PermitOp::Settle {
                keys: keys.clone(),
                owner: owner.clone(),
                permits: *permits,
                nonce: *nonce,
            },
            PermitOp::Undo { .. } | PermitOp::Settle { .. } => self.clone(),
            // A drain's count is unknown: its permits run out with their
            // lease (nobody renews them). A place runs out as well.
            _ => return Vec::new(),
        };
        vec![Op::Permits(op)]
    }

    /// See [`Op::unfinished`].
    pub(super) fn unfinished(&self) -> Vec<Op> {
        match self {
            PermitOp::Release { .. } | PermitOp::Undo { .. } | PermitOp::Settle { .. } => {
                self.settlement()
            }
            _ => Vec::new(),
        }
    }

    /// The same acquisition with a new nonce (sent again after a broken
    /// call), or `None` if this is not an acquisition.
    pub(super) fn renonced(&self, nonce: Nonce) -> Option<Op> {
        match self {
            PermitOp::Acquire {
                keys,
                owner,
                permits,
                lease_ms,
                place,
                ..
            } => Some(Op::Permits(PermitOp::Acquire {
                keys: keys.clone(),
                owner: owner.clone(),
                permits: *permits,
                lease_ms: *lease_ms,
                nonce,
                place: place.clone(),
            })),
            _ => None,
        }
    }

    /// What gives back what this operation granted, for a reply whose
    /// receiver is gone.
    pub(super) fn give_back(&self, nonce: Nonce) -> Option<Op> {
        match self {
            PermitOp::Acquire {
                keys,
                owner,
                permits,
                ..
            } => Some(Op::Permits(PermitOp::Release {
                keys: keys.clone(),
                owner: owner.clone(),
                permits: *permits,
                nonce,
            })),
            _ => None,
        }
    }

    pub(super) fn size(&self) -> (usize, usize, usize) {
        let keys = self.keys();
        let key_bytes = 5 * keys.lock.len() + 30;
        let owner = match self {
            PermitOp::Acquire { owner, .. }
            | PermitOp::Release { owner, .. }
            | PermitOp::Extend { owner, .. }
            | PermitOp::Undo { owner, .. }
            | PermitOp::Settle { owner, .. }
            | PermitOp::Drain { owner, .. }
            | PermitOp::LeaseLeft { owner, .. } => owner.id().len(),
            PermitOp::Leave { member, .. } => member.len(),
            PermitOp::Available { .. } | PermitOp::Resize { .. } => 0,
        };
        let place = match self {
            PermitOp::Acquire {
                place: Some(place), ..
            } => place.member.len() + 20,
            _ => 0,
        };
        (5, 7, key_bytes + owner + place + 60)
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
            PermitOp::Acquire {
                owner,
                permits,
                lease_ms,
                nonce,
                place,
                ..
            } => {
                let op = if place.is_some() { "pw" } else { "pa" };
                cmd.arg(op)
                    .arg(owner.id())
                    .arg(*permits)
                    .arg(*lease_ms)
                    .arg(nonce);
                if let Some(place) = place {
                    // The member is '<k>|<waiter>': the script rebuilds it.
                    let waiter = place.member.split_once('|').map_or("", |(_, w)| w);
                    cmd.arg(waiter).arg(place.ttl_ms);
                }
            }
            PermitOp::Release {
                owner,
                permits,
                nonce,
                ..
            } => {
                cmd.arg("pr").arg(owner.id()).arg(*permits).arg(nonce);
            }
            PermitOp::Extend {
                owner, lease_ms, ..
            } => {
                cmd.arg("pe").arg(owner.id()).arg(lease_ms.unwrap_or(0));
            }
            PermitOp::Undo {
                owner,
                permits,
                nonce,
                ..
            } => {
                cmd.arg("pu").arg(owner.id()).arg(*permits).arg(nonce);
            }
            PermitOp::Settle {
                owner,
                permits,
                nonce,
                ..
            } => {
                cmd.arg("ps").arg(owner.id()).arg(*permits).arg(nonce);
            }
            PermitOp::Leave { member, .. } => {
                cmd.arg("pq").arg(&**member);
            }
            PermitOp::Available { .. } => {
                cmd.arg("pv");
            }
            PermitOp::Resize { resize, .. } => {
                match *resize {
                    Resize::Try {
                        capacity,
                        expiry_ms,
                    } => cmd.arg("pc").arg("try").arg(capacity).arg(expiry_ms),
                    Resize::Set(n) => cmd.arg("pc").arg("set").arg(n).arg(0),
                    Resize::Add(n) => cmd.arg("pc").arg("add").arg(n).arg(0),
                };
            }
            PermitOp::Drain {
                owner,
                lease_ms,
                nonce,
                ..
            } => {
                cmd.arg("pd").arg(owner.id()).arg(*lease_ms).arg(nonce);
            }
            PermitOp::LeaseLeft { owner, .. } => {
                cmd.arg("pl").arg(owner.id());
            }
        }
    }

    pub(super) fn decode(&self, code: i64) -> Option<Reply> {
        let reply = match self {
            PermitOp::Acquire { .. } => match code {
                1 => Reply::Granted,
                0 => Reply::Busy { ttl: None },
                ms if ms < 0 => Reply::Busy {
                    ttl: Some(Duration::from_millis(ms.unsigned_abs())),
                },
                _ => return None,
            },
            PermitOp::Release { .. } | PermitOp::Undo { .. } | PermitOp::Settle { .. } => {
                match code {
                    -1 => Reply::NotHeld,
                    0 => Reply::Released,
                    _ => Reply::StillHeld,
                }
            }
            PermitOp::Extend { .. } => match code {
                1 => Reply::Extended,
                _ => Reply::NotHeld,
            },
            PermitOp::Leave { .. }
            | PermitOp::Available { .. }
            | PermitOp::Resize { .. }
            | PermitOp::Drain { .. }
            | PermitOp::LeaseLeft { .. } => Reply::Value(code),
        };
        Some(reply)
    }
}
