//! The hold lifecycle the queued kinds share in the batch call.
//!
//! A fair lock, a side of a read-write lock and a semaphore each give holds
//! (one, or a number of permits) that are released, renewed, undone and
//! settled alike, to owners who may wait in a line they can leave. Those
//! steps, what settles a step whose reply was lost and how each is read,
//! are written once here; a kind says only what differs
//! ([`Acquisition`]: its opcodes, its keys, its acquisition). The reentrant
//! and plain locks have their own lifecycle (hand-off, native commands:
//! `lock`).

use std::sync::Arc;

use redis::Cmd;

use super::{Nonce, Op, Reply};
use crate::core::keys::LockKeys;
use hasp_owner::Owner;

/// A waiter's place in a kind's line: the member `<k>|<waiter id>` and how
/// long the place lasts unless the waiter asks again.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) member: Arc<str>,
    pub(crate) ttl_ms: u64,
}

impl Place {
    /// The waiter's id: what follows `|` in the member (the script
    /// rebuilds the member from it).
    fn waiter(&self) -> &str {
        self.member.split_once('|').map_or("", |(_, w)| w)
    }

    /// Writes the place as two arguments: the waiter's id and how long the
    /// place lasts (`""`, `0`: no place, only try).
    pub(super) fn write(place: Option<&Place>, cmd: &mut Cmd) {
        match place {
            Some(place) => cmd.arg(place.waiter()).arg(place.ttl_ms),
            None => cmd.arg("").arg(0),
        };
    }
}

/// How one kind's script spells the lifecycle's steps after acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Codes {
    pub(crate) release: &'static str,
    pub(crate) extend: &'static str,
    pub(crate) undo: &'static str,
    pub(crate) settle: &'static str,
    pub(crate) leave: &'static str,
}

/// What a kind's acquisition carries besides the hold, and what differs
/// between the kinds on the wire.
pub(crate) trait Acquisition: Clone + std::fmt::Debug + Sized {
    const CODES: Codes;
    /// Whether the kind's keys hold a fencing counter after the main key
    /// (then sent as the second key).
    const FENCED: bool;
    /// Whether a renewal sends the hold's fencing token (and is applied
    /// only to the hold of that token).
    const RENEWAL_SENDS_TOKEN: bool;
    /// The most arguments one of the kind's operations takes (opcode
    /// included): a call's size estimate.
    const MOST_ARGS: usize;

    /// What every step sends after its opcode before the owner (a read-write
    /// lock's side).
    fn side(_keys: &LockKeys) -> Option<&'static str> {
        None
    }

    /// Writes the acquisition's opcode and arguments.
    fn write_acquire(&self, acquire: &Acquire, keys: &LockKeys, cmd: &mut Cmd);

    /// What an acquisition's answer means (`None`: not an answer it gives).
    fn decode_acquire(&self, keys: &LockKeys, code: i64) -> Option<Reply>;

    /// The operation of the batch call that carries `op`.
    fn wrap(op: HoldOp<Self>) -> Op;
}

/// What every kind's acquisition sends.
#[derive(Debug, Clone)]
pub(crate) struct Acquire {
    pub(crate) owner: Owner,
    /// Holds (1) or permits asked for.
    pub(crate) count: u32,
    pub(crate) lease_ms: u64,
    pub(crate) nonce: Nonce,
    /// With a place: queue (or refresh the place) if it cannot be taken.
    pub(crate) place: Option<Place>,
}

/// One step of a hold's life on one object of kind `A`.
#[derive(Debug, Clone)]
pub(crate) enum Step<A> {
    /// Take `count` for the owner (`how`: the kind's own part).
    Acquire(Acquire, A),
    /// Give back `count` of `owner`'s holds (permits).
    Release {
        owner: Owner,
        count: u32,
        nonce: Nonce,
    },
    /// Re-arm the lease of `owner`'s hold (`None`: only check it is held);
    /// `token`: the hold's fencing token, for a kind that checks it.
    Extend {
        owner: Owner,
        lease_ms: Option<u64>,
        token: u64,
    },
    /// Undo the acquisition `nonce` of `count` if it was applied.
    Undo {
        owner: Owner,
        count: u32,
        nonce: Nonce,
    },
    /// Apply the release `nonce` of `count` unless it was applied.
    Settle {
        owner: Owner,
        count: u32,
        nonce: Nonce,
    },
    /// Leave the line.
    Leave { member: Arc<str> },
}

/// One step of a hold's life and the object it is on.
#[derive(Debug, Clone)]
pub(crate) struct HoldOp<A> {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) step: Step<A>,
}

impl<A: Acquisition> From<HoldOp<A>> for Op {
    fn from(op: HoldOp<A>) -> Op {
        A::wrap(op)
    }
}

impl Op {
    /// The step `step` of a hold on the object of `keys`, a queued kind's.
    pub(crate) fn hold<A: Acquisition>(keys: &Arc<LockKeys>, step: Step<A>) -> Op {
        A::wrap(HoldOp {
            keys: keys.clone(),
            step,
        })
    }
}

impl<A: Acquisition> HoldOp<A> {
    fn with(&self, step: Step<A>) -> Op {
        Op::hold(&self.keys, step)
    }

    pub(super) fn is_extend(&self) -> bool {
        matches!(self.step, Step::Extend { .. })
    }

    pub(super) fn is_release(&self) -> bool {
        matches!(self.step, Step::Release { .. } | Step::Settle { .. })
    }

    pub(super) fn needs_replicas(&self) -> bool {
        matches!(
            self.step,
            Step::Acquire(..)
                | Step::Extend {
                    lease_ms: Some(_),
                    ..
                }
        )
    }

    /// See [`Op::settlement`]: an acquisition is undone, a release
    /// settled; a renewal or a place that may be left matters no more (a
    /// place runs out by itself).
    pub(super) fn settlement(&self) -> Vec<Op> {
        let step = match &self.step {
            Step::Acquire(acquire, _) => Step::Undo {
                owner: acquire.owner.clone(),
                count: acquire.count,
                nonce: acquire.nonce,
            },
            Step::Release {
                owner,
                count,
                nonce,
            } => Step::Settle {
                owner: owner.clone(),
                count: *count,
                nonce: *nonce,
            },
            Step::Undo { .. } | Step::Settle { .. } => self.step.clone(),
            Step::Extend { .. } | Step::Leave { .. } => return Vec::new(),
        };
        vec![self.with(step)]
    }

    /// See [`Op::unfinished`].
    pub(super) fn unfinished(&self) -> Vec<Op> {
        match self.step {
            Step::Release { .. } | Step::Undo { .. } | Step::Settle { .. } => self.settlement(),
            Step::Acquire(..) | Step::Extend { .. } | Step::Leave { .. } => Vec::new(),
        }
    }

    /// See [`Op::renonced`].
    pub(super) fn renonced(&self, nonce: Nonce) -> Option<Op> {
        match &self.step {
            Step::Acquire(acquire, how) => {
                let acquire = Acquire {
                    nonce,
                    ..acquire.clone()
                };
                Some(self.with(Step::Acquire(acquire, how.clone())))
            }
            _ => None,
        }
    }

    /// See [`Op::give_back`].
    pub(super) fn give_back(&self, nonce: Nonce) -> Option<Op> {
        match &self.step {
            Step::Acquire(acquire, _) => Some(self.with(Step::Release {
                owner: acquire.owner.clone(),
                count: acquire.count,
                nonce,
            })),
            _ => None,
        }
    }

    fn key_count(&self) -> usize {
        1 + usize::from(A::FENCED) + self.keys.extra.len()
    }

    pub(super) fn size(&self) -> (usize, usize, usize) {
        let keys = self.key_count();
        let key_bytes = keys * (self.keys.lock.len() + 8);
        let text = match &self.step {
            Step::Acquire(acquire, _) => {
                acquire.owner.id().len() + acquire.place.as_ref().map_or(0, |p| p.member.len())
            }
            Step::Release { owner, .. }
            | Step::Extend { owner, .. }
            | Step::Undo { owner, .. }
            | Step::Settle { owner, .. } => owner.id().len(),
            Step::Leave { member } => member.len(),
        };
        (keys, A::MOST_ARGS, key_bytes + text + 80)
    }

    pub(super) fn write_keys(&self, cmd: &mut Cmd) {
        cmd.arg(&*self.keys.lock);
        if A::FENCED {
            cmd.arg(&self.keys.fence);
        }
        for key in self.keys.extra.iter() {
            cmd.arg(key);
        }
    }

    pub(super) fn write_args(&self, cmd: &mut Cmd) {
        let codes = A::CODES;
        let head = |cmd: &mut Cmd, code: &str, owner: &Owner| {
            cmd.arg(code);
            if let Some(side) = A::side(&self.keys) {
                cmd.arg(side);
            }
            cmd.arg(owner.id());
        };
        match &self.step {
            Step::Acquire(acquire, how) => how.write_acquire(acquire, &self.keys, cmd),
            Step::Release {
                owner,
                count,
                nonce,
            } => {
                head(cmd, codes.release, owner);
                cmd.arg(*count).arg(nonce);
            }
            Step::Undo {
                owner,
                count,
                nonce,
            } => {
                head(cmd, codes.undo, owner);
                cmd.arg(*count).arg(nonce);
            }
            Step::Settle {
                owner,
                count,
                nonce,
            } => {
                head(cmd, codes.settle, owner);
                cmd.arg(*count).arg(nonce);
            }
            Step::Extend {
                owner,
                lease_ms,
                token,
            } => {
                head(cmd, codes.extend, owner);
                cmd.arg(lease_ms.unwrap_or(0));
                if A::RENEWAL_SENDS_TOKEN {
                    cmd.arg(*token);
                }
            }
            Step::Leave { member } => {
                cmd.arg(codes.leave).arg(&**member);
            }
        }
    }

    pub(super) fn decode(&self, code: i64) -> Option<Reply> {
        Some(match &self.step {
            Step::Acquire(_, how) => return how.decode_acquire(&self.keys, code),
            Step::Release { .. } | Step::Undo { .. } | Step::Settle { .. } => match code {
                -1 => Reply::NotHeld,
                0 => Reply::Released,
                _ => Reply::StillHeld,
            },
            Step::Extend { .. } => match code {
                1 => Reply::Extended,
                _ => Reply::NotHeld,
            },
            Step::Leave { .. } => Reply::Value(code),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::fair_lock::FairAcquire;
    use super::super::rw_lock::RwAcquire;
    use super::super::semaphore::PermitAcquire;
    use super::super::tests::args;
    use super::super::Nonces;
    use super::super::{encode, BATCH};
    use super::*;
    use crate::core::keys::Kind;

    fn owner() -> Owner {
        Owner::from_id("o1").unwrap()
    }

    fn sent(op: &Op) -> Vec<String> {
        args(&encode(&BATCH, "c:1", std::iter::once(op)))
    }

    #[test]
    fn a_lost_acquisition_is_undone_with_its_count_and_a_lost_release_settled() {
        let keys = Arc::new(LockKeys::semaphore("hasp", "s"));
        let nonce = Nonces::new().next();
        let acquire = Acquire {
            owner: owner(),
            count: 3,
            lease_ms: 100,
            nonce,
            place: None,
        };
        let op = Op::hold(&keys, Step::Acquire(acquire, PermitAcquire));
        let undo = op.settlement();
        let text = sent(&undo[0]);
        // FCALL, function, 5 keys, the client, then the operation.
        assert_eq!(&text[9..12], ["pu", "o1", "3"]);
        assert_eq!(text[12], nonce.to_string());
        let release = Op::release(&keys, &owner(), 3, nonce);
        assert_eq!(&sent(&release.settlement()[0])[9..12], ["ps", "o1", "3"]);
        assert!(release.is_release() && release.unfinished().len() == 1);
    }

    #[test]
    fn every_step_of_a_read_write_lock_names_its_side() {
        let write = Arc::new(LockKeys::rw("hasp", "l", Kind::RwWrite));
        let release = Op::release(&write, &owner(), 2, Nonces::new().next());
        assert_eq!(&sent(&release)[9..13], ["yr", "w", "o1", "2"]);
        let read = Arc::new(LockKeys::rw("hasp", "l", Kind::RwRead));
        let acquire = Acquire {
            owner: owner(),
            count: 1,
            lease_ms: 100,
            nonce: Nonces::new().next(),
            place: None,
        };
        let how = RwAcquire {
            prefer_readers: true,
        };
        let op = Op::hold(&read, Step::Acquire(acquire, how));
        let text = sent(&op);
        assert_eq!(&text[9..13], ["ya", "r", "o1", "100"]);
        assert_eq!(&text[14..], ["", "0", "1"]);
        // A read's answer is 1 + the last write's token.
        let acquired = op.decode(&redis::Value::Int(8)).unwrap();
        assert_eq!(acquired, Reply::Acquired { token: 7 });
    }

    #[test]
    fn a_fair_lock_renewal_sends_the_token_and_its_four_keys() {
        let keys = Arc::new(LockKeys::fair("hasp", "f"));
        let extend = Step::Extend {
            owner: owner(),
            lease_ms: Some(500),
            token: 42,
        };
        let op = Op::hold::<FairAcquire>(&keys, extend);
        let text = sent(&op);
        assert_eq!(text[2], "4");
        assert_eq!(&text[8..], ["fe", "o1", "500", "42"]);
        assert!(op.settlement().is_empty(), "a renewal is not settled");
    }
}
