//! A read-write lock's operations in the batch call (`rw_lock.lua`).

use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;

use super::semaphore::Place;
use super::{Nonce, Op, Reply};
use crate::core::keys::{Kind, LockKeys};
use hasp_owner::Owner;

/// One operation on a read-write lock; `keys` says which side (their kind
/// is [`Kind::RwRead`] or [`Kind::RwWrite`]).
#[derive(Debug, Clone)]
pub(crate) enum RwOp {
    /// Take this side for `owner`; with a `place`, queue if it cannot enter
    /// (or refresh the place). `prefer_readers`: a reader ignores waiting
    /// writers.
    Acquire {
        keys: Arc<LockKeys>,
        owner: Owner,
        lease_ms: u64,
        nonce: Nonce,
        place: Option<Place>,
        prefer_readers: bool,
    },
    /// Give back `holds` holds of this side.
    Release {
        keys: Arc<LockKeys>,
        owner: Owner,
        holds: u32,
        nonce: Nonce,
    },
    /// Re-arm this side's lease (`None`: only check it is held).
    Extend {
        keys: Arc<LockKeys>,
        owner: Owner,
        lease_ms: Option<u64>,
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

impl RwOp {
    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        match self {
            RwOp::Acquire { keys, .. }
            | RwOp::Release { keys, .. }
            | RwOp::Extend { keys, .. }
            | RwOp::Undo { keys, .. }
            | RwOp::Settle { keys, .. }
            | RwOp::Leave { keys, .. } => keys,
        }
    }

    fn side(&self) -> &'static str {
        match self.keys().kind {
            Kind::RwWrite => "w",
            _ => "r",
        }
    }

    pub(super) fn is_extend(&self) -> bool {
        matches!(self, RwOp::Extend { .. })
    }

    pub(super) fn needs_replicas(&self) -> bool {
        matches!(
            self,
            RwOp::Acquire { .. }
                | RwOp::Extend {
                    lease_ms: Some(_),
                    ..
                }
        )
    }

    /// See [`Op::settlement`].
    pub(super) fn settlement(&self) -> Vec<Op> {
        let op = match self {
            RwOp::Acquire {
                keys, owner, nonce, ..
            } => RwOp::Undo {
                keys: keys.clone(),
                owner: owner.clone(),
                nonce: *nonce,
            },
            RwOp::Release {
                keys,
                owner,
                holds,
                nonce,
            } => RwOp::Settle {
                keys: keys.clone(),
                owner: owner.clone(),
                holds: *holds,
                nonce: *nonce,
            },
            RwOp::Undo { .. } | RwOp::Settle { .. } => self.clone(),
            RwOp::Extend { .. } | RwOp::Leave { .. } => return Vec::new(),
        };
        vec![Op::Rw(op)]
    }

    /// See [`Op::unfinished`].
    pub(super) fn unfinished(&self) -> Vec<Op> {
        match self {
            RwOp::Release { .. } | RwOp::Undo { .. } | RwOp::Settle { .. } => self.settlement(),
            _ => Vec::new(),
        }
    }

    pub(super) fn is_release(&self) -> bool {
        matches!(self, RwOp::Release { .. } | RwOp::Settle { .. })
    }

    pub(super) fn renonced(&self, nonce: Nonce) -> Option<Op> {
        match self {
            RwOp::Acquire {
                keys,
                owner,
                lease_ms,
                place,
                prefer_readers,
                ..
            } => Some(Op::Rw(RwOp::Acquire {
                keys: keys.clone(),
                owner: owner.clone(),
                lease_ms: *lease_ms,
                nonce,
                place: place.clone(),
                prefer_readers: *prefer_readers,
            })),
            _ => None,
        }
    }

    pub(super) fn give_back(&self, nonce: Nonce) -> Option<Op> {
        match self {
            RwOp::Acquire { keys, owner, .. } => Some(Op::Rw(RwOp::Release {
                keys: keys.clone(),
                owner: owner.clone(),
                holds: 1,
                nonce,
            })),
            _ => None,
        }
    }

    pub(super) fn size(&self) -> (usize, usize, usize) {
        let keys = 5 * self.keys().lock.len() + 40;
        let owner = match self {
            RwOp::Acquire { owner, place, .. } => {
                owner.id().len() + place.as_ref().map_or(0, |p| p.member.len() + 20)
            }
            RwOp::Release { owner, .. }
            | RwOp::Extend { owner, .. }
            | RwOp::Undo { owner, .. }
            | RwOp::Settle { owner, .. } => owner.id().len(),
            RwOp::Leave { member, .. } => member.len(),
        };
        (5, 8, keys + owner + 60)
    }

    pub(super) fn write_keys(&self, cmd: &mut Cmd) {
        let keys = self.keys();
        cmd.arg(&*keys.lock).arg(&keys.fence);
        for key in keys.extra.iter() {
            cmd.arg(key);
        }
    }

    pub(super) fn write_args(&self, cmd: &mut Cmd) {
        let side = self.side();
        match self {
            RwOp::Acquire {
                owner,
                lease_ms,
                nonce,
                place,
                prefer_readers,
                ..
            } => {
                cmd.arg("ya")
                    .arg(side)
                    .arg(owner.id())
                    .arg(*lease_ms)
                    .arg(nonce);
                match place {
                    Some(place) => {
                        let waiter = place.member.split_once('|').map_or("", |(_, w)| w);
                        cmd.arg(waiter).arg(place.ttl_ms);
                    }
                    None => {
                        cmd.arg("").arg(0);
                    }
                }
                cmd.arg(if *prefer_readers { "1" } else { "0" });
            }
            RwOp::Release {
                owner,
                holds,
                nonce,
                ..
            } => {
                cmd.arg("yr")
                    .arg(side)
                    .arg(owner.id())
                    .arg(*holds)
                    .arg(nonce);
            }
            RwOp::Extend {
                owner, lease_ms, ..
            } => {
                cmd.arg("ye")
                    .arg(side)
                    .arg(owner.id())
                    .arg(lease_ms.unwrap_or(0));
            }
            RwOp::Undo { owner, nonce, .. } => {
                cmd.arg("yu").arg(side).arg(owner.id()).arg(nonce);
            }
            RwOp::Settle {
                owner,
                holds,
                nonce,
                ..
            } => {
                cmd.arg("ys")
                    .arg(side)
                    .arg(owner.id())
                    .arg(*holds)
                    .arg(nonce);
            }
            RwOp::Leave { member, .. } => {
                cmd.arg("yq").arg(&**member);
            }
        }
    }

    pub(super) fn decode(&self, code: i64) -> Reply {
        match self {
            RwOp::Acquire { keys, .. } => match code {
                token if token > 0 => Reply::Acquired {
                    // A read answers 1 + the last write's token.
                    token: match keys.kind {
                        Kind::RwWrite => token.unsigned_abs(),
                        _ => token.unsigned_abs() - 1,
                    },
                },
                0 => Reply::Busy { ttl: None },
                ms => Reply::Busy {
                    ttl: Some(Duration::from_millis(ms.unsigned_abs())),
                },
            },
            RwOp::Release { .. } | RwOp::Undo { .. } | RwOp::Settle { .. } => match code {
                -1 => Reply::NotHeld,
                0 => Reply::Released,
                _ => Reply::StillHeld,
            },
            RwOp::Extend { .. } => match code {
                1 => Reply::Extended,
                _ => Reply::NotHeld,
            },
            RwOp::Leave { .. } => Reply::Value(code),
        }
    }
}
