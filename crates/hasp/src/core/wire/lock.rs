//! The reentrant and plain locks' operations in the batch call (`lock.lua`,
//! `plain_lock.lua`): one key each (and the fencing counter for a
//! hand-off of a fenced lock), a hold's value written whole, a release that
//! may hand the lock to a waiter of this client. A plain lock sends the
//! same operations under its own opcodes; `native` sends some of both as
//! single commands.

use std::sync::Arc;

use redis::Cmd;

use super::{acquired_or_busy, Nonce, Op, Reply};
use crate::core::holds::Written;
use crate::core::keys::{Kind, LockKeys};
use hasp_owner::Owner;

/// One operation on a reentrant or plain lock (its keys' kind says which).
#[derive(Debug, Clone)]
pub(crate) enum LockOp {
    /// Take the lock for `owner`, or learn how long it stays held. With
    /// `flag_waiting`, a lock held by another owner is flagged as waited on
    /// by this client (whose task then listens for the release).
    Acquire {
        keys: Arc<LockKeys>,
        owner: Owner,
        lease_ms: u64,
        flag_waiting: bool,
        nonce: Nonce,
    },
    /// Give back `holds` holds of `owner`. `written`: what the acquisition
    /// that took the lock free wrote, if known (then a last release can be
    /// native).
    Release {
        keys: Arc<LockKeys>,
        owner: Owner,
        holds: u32,
        nonce: Nonce,
        written: Option<Written>,
    },
    /// Release, and if that frees the lock, take it for `heir` at once.
    HandOff {
        keys: Arc<LockKeys>,
        owner: Owner,
        holds: u32,
        nonce: Nonce,
        heir: Owner,
        lease_ms: u64,
    },
    /// Re-arm the lease of `owner`'s hold (`None`: only check it is held),
    /// if it is still the hold of fencing token `token`: a renewal that
    /// reaches Redis after its hold was released and the owner took the
    /// lock again is not applied to the new hold. (A plain lock's holds
    /// all have token 1: its renewal checks the owner.) Natively, a renewal
    /// checks the whole value its acquisition `written`.
    Extend {
        keys: Arc<LockKeys>,
        owner: Owner,
        token: u64,
        lease_ms: Option<u64>,
        written: Option<Written>,
    },
    /// Undo the acquisition or hand-off `nonce` if it was applied.
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
    /// Free the lock whoever holds it.
    Force { keys: Arc<LockKeys> },
}

impl From<LockOp> for Op {
    fn from(op: LockOp) -> Op {
        Op::Lock(op)
    }
}

impl LockOp {
    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        match self {
            LockOp::Acquire { keys, .. }
            | LockOp::Release { keys, .. }
            | LockOp::HandOff { keys, .. }
            | LockOp::Extend { keys, .. }
            | LockOp::Undo { keys, .. }
            | LockOp::Settle { keys, .. }
            | LockOp::Force { keys } => keys,
        }
    }

    fn is_plain(&self) -> bool {
        self.keys().kind == Kind::PlainLock
    }

    pub(super) fn is_extend(&self) -> bool {
        matches!(self, LockOp::Extend { .. })
    }

    pub(super) fn is_release(&self) -> bool {
        matches!(
            self,
            LockOp::Release { .. } | LockOp::HandOff { .. } | LockOp::Settle { .. }
        )
    }

    pub(super) fn needs_replicas(&self) -> bool {
        matches!(
            self,
            LockOp::Acquire { .. }
                | LockOp::HandOff { .. }
                | LockOp::Extend {
                    lease_ms: Some(_),
                    ..
                }
        )
    }

    /// See [`Op::settlement`].
    pub(super) fn settlement(&self) -> Vec<Op> {
        let undo = |owner: &Owner, nonce: &Nonce| LockOp::Undo {
            keys: self.keys().clone(),
            owner: owner.clone(),
            nonce: *nonce,
        };
        let settle = |owner: &Owner, holds: &u32, nonce: &Nonce| LockOp::Settle {
            keys: self.keys().clone(),
            owner: owner.clone(),
            holds: *holds,
            nonce: *nonce,
        };
        let ops = match self {
            LockOp::Acquire { owner, nonce, .. } => vec![undo(owner, nonce)],
            LockOp::Release {
                owner,
                holds,
                nonce,
                ..
            } => vec![settle(owner, holds, nonce)],
            // Handed over: undo the heir's hold (the heir never learnt of
            // it). Not handed over: complete the release.
            LockOp::HandOff {
                owner,
                holds,
                nonce,
                heir,
                ..
            } => vec![undo(heir, nonce), settle(owner, holds, nonce)],
            LockOp::Undo { .. } | LockOp::Settle { .. } => vec![self.clone()],
            LockOp::Extend { .. } | LockOp::Force { .. } => Vec::new(),
        };
        ops.into_iter().map(Op::Lock).collect()
    }

    /// See [`Op::unfinished`].
    pub(super) fn unfinished(&self) -> Vec<Op> {
        match self {
            LockOp::Release { .. }
            | LockOp::HandOff { .. }
            | LockOp::Settle { .. }
            | LockOp::Undo { .. } => self.settlement(),
            LockOp::Acquire { .. } | LockOp::Extend { .. } | LockOp::Force { .. } => Vec::new(),
        }
    }

    /// See [`Op::renonced`].
    pub(super) fn renonced(&self, nonce: Nonce) -> Option<Op> {
        match self {
            LockOp::Acquire {
                keys,
                owner,
                lease_ms,
                flag_waiting,
                ..
            } => Some(Op::Lock(LockOp::Acquire {
                keys: keys.clone(),
                owner: owner.clone(),
                lease_ms: *lease_ms,
                flag_waiting: *flag_waiting,
                nonce,
            })),
            _ => None,
        }
    }

    /// See [`Op::give_back`]. (Its token is not known yet: the release goes
    /// through the function.)
    pub(super) fn give_back(&self, nonce: Nonce) -> Option<Op> {
        match self {
            LockOp::Acquire { keys, owner, .. } => Some(Op::Lock(LockOp::Release {
                keys: keys.clone(),
                owner: owner.clone(),
                holds: 1,
                nonce,
                written: None,
            })),
            _ => None,
        }
    }

    pub(super) fn size(&self) -> (usize, usize, usize) {
        let lock = self.keys().lock.len() + 4;
        match self {
            LockOp::Acquire { owner, .. } => (1, 3, lock + owner.id().len() + 48),
            LockOp::Release { owner, holds, .. } => {
                let args = if *holds == 1 { 3 } else { 4 };
                (1, args, lock + owner.id().len() + 32)
            }
            LockOp::Settle { owner, .. } => (1, 4, lock + owner.id().len() + 32),
            LockOp::HandOff { owner, heir, .. } => {
                let keys = if self.is_plain() { 1 } else { 2 };
                (keys, 6, 2 * lock + owner.id().len() + heir.id().len() + 60)
            }
            LockOp::Extend { owner, .. } => {
                let args = if self.is_plain() { 3 } else { 4 };
                (1, args, lock + owner.id().len() + 48)
            }
            LockOp::Undo { owner, .. } => (1, 3, lock + owner.id().len() + 24),
            LockOp::Force { .. } => (1, 1, lock + 4),
        }
    }

    pub(super) fn write_keys(&self, cmd: &mut Cmd) {
        let keys = self.keys();
        cmd.arg(&*keys.lock);
        // An acquisition's fence is found from the lock's key (lock.lua); a
        // plain lock has none.
        if matches!(self, LockOp::HandOff { .. }) && !self.is_plain() {
            cmd.arg(&keys.fence);
        }
    }

    pub(super) fn write_args(&self, cmd: &mut Cmd) {
        let plain = self.is_plain();
        match self {
            LockOp::Acquire {
                owner,
                lease_ms,
                flag_waiting,
                nonce,
                ..
            } => {
                let op = match (plain, *flag_waiting) {
                    (false, false) => "a",
                    (false, true) => "w",
                    (true, false) => "na",
                    (true, true) => "nw",
                };
                cmd.arg(op).arg(*lease_ms).arg(free_hold(owner, *nonce));
            }
            LockOp::Release {
                owner,
                holds,
                nonce,
                ..
            } => {
                // One hold (nearly every release) goes without the count.
                if *holds == 1 {
                    cmd.arg("r").arg(owner.id()).arg(nonce);
                } else {
                    cmd.arg("R").arg(owner.id()).arg(*holds).arg(nonce);
                }
            }
            LockOp::HandOff {
                owner,
                holds,
                nonce,
                heir,
                lease_ms,
                ..
            } => {
                cmd.arg(if plain { "nh" } else { "h" })
                    .arg(owner.id())
                    .arg(*holds)
                    .arg(nonce)
                    .arg(heir.id())
                    .arg(*lease_ms);
            }
            LockOp::Extend {
                owner,
                token,
                lease_ms,
                ..
            } => {
                let lease_ms = lease_ms.unwrap_or(0);
                if plain {
                    cmd.arg("ne").arg(owner.id()).arg(lease_ms);
                } else {
                    cmd.arg("e").arg(owner.id()).arg(lease_ms).arg(*token);
                }
            }
            LockOp::Undo { owner, nonce, .. } => {
                cmd.arg("u").arg(owner.id()).arg(nonce);
            }
            LockOp::Settle {
                owner,
                holds,
                nonce,
                ..
            } => {
                cmd.arg("s").arg(owner.id()).arg(*holds).arg(nonce);
            }
            LockOp::Force { .. } => {
                cmd.arg("f");
            }
        }
    }

    pub(super) fn decode(&self, code: i64) -> Option<Reply> {
        Some(match self {
            LockOp::Acquire { .. } => acquired_or_busy(code),
            LockOp::Release { .. } | LockOp::Settle { .. } | LockOp::Undo { .. } => match code {
                -1 => Reply::NotHeld,
                0 => Reply::Released,
                _ => Reply::StillHeld,
            },
            LockOp::HandOff { .. } => match code {
                -1 => Reply::NotHeld,
                -2 => Reply::Yielded,
                0 => Reply::StillHeld,
                token if token > 0 => Reply::Acquired {
                    token: token.unsigned_abs(),
                },
                _ => return None,
            },
            LockOp::Extend { .. } => match code {
                1 => Reply::Extended,
                _ => Reply::NotHeld,
            },
            LockOp::Force { .. } => Reply::Forced(code == 1),
        })
    }
}

/// What an acquisition by `owner` with the operation `nonce` sends: the
/// value a free lock takes but its token (`lock.lua`, "hold").
pub(super) fn free_hold(owner: &Owner, nonce: Nonce) -> Vec<u8> {
    free_value(owner, nonce, None, |parts| parts.concat())
}

/// What `f` makes of the value a free lock takes when `owner` acquires it
/// with the operation `nonce` and gets fencing token `token` (a plain
/// lock's: 1): one hold, no waiter flagged (`lock.lua`, "lock"); without
/// the token, [`free_hold`]. Handed over in parts: the one place that
/// spells the value, and a way to pack it into a command without building
/// it first.
pub(super) fn free_value<R>(
    owner: &Owner,
    nonce: Nonce,
    token: Option<u64>,
    f: impl FnOnce(&[&[u8]]) -> R,
) -> R {
    let hex = nonce.hex();
    let hold: [&[u8]; 4] = [b"1 ", &hex, b" - ", owner.id().as_bytes()];
    match token {
        None => f(&hold),
        Some(token) => {
            let mut digits = itoa::Buffer::new();
            let [a, b, c, d] = hold;
            f(&[a, b, c, d, b" ", digits.format(token).as_bytes()])
        }
    }
}
