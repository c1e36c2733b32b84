//! The learned leases' shared history in the batch call (`lease.lua`).

use std::sync::Arc;

use redis::{Cmd, Value};

use super::Reply;
use crate::core::keys::LockKeys;
use crate::error::Error;

/// A merge of one client's estimate for a class into the shared history.
#[derive(Debug, Clone)]
pub(crate) struct LeaseMerge {
    pub(crate) keys: Arc<LockKeys>,
    /// Milliseconds.
    pub(crate) srtt: f64,
    /// Milliseconds.
    pub(crate) rttvar: f64,
    /// Samples taken since this client's last merge (0: only read).
    pub(crate) samples: u64,
    pub(crate) ttl_ms: u64,
    pub(crate) max_ms: u64,
}

impl LeaseMerge {
    pub(super) fn size(&self) -> (usize, usize, usize) {
        (1, 6, self.keys.lock.len() + 80)
    }

    pub(super) fn write_keys(&self, cmd: &mut Cmd) {
        cmd.arg(&*self.keys.lock);
    }

    pub(super) fn write_args(&self, cmd: &mut Cmd) {
        cmd.arg("lm")
            .arg(format!("{:.3}", self.srtt))
            .arg(format!("{:.3}", self.rttvar))
            .arg(self.samples)
            .arg(self.ttl_ms)
            .arg(self.max_ms);
    }

    /// The merged history: srtt and rttvar in µs, samples, updated_at.
    pub(super) fn decode(&self, value: &Value) -> Option<Reply> {
        let Value::Array(items) = value else {
            return None;
        };
        let ints: Vec<i64> = items
            .iter()
            .map(|v| match v {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect::<Option<_>>()?;
        match ints[..] {
            [srtt_us, rttvar_us, samples, updated_at_ms] => Some(Reply::Learned {
                srtt_us,
                rttvar_us,
                samples,
                updated_at_ms,
            }),
            _ => None,
        }
    }

    pub(super) fn unexpected(&self, value: &Value) -> Error {
        Error::Protocol(format!(
            "lease history {:?}: unexpected reply {value:?}",
            self.keys.name
        ))
    }
}
