//! A fair lock's operations in the batch call (`fair_lock.lua`): the hold
//! lifecycle of `hold`, with its fencing counter and the lock's renewal.

use redis::Cmd;

use super::hold::{Acquire, Acquisition, Codes, HoldOp, Place};
use super::{acquired_or_busy, Op, Reply};
use crate::core::keys::LockKeys;

/// One operation on a fair lock.
pub(crate) type FairOp = HoldOp<FairAcquire>;

/// A fair lock's acquisition: taken when it is free and nobody waits ahead;
/// with a place, queued (or the place refreshed) if not.
#[derive(Debug, Clone)]
pub(crate) struct FairAcquire;

impl Acquisition for FairAcquire {
    const CODES: Codes = Codes {
        release: "fr",
        extend: "fe",
        undo: "fu",
        settle: "fs",
        leave: "fq",
    };
    const FENCED: bool = true;
    const RENEWAL_SENDS_TOKEN: bool = true;
    const MOST_ARGS: usize = 6;

    fn write_acquire(&self, acquire: &Acquire, _keys: &LockKeys, cmd: &mut Cmd) {
        cmd.arg("fa")
            .arg(acquire.owner.id())
            .arg(acquire.lease_ms)
            .arg(acquire.nonce);
        Place::write(acquire.place.as_ref(), cmd);
    }

    fn decode_acquire(&self, _keys: &LockKeys, code: i64) -> Option<Reply> {
        Some(acquired_or_busy(code))
    }

    fn wrap(op: FairOp) -> Op {
        Op::Fair(op)
    }
}
