//! Operations sent as one plain Redis command instead of through the batch
//! function, where no branch is needed.
//!
//! A function call costs Redis its dispatch and the call's set-up whatever
//! it carries (at one operation per call, most of the work of a lock/unlock
//! pair; `benches/README.md`). These operations need no branch when the
//! lock is free, or exactly as this client left it:
//!
//! | operation | native command | when |
//! |---|---|---|
//! | a plain lock's acquisition | `SET <lock> <hold> NX PX <lease>` | always (Redis 7.0) |
//! | a lock's acquisition | `EVALSHA <acquire_free.lua> 1 <lock> <hold> <lease>` | the script loaded when the connection was made (every server), in a call of fewer than 8 operations |
//! | the last release of a hold | `DELIFEQ <lock> <hold>` | the server has `DELIFEQ` (Valkey 9.0) |
//! | the last release of a hold | `EVALSHA <delete_if_equal.lua> 1 <lock> <hold>` | otherwise (Redis 7.0), the script loaded when the connection was made |
//! | a renewal | `SET <lock> <hold> IFEQ <hold> PX <lease>` | the server has `DELIFEQ` (so `SET … IFEQ`, Valkey 8.1) |
//!
//! `<hold>` is the value an acquisition of a free lock writes
//! (`1 <nonce> - <owner> <token>`, `lock.lua`): while Redis holds exactly
//! that, the hold has one count, no waiter of another client flagged
//! itself (so no release message is owed) and it is this acquisition's
//! (the nonce is unique). A fenced lock's acquisition needs its token from
//! the counter in the same step, so it is a script, not a command: a small
//! one of its own for a free lock, in the server's scripting state rather
//! than the function library's (its garbage collector walks less), with no
//! dispatch; a lock found held answers 0 and goes through the function. When the command finds anything else it changes nothing and
//! answers 0 or nil, and the operation goes through the function after all
//! (the batcher sends it first in the lane's next call): the function then
//! does what the command could not (publishes the release, counts the
//! holds left, flags a waiter, answers how long the lock stays held).
//!
//! A lost reply is settled as the function's operation would be (an undo
//! by nonce, a release redone by nonce: `Op::settlement`), since the value
//! carries the same nonce. Redis 8.4's `DELEX … IFEQ` would serve as
//! `DELIFEQ` does, but no Redis 8.4 server could be tested here: on Redis
//! the function stays.
//!
//! [`Op::native`] says which command an operation goes as, borrowing
//! what it sends from the operation; [`NativeCommand::write_args`] gives
//! its arguments, the value built in place, to whatever packs them (the
//! batcher packs them as RESP beside its socket, without a `redis::Cmd` or
//! a value built first). A call's commands are packed one after another
//! into one buffer, which the connection copies into its own.

use std::sync::LazyLock;

use redis::{Cmd, Value};

use super::lock::{free_value, LockOp};
use super::{Op, Reply};
use crate::core::holds::Written;
use crate::core::keys::Kind;
use crate::core::nonce::Nonce;
use crate::error::Error;
use hasp_owner::Owner;

/// `DELIFEQ` as a script, for servers without it.
const DELETE_IF_EQUAL_SOURCE: &str = include_str!("../scripts/delete_if_equal.lua");
pub(crate) static DELETE_IF_EQUAL: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(DELETE_IF_EQUAL_SOURCE));
/// A fenced lock's acquisition when it is free.
const ACQUIRE_FREE_SOURCE: &str = include_str!("../scripts/acquire_free.lua");
pub(crate) static ACQUIRE_FREE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(ACQUIRE_FREE_SOURCE));

/// What a server offers beyond Redis 7.0, learned when a connection is made
/// (again after each reconnect: a promoted replica may run another version).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Native {
    /// `DELIFEQ` and `SET … IFEQ` (Valkey 9.0 and later).
    pub(crate) conditional: bool,
    /// Without them, [`DELETE_IF_EQUAL`] is loaded (`SCRIPT LOAD`), so a
    /// last release is one `EVALSHA` of it.
    pub(crate) script: bool,
    /// [`ACQUIRE_FREE`] is loaded, so a lock's acquisition is one
    /// `EVALSHA` of it.
    pub(crate) acquire: bool,
}

impl Native {
    /// The command that asks a server what it offers.
    pub(crate) fn probe() -> Cmd {
        let mut cmd = redis::cmd("COMMAND");
        cmd.arg("INFO").arg("DELIFEQ");
        cmd
    }

    /// A `DELIFEQ` that deletes nothing (`key` is never written): whether
    /// the connection's user may send it. An ACL user with the rules of
    /// Redis 7.0 (`acl_rules`) may not, on a server that has it; its
    /// releases then go as the script.
    pub(crate) fn probe_permission(key: &str) -> Cmd {
        let mut cmd = redis::cmd("DELIFEQ");
        cmd.arg(key).arg("");
        cmd
    }

    /// The command that loads [`DELETE_IF_EQUAL`].
    pub(crate) fn load_script() -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(DELETE_IF_EQUAL_SOURCE);
        cmd
    }

    /// The command that loads [`ACQUIRE_FREE`].
    pub(crate) fn load_acquire() -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(ACQUIRE_FREE_SOURCE);
        cmd
    }

    /// What a server's answer to [`probe`](Self::probe) says it offers.
    pub(crate) fn from_probe(reply: &Value) -> Self {
        let known = match reply {
            Value::Array(entries) => entries.first().is_some_and(|e| !matches!(e, Value::Nil)),
            _ => false,
        };
        Self {
            conditional: known,
            script: false,
            acquire: false,
        }
    }
}

/// One operation's native command, borrowing what it sends from the
/// operation ([`Op::native`]); [`write`](Self::write) packs it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NativeCommand<'a> {
    /// A free lock's acquisition: `SET <lock> <value> NX PX <lease>` for
    /// a plain lock, `EVALSHA <acquire_free.lua> 1 <lock> <hold> <lease>`
    /// for a `fenced` one (the script adds the token).
    Acquire {
        lock: &'a str,
        owner: &'a Owner,
        nonce: Nonce,
        lease_ms: u64,
        fenced: bool,
    },
    /// `DELIFEQ <lock> <value>`, or the same by [`DELETE_IF_EQUAL`]
    /// (`script`): the last release of a hold.
    DeleteIfEqual {
        lock: &'a str,
        owner: &'a Owner,
        written: Written,
        script: bool,
    },
    /// `SET <lock> <value> IFEQ <value> PX <lease>`: a renewal.
    SetIfEqual {
        lock: &'a str,
        owner: &'a Owner,
        written: Written,
        lease_ms: u64,
    },
}

/// Where a native command's arguments go, one after the other: the
/// batcher's RESP packer (`batcher::resp`) on the way to the wire.
pub(crate) trait Args {
    /// One argument made of `parts` one after the other.
    fn joined(&mut self, parts: &[&[u8]]) -> &mut Self;

    /// One argument.
    fn arg(&mut self, bytes: &[u8]) -> &mut Self {
        self.joined(&[bytes])
    }

    /// One argument: a number, in decimal.
    fn number(&mut self, n: u64) -> &mut Self {
        self.arg(itoa::Buffer::new().format(n).as_bytes())
    }
}

impl NativeCommand<'_> {
    /// How many arguments [`write_args`](Self::write_args) gives, the
    /// command's name included.
    pub(crate) fn arg_count(&self) -> usize {
        match *self {
            NativeCommand::Acquire { .. } => 6,
            NativeCommand::DeleteIfEqual { script: true, .. } => 5,
            NativeCommand::DeleteIfEqual { script: false, .. } => 3,
            NativeCommand::SetIfEqual { .. } => 7,
        }
    }

    /// Gives this command's arguments to `args`, the command's name first;
    /// the lock's value is one argument made of its parts, built in place.
    pub(crate) fn write_args<A: Args>(&self, args: &mut A) {
        let value = |a: &mut A, owner, nonce, token| {
            free_value(owner, nonce, token, |parts| {
                a.joined(parts);
            });
        };
        match *self {
            NativeCommand::Acquire {
                lock,
                owner,
                nonce,
                lease_ms,
                fenced,
            } => {
                if fenced {
                    args.arg(b"EVALSHA")
                        .arg(ACQUIRE_FREE.get_hash().as_bytes())
                        .arg(b"1")
                        .arg(lock.as_bytes());
                    value(args, owner, nonce, None);
                    args.number(lease_ms);
                } else {
                    args.arg(b"SET").arg(lock.as_bytes());
                    value(args, owner, nonce, Some(1));
                    args.arg(b"NX").arg(b"PX").number(lease_ms);
                }
            }
            NativeCommand::DeleteIfEqual {
                lock,
                owner,
                written,
                script,
            } => {
                if script {
                    args.arg(b"EVALSHA")
                        .arg(DELETE_IF_EQUAL.get_hash().as_bytes())
                        .arg(b"1");
                } else {
                    args.arg(b"DELIFEQ");
                }
                args.arg(lock.as_bytes());
                value(args, owner, written.nonce, Some(written.token));
            }
            NativeCommand::SetIfEqual {
                lock,
                owner,
                written,
                lease_ms,
            } => {
                args.arg(b"SET").arg(lock.as_bytes());
                value(args, owner, written.nonce, Some(written.token));
                args.arg(b"IFEQ");
                value(args, owner, written.nonce, Some(written.token));
                args.arg(b"PX").number(lease_ms);
            }
        }
    }
}

impl Op {
    /// This operation as one native command on a server offering `native`,
    /// or `None` if it needs the function. In a `crowded` call (one that
    /// carries many operations) a lock's acquisition goes through the
    /// function: each script call pays Redis's per-command cost, while the
    /// function's per-call cost is then shared by many operations.
    pub(crate) fn native(&self, native: Native, crowded: bool) -> Option<NativeCommand<'_>> {
        let Op::Lock(op) = self else {
            return None;
        };
        match op {
            LockOp::Acquire {
                keys,
                owner,
                lease_ms,
                nonce,
                ..
            } => {
                let fenced = match keys.kind {
                    Kind::PlainLock => false,
                    Kind::Lock if native.acquire && !crowded => true,
                    _ => return None,
                };
                Some(NativeCommand::Acquire {
                    lock: &keys.lock,
                    owner,
                    nonce: *nonce,
                    lease_ms: *lease_ms,
                    fenced,
                })
            }
            LockOp::Release {
                keys,
                owner,
                holds: 1,
                written: Some(written),
                ..
            } if matches!(keys.kind, Kind::Lock | Kind::PlainLock)
                && (native.conditional || native.script) =>
            {
                Some(NativeCommand::DeleteIfEqual {
                    lock: &keys.lock,
                    owner,
                    written: *written,
                    script: !native.conditional,
                })
            }
            LockOp::Extend {
                keys,
                owner,
                lease_ms: Some(lease_ms),
                written: Some(written),
                ..
            } if native.conditional && matches!(keys.kind, Kind::Lock | Kind::PlainLock) => {
                Some(NativeCommand::SetIfEqual {
                    lock: &keys.lock,
                    owner,
                    written: *written,
                    lease_ms: *lease_ms,
                })
            }
            _ => None,
        }
    }

    /// The reply to this operation's native command: `Ok(None)` when the
    /// command found the lock otherwise and changed nothing (the operation
    /// then goes through the function).
    pub(crate) fn decode_native(&self, value: &Value) -> Result<Option<Reply>, Error> {
        let reply = match (self, value) {
            (Op::Lock(LockOp::Acquire { .. }), Value::Okay) => Some(Reply::Acquired { token: 1 }),
            (Op::Lock(LockOp::Acquire { .. }), Value::Int(token)) if *token > 0 => {
                Some(Reply::Acquired {
                    token: token.unsigned_abs(),
                })
            }
            (Op::Lock(LockOp::Release { .. }), Value::Int(1)) => Some(Reply::Released),
            (Op::Lock(LockOp::Extend { .. }), Value::Okay) => Some(Reply::Extended),
            (Op::Lock(LockOp::Acquire { .. }) | Op::Lock(LockOp::Extend { .. }), Value::Nil)
            | (
                Op::Lock(LockOp::Acquire { .. }) | Op::Lock(LockOp::Release { .. }),
                Value::Int(0),
            ) => None,
            (_, other) => return Err(self.unexpected(other)),
        };
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::core::keys::LockKeys;
    use crate::core::nonce::Nonces;

    /// The arguments of `cmd`, as text.
    fn args(cmd: NativeCommand<'_>) -> Vec<String> {
        struct Collected(Vec<String>);
        impl Args for Collected {
            fn joined(&mut self, parts: &[&[u8]]) -> &mut Self {
                self.0.push(String::from_utf8(parts.concat()).unwrap());
                self
            }
        }
        let mut collected = Collected(Vec::new());
        cmd.write_args(&mut collected);
        assert_eq!(collected.0.len(), cmd.arg_count(), "as many as announced");
        collected.0
    }

    #[test]
    fn a_last_release_of_a_hold_this_client_wrote_is_one_delifeq_where_the_server_has_it() {
        let nonces = Nonces::new();
        let written = nonces.next();
        let release = Op::Lock(LockOp::Release {
            keys: Arc::new(LockKeys::new("hasp", "a")),
            owner: Owner::from_id("o1").unwrap(),
            holds: 1,
            nonce: nonces.next(),
            written: Some(Written {
                nonce: written,
                token: 7,
            }),
        });
        assert!(
            release.native(Native::default(), false).is_none(),
            "no script loaded"
        );
        let script = Native {
            conditional: false,
            script: true,
            acquire: false,
        };
        let cmd = release
            .native(script, false)
            .expect("a script on Redis 7.0");
        assert_eq!(
            args(cmd),
            [
                "EVALSHA",
                DELETE_IF_EQUAL.get_hash(),
                "1",
                "hasp:{a}",
                &format!("1 {written} - o1 7")
            ]
        );
        let valkey = Native {
            conditional: true,
            script: false,
            acquire: false,
        };
        let cmd = release.native(valkey, false).expect("native on Valkey 9");
        assert_eq!(
            args(cmd),
            ["DELIFEQ", "hasp:{a}", &format!("1 {written} - o1 7")]
        );
        assert_eq!(
            release.decode_native(&Value::Int(1)).unwrap(),
            Some(Reply::Released)
        );
        assert_eq!(release.decode_native(&Value::Int(0)).unwrap(), None);
    }

    #[test]
    fn a_plain_acquisition_is_one_set_nx_and_a_fenced_one_the_acquisition_script_when_not_crowded()
    {
        let nonce = Nonces::new().next();
        let acquire = |keys: LockKeys| {
            Op::Lock(LockOp::Acquire {
                keys: Arc::new(keys),
                owner: Owner::from_id("o1").unwrap(),
                lease_ms: 500,
                flag_waiting: true,
                nonce,
            })
        };
        let plain = acquire(LockKeys::plain("hasp", "a"));
        let cmd = plain
            .native(Native::default(), false)
            .expect("native everywhere");
        assert_eq!(
            args(cmd),
            [
                "SET",
                "hasp:{a}:plain",
                &format!("1 {nonce} - o1 1"),
                "NX",
                "PX",
                "500"
            ]
        );
        assert_eq!(plain.decode_native(&Value::Nil).unwrap(), None);
        let fenced = acquire(LockKeys::new("hasp", "a"));
        let loaded = Native {
            conditional: true,
            script: false,
            acquire: true,
        };
        assert!(
            fenced.native(Native::default(), false).is_none(),
            "not loaded"
        );
        assert!(fenced.native(loaded, true).is_none(), "crowded");
        let cmd = fenced
            .native(loaded, false)
            .expect("the acquisition script");
        assert_eq!(
            args(cmd),
            [
                "EVALSHA",
                ACQUIRE_FREE.get_hash(),
                "1",
                "hasp:{a}",
                &format!("1 {nonce} - o1"),
                "500"
            ]
        );
        assert_eq!(
            fenced.decode_native(&Value::Int(42)).unwrap(),
            Some(Reply::Acquired { token: 42 })
        );
        assert_eq!(fenced.decode_native(&Value::Int(0)).unwrap(), None);
        assert!(
            plain.native(loaded, true).is_some(),
            "a SET is never crowded out"
        );
    }
}
