//! A read-write lock's operations in the batch call (`rw_lock.lua`): the
//! hold lifecycle of `hold` on one side, which every step names.

use redis::Cmd;

use super::hold::{Acquire, Acquisition, Codes, HoldOp, Place};
use super::{acquired_or_busy, Op, Reply};
use crate::core::keys::{Kind, LockKeys};

/// One operation on one side of a read-write lock (its keys' kind is
/// [`Kind::RwRead`] or [`Kind::RwWrite`]).
pub(crate) type RwOp = HoldOp<RwAcquire>;

/// A side's acquisition; `prefer_readers`: a reader ignores waiting
/// writers.
#[derive(Debug, Clone)]
pub(crate) struct RwAcquire {
    pub(crate) prefer_readers: bool,
}

impl Acquisition for RwAcquire {
    const CODES: Codes = Codes {
        release: "yr",
        extend: "ye",
        undo: "yu",
        settle: "ys",
        leave: "yq",
    };
    const FENCED: bool = true;
    const RENEWAL_SENDS_TOKEN: bool = false;
    const MOST_ARGS: usize = 8;

    fn side(keys: &LockKeys) -> Option<&'static str> {
        Some(match keys.kind {
            Kind::RwWrite => "w",
            _ => "r",
        })
    }

    fn write_acquire(&self, acquire: &Acquire, keys: &LockKeys, cmd: &mut Cmd) {
        cmd.arg("ya")
            .arg(Self::side(keys))
            .arg(acquire.owner.id())
            .arg(acquire.lease_ms)
            .arg(acquire.nonce);
        Place::write(acquire.place.as_ref(), cmd);
        cmd.arg(if self.prefer_readers { "1" } else { "0" });
    }

    fn decode_acquire(&self, keys: &LockKeys, code: i64) -> Option<Reply> {
        Some(match acquired_or_busy(code) {
            // A read answers 1 + the last write's token.
            Reply::Acquired { token } if keys.kind != Kind::RwWrite => {
                Reply::Acquired { token: token - 1 }
            }
            reply => reply,
        })
    }

    fn wrap(op: RwOp) -> Op {
        Op::Rw(op)
    }
}
