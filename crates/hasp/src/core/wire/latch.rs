//! A count-down latch's operations in the batch call (`latch.lua`).

use std::sync::Arc;

use redis::Cmd;

use super::Reply;
use crate::core::keys::LockKeys;

/// One operation on a count-down latch; each answers a number.
#[derive(Debug, Clone)]
pub(crate) enum LatchOp {
    /// Arm with `count` if absent or completed; expire after `expiry_ms`
    /// (0: never).
    Arm {
        keys: Arc<LockKeys>,
        count: u64,
        expiry_ms: u64,
    },
    /// Count down once (at most once per `id`); a completed latch stays as
    /// a tombstone for `done_ttl_ms`.
    CountDown {
        keys: Arc<LockKeys>,
        id: Option<Arc<str>>,
        done_ttl_ms: u64,
    },
    /// Delete, waking the waiters.
    Delete { keys: Arc<LockKeys> },
}

impl LatchOp {
    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        match self {
            LatchOp::Arm { keys, .. }
            | LatchOp::CountDown { keys, .. }
            | LatchOp::Delete { keys } => keys,
        }
    }

    pub(super) fn size(&self) -> (usize, usize, usize) {
        let keys = 2 * self.keys().lock.len() + 8;
        let id = match self {
            LatchOp::CountDown { id: Some(id), .. } => id.len(),
            _ => 0,
        };
        (2, 3, keys + id + 40)
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
            LatchOp::Arm {
                count, expiry_ms, ..
            } => {
                cmd.arg("la").arg(*count).arg(*expiry_ms);
            }
            LatchOp::CountDown {
                id, done_ttl_ms, ..
            } => {
                cmd.arg("ld")
                    .arg(id.as_deref().unwrap_or(""))
                    .arg(*done_ttl_ms);
            }
            LatchOp::Delete { .. } => {
                cmd.arg("lx");
            }
        }
    }

    pub(super) fn decode(&self, code: i64) -> Reply {
        Reply::Value(code)
    }
}
