//! The batch call's wire format: the one place that knows how the batch
//! script lays out its operations and what it answers.
//!
//! An [`Op`] is one operation on one object, written by its kind's module
//! (`lock`, `fair_lock`, `rw_lock`, `semaphore`, `latch`, `lease`; the
//! queued kinds' shared lifecycle in `hold`); [`encode`] turns a batch of
//! them into one `FCALL`, and [`Op::decode`] reads that operation's slot of
//! the reply as a typed [`Reply`]. Every opcode, argument order and reply
//! code of the script is written in these modules and in the scripts'
//! headers, nowhere else.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};

use super::holds::HoldState;
use super::keys::{Kind, LockKeys};
pub(crate) use super::nonce::{Nonce, Nonces};
use super::scripts::{Library, BATCH};
use crate::error::Error;
use fair_lock::{FairAcquire, FairOp};
use hasp_owner::Owner;
use hold::{Acquisition, Step};
use latch::LatchOp;
use lease::LeaseMerge;
use lock::LockOp;
use rw_lock::{RwAcquire, RwOp};
use semaphore::{PermitAcquire, PermitOp, PoolOp};

pub(crate) mod fair_lock;
pub(crate) mod hold;
pub(crate) mod latch;
pub(crate) mod lease;
pub(crate) mod lock;
pub(crate) mod native;
pub(crate) mod rw_lock;
pub(crate) mod semaphore;

/// One operation of a batch call.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// An operation on a reentrant or plain lock.
    Lock(LockOp),
    /// An operation on a fair lock.
    Fair(FairOp),
    /// An operation on one side of a read-write lock.
    Rw(RwOp),
    /// A step of a semaphore's permits' life.
    Permits(PermitOp),
    /// An operation on a semaphore's pool as a whole.
    Pool(PoolOp),
    /// An operation on a count-down latch.
    Latch(LatchOp),
    /// A merge into a class's shared lease history.
    Lease(LeaseMerge),
}

/// What Redis answered for one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reply {
    /// Acquire: taken with this token. Hand-off: now held by the heir.
    Acquired { token: u64 },
    /// Acquire: held by another owner, for `ttl` more (`None`: no expiry).
    Busy { ttl: Option<Duration> },
    /// Release: the lock is free.
    Released,
    /// Release or hand-off: the owner still holds it (holds left).
    StillHeld,
    /// Release, hand-off, extend: the owner did not hold it; nothing changed.
    NotHeld,
    /// Hand-off: freed and published for another client's waiter instead.
    Yielded,
    /// Extend: the owner holds it (and the lease was re-armed).
    Extended,
    /// Force: whether there was a lock to free.
    Forced(bool),
    /// Semaphore acquire: the permits were taken.
    Granted,
    /// What a semaphore's query or capacity change answered (see
    /// `semaphore.lua`).
    Value(i64),
    /// A lease history after a merge (all 0: nothing known).
    Learned {
        srtt_us: i64,
        rttvar_us: i64,
        samples: i64,
        updated_at_ms: i64,
    },
}

impl Reply {
    /// Whether this reply gives its receiver something to give back.
    pub(crate) fn grants(&self) -> bool {
        matches!(self, Reply::Acquired { .. } | Reply::Granted)
    }

    /// The reply of a release sent again after its first call's reply was
    /// lost (by its settlement, `Op::settlement`): finding nothing to
    /// redo means the first try applied it, or the hold is gone; either
    /// way it is released.
    pub(crate) fn of_redone_release(self) -> Self {
        match self {
            Reply::NotHeld => Reply::Released,
            other => other,
        }
    }
}

impl Op {
    /// The renewal (`lease_ms`) or check (`None`) of `hold`, whatever its
    /// kind.
    pub(crate) fn extend(hold: &HoldState, lease_ms: Option<u64>) -> Op {
        fn extend<A: Acquisition>(hold: &HoldState, lease_ms: Option<u64>) -> Op {
            let step = Step::Extend {
                owner: hold.owner.clone(),
                lease_ms,
                token: hold.token,
            };
            Op::hold::<A>(&hold.keys, step)
        }
        let keys = &hold.keys;
        match keys.kind {
            Kind::Semaphore => extend::<PermitAcquire>(hold, lease_ms),
            Kind::RwRead | Kind::RwWrite => extend::<RwAcquire>(hold, lease_ms),
            Kind::FairLock => extend::<FairAcquire>(hold, lease_ms),
            // A latch or a lease history has no holds to renew.
            Kind::Lock | Kind::PlainLock | Kind::Latch | Kind::LeaseHistory => {
                Op::Lock(LockOp::Extend {
                    keys: keys.clone(),
                    owner: hold.owner.clone(),
                    token: hold.token,
                    lease_ms,
                    written: hold.written,
                })
            }
        }
    }

    /// The release of `count` holds (a semaphore's: permits) of `owner`,
    /// whatever the kind (a lock's without hand-off).
    pub(crate) fn release(keys: &Arc<LockKeys>, owner: &Owner, count: u32, nonce: Nonce) -> Op {
        fn release<A: Acquisition>(
            keys: &Arc<LockKeys>,
            owner: &Owner,
            count: u32,
            nonce: Nonce,
        ) -> Op {
            let step = Step::Release {
                owner: owner.clone(),
                count,
                nonce,
            };
            Op::hold::<A>(keys, step)
        }
        match keys.kind {
            Kind::Semaphore => release::<PermitAcquire>(keys, owner, count, nonce),
            Kind::RwRead | Kind::RwWrite => release::<RwAcquire>(keys, owner, count, nonce),
            Kind::FairLock => release::<FairAcquire>(keys, owner, count, nonce),
            Kind::Lock | Kind::PlainLock | Kind::Latch | Kind::LeaseHistory => {
                Op::Lock(LockOp::Release {
                    keys: keys.clone(),
                    owner: owner.clone(),
                    holds: count,
                    nonce,
                    written: None,
                })
            }
        }
    }

    pub(crate) fn keys(&self) -> &Arc<LockKeys> {
        match self {
            Op::Lock(op) => op.keys(),
            Op::Fair(op) => &op.keys,
            Op::Rw(op) => &op.keys,
            Op::Permits(op) => &op.keys,
            Op::Pool(op) => op.keys(),
            Op::Latch(op) => op.keys(),
            Op::Lease(op) => &op.keys,
        }
    }

    /// How much of a call this operation fills: one lock each, except that
    /// a renewal round sends many extends.
    pub(crate) fn is_extend(&self) -> bool {
        match self {
            Op::Lock(op) => op.is_extend(),
            Op::Fair(op) => op.is_extend(),
            Op::Rw(op) => op.is_extend(),
            Op::Permits(op) => op.is_extend(),
            Op::Pool(_) | Op::Latch(_) | Op::Lease(_) => false,
        }
    }

    /// Whether, with replica acknowledgement on, this operation counts only
    /// once replicas confirmed it: what gives or extends a hold.
    pub(crate) fn needs_replicas(&self) -> bool {
        match self {
            Op::Lock(op) => op.needs_replicas(),
            Op::Fair(op) => op.needs_replicas(),
            Op::Rw(op) => op.needs_replicas(),
            Op::Permits(op) => op.needs_replicas(),
            Op::Pool(op) => op.needs_replicas(),
            Op::Latch(_) | Op::Lease(_) => false,
        }
    }

    /// What to send, before anything else, when this operation went out but
    /// its reply was lost: whatever makes the outcome as if it had failed
    /// (acquisitions) or succeeded (releases). Empty when sending it again
    /// cannot matter (a count down sent again may count twice: documented;
    /// an id makes it once).
    pub(crate) fn settlement(&self) -> Vec<Op> {
        match self {
            Op::Lock(op) => op.settlement(),
            Op::Fair(op) => op.settlement(),
            Op::Rw(op) => op.settlement(),
            Op::Permits(op) => op.settlement(),
            Op::Pool(_) | Op::Latch(_) | Op::Lease(_) => Vec::new(),
        }
    }

    /// The same acquisition with a new nonce, to send again after a broken
    /// call; `None` if this is not an acquisition.
    pub(crate) fn renonced(&self, nonce: Nonce) -> Option<Op> {
        match self {
            Op::Lock(op) => op.renonced(nonce),
            Op::Fair(op) => op.renonced(nonce),
            Op::Rw(op) => op.renonced(nonce),
            Op::Permits(op) => op.renonced(nonce),
            Op::Pool(_) | Op::Latch(_) | Op::Lease(_) => None,
        }
    }

    /// Whether this is a release (or its settlement), which a broken call
    /// completes by sending its settlement.
    pub(crate) fn is_release(&self) -> bool {
        match self {
            Op::Lock(op) => op.is_release(),
            Op::Fair(op) => op.is_release(),
            Op::Rw(op) => op.is_release(),
            Op::Permits(op) => op.is_release(),
            Op::Pool(_) | Op::Latch(_) | Op::Lease(_) => false,
        }
    }

    /// What gives back what this operation granted, when its reply finds
    /// the receiver gone (`nonce` for the release).
    pub(crate) fn give_back(&self, nonce: Nonce) -> Option<Op> {
        match self {
            Op::Lock(op) => op.give_back(nonce),
            Op::Fair(op) => op.give_back(nonce),
            Op::Rw(op) => op.give_back(nonce),
            Op::Permits(op) => op.give_back(nonce),
            Op::Pool(_) | Op::Latch(_) | Op::Lease(_) => None,
        }
    }

    /// What must still reach Redis when this operation was not applied (the
    /// call was refused, or could not be sent): a release, or a
    /// settlement, must happen, or a hold would stay that nobody tracks.
    /// Nothing for an acquisition or a renewal (its caller got the error).
    pub(crate) fn unfinished(&self) -> Vec<Op> {
        match self {
            Op::Lock(op) => op.unfinished(),
            Op::Fair(op) => op.unfinished(),
            Op::Rw(op) => op.unfinished(),
            Op::Permits(op) => op.unfinished(),
            Op::Pool(_) | Op::Latch(_) | Op::Lease(_) => Vec::new(),
        }
    }

    /// Keys, arguments and bytes this operation adds to a call.
    fn size(&self) -> (usize, usize, usize) {
        match self {
            Op::Lock(op) => op.size(),
            Op::Fair(op) => op.size(),
            Op::Rw(op) => op.size(),
            Op::Permits(op) => op.size(),
            Op::Pool(op) => op.size(),
            Op::Latch(op) => op.size(),
            Op::Lease(op) => op.size(),
        }
    }

    fn write_keys(&self, cmd: &mut Cmd) {
        match self {
            Op::Lock(op) => op.write_keys(cmd),
            Op::Fair(op) => op.write_keys(cmd),
            Op::Rw(op) => op.write_keys(cmd),
            Op::Permits(op) => op.write_keys(cmd),
            Op::Pool(op) => op.write_keys(cmd),
            Op::Latch(op) => op.write_keys(cmd),
            Op::Lease(op) => op.write_keys(cmd),
        }
    }

    fn write_args(&self, cmd: &mut Cmd) {
        match self {
            Op::Lock(op) => op.write_args(cmd),
            Op::Fair(op) => op.write_args(cmd),
            Op::Rw(op) => op.write_args(cmd),
            Op::Permits(op) => op.write_args(cmd),
            Op::Pool(op) => op.write_args(cmd),
            Op::Latch(op) => op.write_args(cmd),
            Op::Lease(op) => op.write_args(cmd),
        }
    }

    /// The error of an operation that failed alone: a write refused by a
    /// replica is a Redis error (the master moved; retryable), anything
    /// else a protocol error.
    fn failure(&self, failure: &[u8]) -> Error {
        let text = String::from_utf8_lossy(failure);
        let message = text.strip_prefix("failed: ").unwrap_or(&text);
        // A key this node does not serve (the slot moved, or is moving),
        // or a cluster that is down: nothing was applied; send it again.
        if message.contains("non local key") || message.contains("cluster is down") {
            return Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
                "the operation reached a node that does not serve its slot",
                message.to_owned(),
            )));
        }
        if message.contains("UPGRADE:") {
            return Error::UpgradeNotSupported {
                name: self.keys().name.to_string(),
            };
        }
        if message.starts_with("READONLY") {
            return Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "the server is a replica",
                message.to_owned(),
            )));
        }
        Error::Protocol(format!("lock {:?}: {text}", self.keys().name))
    }

    /// This operation's slot of the reply.
    pub(crate) fn decode(&self, value: &Value) -> Result<Reply, Error> {
        if let (Op::Lease(op), Value::Array(_)) = (self, value) {
            return op.decode(value).ok_or_else(|| op.unexpected(value));
        }
        let code = match value {
            Value::Int(code) => *code,
            // An operation that failed alone (see `prelude.lua`).
            Value::BulkString(failure) => return Err(self.failure(failure)),
            other => return Err(self.unexpected(other)),
        };
        let reply = match self {
            Op::Lock(op) => op.decode(code),
            Op::Fair(op) => op.decode(code),
            Op::Rw(op) => op.decode(code),
            Op::Permits(op) => op.decode(code),
            // Each answers a number.
            Op::Pool(_) => Some(Reply::Value(code)),
            Op::Latch(op) => Some(op.decode(code)),
            Op::Lease(_) => None,
        };
        reply.ok_or_else(|| self.unexpected(value))
    }

    pub(super) fn unexpected(&self, value: &Value) -> Error {
        Error::Protocol(format!(
            "lock {:?}: unexpected batch reply {value:?}",
            self.keys().name
        ))
    }
}

/// An acquisition's usual answer: a fencing token (1 for a kind without
/// one), or busy for `ms` more (0: no expiry known).
fn acquired_or_busy(code: i64) -> Reply {
    match code {
        token if token > 0 => Reply::Acquired {
            token: token.unsigned_abs(),
        },
        0 => Reply::Busy { ttl: None },
        ms => Reply::Busy {
            ttl: Some(Duration::from_millis(ms.unsigned_abs())),
        },
    }
}

/// One `FCALL` of the batch function carrying `ops`, in order.
pub(crate) fn encode<'a>(
    library: &Library,
    client_id: &str,
    ops: impl Iterator<Item = &'a Op> + Clone,
) -> Cmd {
    let (keys, args, bytes) = sizes(client_id, ops.clone());
    let mut cmd = library.call(keys, keys + args, bytes);
    write(&mut cmd, client_id, ops);
    cmd
}

/// Keys, arguments and bytes of a call carrying `ops`.
fn sizes<'a>(client_id: &str, ops: impl Iterator<Item = &'a Op>) -> (usize, usize, usize) {
    ops.fold((0, 1, client_id.len()), |(keys, args, bytes), op| {
        let (k, a, b) = op.size();
        (keys + k, args + a, bytes + b)
    })
}

/// Appends the keys of `ops`, the client id, then their arguments.
fn write<'a>(cmd: &mut Cmd, client_id: &str, ops: impl Iterator<Item = &'a Op> + Clone) {
    for op in ops.clone() {
        op.write_keys(cmd);
    }
    cmd.arg(client_id);
    for op in ops {
        op.write_args(cmd);
    }
}

/// One `FCALL` of `library`'s function with `ops` whose keys may lie in several slots
/// of one Redis Cluster node: no key declared (a cluster refuses declared
/// keys of several slots), the keys passed as arguments after `'#k', n`
/// (see `prelude.lua`).
pub(crate) fn encode_spread<'a>(
    library: &Library,
    client_id: &str,
    ops: impl Iterator<Item = &'a Op> + Clone,
) -> Cmd {
    let (keys, args, bytes) = sizes(client_id, ops.clone());
    let mut cmd = library.call(0, keys + args + 2, bytes + 8);
    cmd.arg("#k").arg(keys);
    write(&mut cmd, client_id, ops);
    cmd
}

/// Every argument of one `FCALL` of the batch function, for the benchmark (which
/// drives Redis with it directly, redis-benchmark included): for each
/// `(name, owner, lease)`, an acquisition when `lease` is `Some(ms)`, else
/// the release of one hold. Names may carry redis-benchmark's placeholders.
pub(crate) fn bench_args(
    client_id: &str,
    prefix: &str,
    ops: &[(&str, &str, Option<u64>)],
) -> Result<Vec<Vec<u8>>, Error> {
    let nonces = Nonces::new();
    let ops: Vec<Op> = ops
        .iter()
        .map(|&(name, owner, lease)| {
            let keys = Arc::new(LockKeys::new(prefix, name));
            let owner = Owner::from_id(owner)?;
            let nonce = nonces.next();
            Ok(match lease {
                Some(lease_ms) => Op::Lock(LockOp::Acquire {
                    keys,
                    owner,
                    lease_ms,
                    flag_waiting: false,
                    nonce,
                }),
                None => Op::Lock(LockOp::Release {
                    keys,
                    owner,
                    holds: 1,
                    nonce,
                    written: None,
                }),
            })
        })
        .collect::<Result<_, Error>>()?;
    let cmd = encode(&BATCH, client_id, ops.iter());
    Ok(cmd
        .args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
            _ => None,
        })
        .collect())
}

/// The reply of a whole call: one value per operation.
pub(crate) fn split(reply: Value, ops: usize) -> Result<Vec<Value>, Error> {
    match reply {
        Value::Array(values) if values.len() == ops => Ok(values),
        other => Err(Error::Protocol(format!(
            "batch reply of the wrong shape for {ops} operations: {other:?}"
        ))),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn keys(name: &str) -> Arc<LockKeys> {
        Arc::new(LockKeys::new("hasp", name))
    }

    /// The arguments of `cmd` as text (the native commands' tests too).
    pub(crate) fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_call_lists_every_key_then_the_client_then_every_operation() {
        let owner = Owner::from_id("o1").unwrap();
        let nonces = Nonces::new();
        let ops = [
            Op::Lock(LockOp::Acquire {
                keys: keys("a"),
                owner: owner.clone(),
                lease_ms: 30_000,
                flag_waiting: true,
                nonce: nonces.next(),
            }),
            Op::Lock(LockOp::Release {
                keys: keys("b"),
                owner: owner.clone(),
                holds: 1,
                nonce: nonces.next(),
                written: None,
            }),
            Op::Lock(LockOp::Extend {
                keys: keys("c"),
                owner,
                token: 7,
                lease_ms: None,
                written: None,
            }),
        ];
        let nonce = match &ops[0] {
            Op::Lock(LockOp::Acquire { nonce, .. }) => nonce.to_string(),
            _ => unreachable!(),
        };
        let args = args(&encode(&BATCH, "c:1", ops.iter()));
        assert_eq!(&args[..2], ["FCALL", BATCH.function()]);
        assert_eq!(&args[2..6], ["3", "hasp:{a}", "hasp:{b}", "hasp:{c}"]);
        assert_eq!(args[6], "c:1");
        // An acquisition sends the value a free lock takes, whole.
        assert_eq!(nonce.len(), 16, "a nonce is 16 hex digits");
        assert_eq!(&args[7..10], ["w", "30000", &format!("1 {nonce} - o1")]);
        // A release of one hold does not send the count.
        assert_eq!(&args[10..12], ["r", "o1"]);
        assert_eq!(args[12].len(), 16);
        assert_eq!(&args[13..], ["e", "o1", "0", "7"]);
    }

    #[test]
    fn a_release_of_several_holds_sends_the_count() {
        let release = Op::Lock(LockOp::Release {
            keys: keys("a"),
            owner: Owner::from_id("o1").unwrap(),
            holds: 3,
            nonce: Nonces::new().next(),
            written: None,
        });
        let args = args(&encode(&BATCH, "c:1", std::iter::once(&release)));
        assert_eq!(&args[2..5], ["1", "hasp:{a}", "c:1"]);
        assert_eq!(&args[5..8], ["R", "o1", "3"]);
        assert_eq!(args[8].len(), 16);
        assert_eq!(args.len(), 9);
    }

    #[test]
    fn replies_are_read_by_the_kind_of_operation() {
        let owner = Owner::from_id("o").unwrap();
        let acquire = Op::Lock(LockOp::Acquire {
            keys: keys("a"),
            owner: owner.clone(),
            lease_ms: 1,
            flag_waiting: false,
            nonce: Nonces::new().next(),
        });
        assert_eq!(
            acquire.decode(&Value::Int(7)).unwrap(),
            Reply::Acquired { token: 7 }
        );
        assert_eq!(
            acquire.decode(&Value::Int(-250)).unwrap(),
            Reply::Busy {
                ttl: Some(Duration::from_millis(250))
            }
        );
        assert_eq!(
            acquire.decode(&Value::Int(0)).unwrap(),
            Reply::Busy { ttl: None }
        );
        let force = Op::Lock(LockOp::Force { keys: keys("a") });
        assert_eq!(force.decode(&Value::Int(1)).unwrap(), Reply::Forced(true));
        assert!(matches!(
            acquire.decode(&Value::Nil),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn a_lost_hand_off_is_settled_by_undoing_the_heir_and_completing_the_release() {
        let nonce = Nonces::new().next();
        let hand_off = Op::Lock(LockOp::HandOff {
            keys: keys("a"),
            owner: Owner::from_id("releaser").unwrap(),
            holds: 1,
            nonce,
            heir: Owner::from_id("heir").unwrap(),
            lease_ms: 100,
        });
        let settle = hand_off.settlement();
        assert!(
            matches!(&settle[0], Op::Lock(LockOp::Undo { owner, nonce: n, .. }) if owner.id() == "heir" && *n == nonce)
        );
        assert!(
            matches!(&settle[1], Op::Lock(LockOp::Settle { owner, nonce: n, .. }) if owner.id() == "releaser" && *n == nonce)
        );
        assert_eq!(
            settle[0].settlement().len(),
            1,
            "a settlement settles itself"
        );
    }
}
