//! A fair lock's operations in the batch call (`fair_lock.lua`).

use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;

use super::semaphore::Place;
use super::{Nonce, Op, Reply};
use crate::core::keys::LockKeys;
use hasp_owner::Owner;

/// One operation on a fair lock.
#[derive(Debug, Clone)]
pub(crate) enum FairOp {
    /// Take the lock for `owner` when it is free and nobody waits ahead;
    /// with a `place`, queue (or refresh the place) if not.
    Acquire {
        keys: Arc<LockKeys>,
        owner: Owner,
        lease_ms: u64,
        nonce: Nonce,
        place: Option<Place>,
    },
    /// Give back `holds` holds of `owner`; a freed lock wakes the head.
    Release {
        keys: Arc<LockKeys>,
        owner: Owner,
        holds: u32,
        nonce: Nonce,
    },
    /// Undo the acquisition `nonce` if it was applied.
    Undo {
        keys: Arc<LockKeys>,
        owner: Owner,
        nonce: Nonce,
    },
    /// Apply the release `nonce` unless it was applied.
    Settle {
        keys: Arc<LockKeys>,
        owner: Owner,
        holds: u32,
        nonce: Nonce,
    },
    /// Leave the line.
    Leave {
        keys: Arc<LockKeys>,
        member: Arc<str>,
    },
}

impl FairOp {
    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        match self {
            FairOp::Acquire { keys, .. }
            | FairOp::Release { keys, .. }
            | FairOp::Undo { keys, .. }
            | FairOp::Settle { keys, .. }
            | FairOp::Leave { keys, .. } => keys,
        }
    }

    pub(super) fn needs_replicas(&self) -> bool {
        matches!(self, FairOp::Acquire { .. })
    }

    /// See [`Op::settlement`].
    pub(super) fn settlement(&self) -> Vec<Op> {
        let op = match self {
            FairOp::Acquire {
                keys, owner, nonce, ..
            } => FairOp::Undo {
                keys: keys.clone(),
                owner: owner.clone(),
                nonce: *nonce,
            },
            FairOp::Release {
                keys,
                owner,
                holds,
                nonce,
            } => FairOp::Settle {
                keys: keys.clone(),
                owner: owner.clone(),
                holds: *holds,
                nonce: *nonce,
            },
            FairOp::Undo { .. } | FairOp::Settle { .. } => self.clone(),
            // A place that may be left runs out by itself.
            FairOp::Leave { .. } => return Vec::new(),
        };
        vec![Op::Fair(op)]
    }

    /// See [`Op::unfinished`].
    pub(super) fn unfinished(&self) -> Vec<Op> {
        match self {
            FairOp::Acquire { .. } | FairOp::Leave { .. } => Vec::new(),
            _ => self.settlement(),
        }
    }

    pub(super) fn is_release(&self) -> bool {
        matches!(self, FairOp::Release { .. } | FairOp::Settle { .. })
    }

    pub(super) fn renonced(&self, nonce: Nonce) -> Option<Op> {
        match self {
            FairOp::Acquire {
                keys,
                owner,
                lease_ms,
                place,
                ..
            } => Some(Op::Fair(FairOp::Acquire {
                keys: keys.clone(),
                owner: owner.clone(),
                lease_ms: *lease_ms,
                nonce,
                place: place.clone(),
            })),
            _ => None,
        }
    }

    pub(super) fn give_back(&self, nonce: Nonce) -> Option<Op> {
        match self {
            FairOp::Acquire { keys, owner, .. } => Some(Op::Fair(FairOp::Release {
                keys: keys.clone(),
                owner: owner.clone(),
                holds: 1,
                nonce,
            })),
            _ => None,
        }
    }

    pub(super) fn size(&self) -> (usize, usize, usize) {
        let keys = 4 * self.keys().lock.len() + 24;
        let owner = match self {
            FairOp::Acquire { owner, place, .. } => {
                owner.id().len() + place.as_ref().map_or(0, |p| p.member.len() + 20)
            }
            FairOp::Release { owner, .. }
            | FairOp::Undo { owner, .. }
            | FairOp::Settle { owner, .. } => owner.id().len(),
            FairOp::Leave { member, .. } => member.len(),
        };
        (4, 6, keys + owner + 60)
    }

    pub(super) fn write_keys(&self, cmd: &mut Cmd) {
        let keys = self.keys();
        cmd.arg(&*keys.lock).arg(&keys.fence);
        for key in keys.extra.iter() {
            cmd.arg(key);
        }
    }

    pub(super) fn write_args(&self, cmd: &mut Cmd) {
        match self {
            FairOp::Acquire {
                owner,
                lease_ms,
                nonce,
                place,
                ..
            } => {
                cmd.arg("fa").arg(owner.id()).arg(*lease_ms).arg(nonce);
                match place {
                    Some(place) => {
                        let waiter = place.member.split_once('|').map_or("", |(_, w)| w);
                        cmd.arg(waiter).arg(place.ttl_ms);
                    }
                    None => {
                        cmd.arg("").arg(0);
                    }
                }
            }
            FairOp::Release {
                owner,
                holds,
                nonce,
                ..
            } => {
                cmd.arg("fr").arg(owner.id()).arg(*holds).arg(nonce);
            }
            FairOp::Undo { owner, nonce, .. } => {
                cmd.arg("fu").arg(owner.id()).arg(nonce);
            }
            FairOp::Settle {
                owner,
                holds,
                nonce,
                ..
            } => {
                cmd.arg("fs").arg(owner.id()).arg(*holds).arg(nonce);
            }
            FairOp::Leave { member, .. } => {
                cmd.arg("fq").arg(&**member);
            }
        }
    }

    pub(super) fn decode(&self, code: i64) -> Reply {
        match self {
            FairOp::Acquire { .. } => match code {
                token if token > 0 => Reply::Acquired {
                    token: token.unsigned_abs(),
                },
                0 => Reply::Busy { ttl: None },
                ms => Reply::Busy {
                    ttl: Some(Duration::from_millis(ms.unsigned_abs())),
                },
            },
            FairOp::Release { .. } | FairOp::Undo { .. } | FairOp::Settle { .. } => match code {
                -1 => Reply::NotHeld,
                0 => Reply::Released,
                _ => Reply::StillHeld,
            },
            FairOp::Leave { .. } => Reply::Value(code),
        }
    }
}
