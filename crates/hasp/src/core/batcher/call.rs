//! What one call carries: the split of a lane's batch between the batch
//! function and native commands (`wire::native`), which may go as a
//! command only where no other operation of the call touches its lock.

use super::queue::Request;
use super::CROWDED;
use crate::core::wire::native::{Native, NativeCommand};
use crate::core::wire::Op;

/// What one call carries: settlements and requests for the function, and
/// requests sent as native commands.
pub(super) struct Call {
    pub(super) settle: Vec<Op>,
    pub(super) batch: Vec<Request>,
    pub(super) native: Natives,
}

/// Requests sent as native commands, and those commands packed in the
/// requests' order (`resp::Packer`), ready for the connection's buffer.
/// The first `shared` requests (none, or two and more: fenced
/// acquisitions) share the first command, whose reply is an array of
/// theirs.
#[derive(Default)]
pub(super) struct Natives {
    pub(super) requests: Vec<Request>,
    pub(super) packed: Vec<u8>,
    pub(super) shared: usize,
}

impl Natives {
    /// How many commands are packed.
    pub(super) fn commands(&self) -> usize {
        match self.shared {
            0 => self.requests.len(),
            n => self.requests.len() + 1 - n,
        }
    }
}

impl Call {
    /// Everything through the function.
    pub(super) fn scripted(settle: Vec<Op>, batch: Vec<Request>) -> Self {
        Self {
            settle,
            batch,
            native: Natives::default(),
        }
    }

    /// Each request whose operation has a native command on a server
    /// offering `offer` goes as that command, unless another operation of
    /// the call touches the same lock (the function's operations and the
    /// commands are not ordered among themselves) or its command already
    /// found the lock otherwise.
    pub(super) fn split(settle: Vec<Op>, mut batch: Vec<Request>, offer: Native) -> Self {
        // Scripts pay Redis's per-command cost each; in a call that
        // carries many operations the function's share per operation is
        // lower (`wire::native`).
        let crowded = batch.len() >= CROWDED;
        if !batch
            .iter()
            .any(|r| r.native_command(offer, crowded).is_some())
        {
            return Self::scripted(settle, batch);
        }
        // Alone in its call (the common case of an idle client), a request
        // shares its lock with nothing.
        let alone = if settle.is_empty() && batch.len() == 1 {
            Alone::Few(1)
        } else {
            Alone::of(&settle, &batch)
        };
        let mut i = 0;
        // The requests that go as commands stay in `batch`, in order.
        let scripted = batch
            .extract_if(.., |request| {
                let alone = alone.get(i);
                i += 1;
                request
                    .native_command(offer, crowded)
                    .filter(|_| alone)
                    .is_none()
            })
            .collect();
        // Fenced acquisitions first: two or more share one script run
        // (their locks are distinct, so the commands' order is free).
        let fenced = |r: &Request| {
            r.native_command(offer, crowded)
                .is_some_and(|c| c.is_fenced_acquire())
        };
        batch.sort_by_key(|r| !fenced(r));
        let shared = match batch.iter().take_while(|r| fenced(r)).count() {
            1 => 0,
            n => n,
        };
        // Room for the commands of every request (a command is about 100
        // bytes and a lock's name), so packing them does not grow it.
        let mut packed = Vec::with_capacity(batch.len() * 128);
        let commands = batch
            .iter()
            .filter_map(|r| r.native_command(offer, crowded));
        if shared > 0 {
            NativeCommand::write_shared(commands.clone().take(shared), &mut packed);
        }
        for command in commands.skip(shared) {
            command.write(&mut packed);
        }
        Self {
            settle,
            batch: scripted,
            native: Natives {
                requests: batch,
                packed,
                shared,
            },
        }
    }
}

/// Which requests of a call share their lock with no other operation of
/// the call (settlements included).
enum Alone {
    /// Of a call of at most [`CROWDED`] operations: bit `i` for request `i`.
    Few(u32),
    Many(Vec<bool>),
}

impl Alone {
    fn of(settle: &[Op], batch: &[Request]) -> Self {
        let ops = || settle.iter().chain(batch.iter().map(|r| &r.op));
        // A call carries a few operations unless the client is busy:
        // comparing each with each is then cheaper than hashing.
        if settle.len() + batch.len() <= CROWDED {
            let mut alone = 0;
            for (i, request) in batch.iter().enumerate() {
                let mine = &*request.op.keys().lock;
                if ops().filter(|op| &*op.keys().lock == mine).count() == 1 {
                    alone |= 1 << i;
                }
            }
            return Alone::Few(alone);
        }
        let mut uses = std::collections::HashMap::<&str, u32>::with_capacity(CROWDED * 2);
        for op in ops() {
            *uses.entry(&*op.keys().lock).or_default() += 1;
        }
        Alone::Many(
            batch
                .iter()
                .map(|r| uses[&*r.op.keys().lock] == 1)
                .collect(),
        )
    }

    fn get(&self, i: usize) -> bool {
        match self {
            Alone::Few(bits) => bits & (1 << i) != 0,
            Alone::Many(each) => each[i],
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use redis::Value;

    use super::*;
    use crate::core::wire::lock::LockOp;
    use crate::core::wire::Nonces;
    use hasp_owner::Owner;

    #[test]
    fn only_requests_alone_on_their_lock_in_a_call_go_as_native_commands() {
        use crate::core::keys::LockKeys;
        let nonces = Nonces::new();
        let owner = Owner::from_id("o1").unwrap();
        let keys = |name: &str| Arc::new(LockKeys::plain("hasp", name));
        let acquire = |name: &str| Request {
            op: Op::Lock(LockOp::Acquire {
                keys: keys(name),
                owner: owner.clone(),
                lease_ms: 500,
                flag_waiting: false,
                nonce: nonces.next(),
            }),
            done: Box::new(|_| {}),
            retried: false,
            redirects: 0,
            scripted: false,
            wait_ends: None,
        };
        // "b" is settled in the same call, "c" acquired twice, "d" found
        // held by its native command already: all through the function,
        // in order.
        let settle = vec![Op::Lock(LockOp::Undo {
            keys: keys("b"),
            owner: owner.clone(),
            nonce: nonces.next(),
        })];
        let mut refused = acquire("d");
        refused.scripted = true;
        let batch = vec![
            acquire("c"),
            acquire("a"),
            acquire("b"),
            acquire("c"),
            refused,
            acquire("e"),
        ];
        let call = Call::split(settle, batch, Native::default());
        let names = |requests: &[Request]| -> Vec<String> {
            requests
                .iter()
                .map(|r| r.op.keys().name.to_string())
                .collect()
        };
        assert_eq!(call.settle.len(), 1);
        assert_eq!(names(&call.batch), ["c", "b", "c", "d"]);
        assert_eq!(names(&call.native.requests), ["a", "e"]);
        // Their commands, packed one after the other in the same order.
        let packed = &call.native.packed;
        let mut at = 0;
        for name in ["a", "e"] {
            let (value, used) = crate::core::resp::read(&packed[at..])
                .unwrap()
                .expect("whole");
            let Value::Array(args) = value else {
                panic!("a command: {value:?}")
            };
            assert_eq!(args[0], Value::BulkString(b"SET".to_vec()));
            assert_eq!(
                args[1],
                Value::BulkString(format!("hasp:{{{name}}}:plain").into_bytes())
            );
            at += used;
        }
        assert_eq!(at, packed.len(), "nothing else packed");
    }

    #[test]
    fn a_calls_fenced_acquisitions_share_one_script_run_ahead_of_the_other_commands() {
        use crate::core::keys::LockKeys;
        let nonces = Nonces::new();
        let owner = Owner::from_id("o1").unwrap();
        let request = |keys: LockKeys| Request {
            op: Op::Lock(LockOp::Acquire {
                keys: Arc::new(keys),
                owner: owner.clone(),
                lease_ms: 500,
                flag_waiting: false,
                nonce: nonces.next(),
            }),
            done: Box::new(|_| {}),
            retried: false,
            redirects: 0,
            scripted: false,
            wait_ends: None,
        };
        let batch = vec![
            request(LockKeys::new("hasp", "a")),
            request(LockKeys::plain("hasp", "p")),
            request(LockKeys::new("hasp", "b")),
            request(LockKeys::new("hasp", "c")),
        ];
        let offer = Native {
            acquire: true,
            ..Native::default()
        };
        let call = Call::split(Vec::new(), batch, offer);
        let names = |requests: &[Request]| -> Vec<String> {
            requests
                .iter()
                .map(|r| r.op.keys().name.to_string())
                .collect()
        };
        assert!(call.batch.is_empty());
        assert_eq!(names(&call.native.requests), ["a", "b", "c", "p"]);
        assert_eq!(call.native.shared, 3);
        assert_eq!(call.native.commands(), 2);
        let packed = &call.native.packed;
        let (first, used) = crate::core::resp::read(packed).unwrap().expect("whole");
        let Value::Array(args) = first else {
            panic!("a command: {first:?}")
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => panic!("a bulk string: {other:?}"),
        };
        assert_eq!(text(&args[0]), "EVALSHA");
        assert_eq!(text(&args[2]), "3", "three keys");
        assert_eq!(args.len(), 3 + 3 * 3, "a lock, a hold and a lease each");
        let locks: Vec<_> = args[3..6].iter().map(text).collect();
        assert_eq!(locks, ["hasp:{a}", "hasp:{b}", "hasp:{c}"]);
        assert_eq!(text(&args[7]), "500", "the first lease after its hold");
        let (second, rest) = crate::core::resp::read(&packed[used..])
            .unwrap()
            .expect("whole");
        let Value::Array(args) = second else {
            panic!("a command: {second:?}")
        };
        assert_eq!(text(&args[0]), "SET", "the plain lock's own command");
        assert_eq!(used + rest, packed.len(), "nothing else packed");
    }

    #[test]
    fn a_lone_fenced_acquisition_keeps_its_own_command() {
        use crate::core::keys::LockKeys;
        let nonces = Nonces::new();
        let owner = Owner::from_id("o1").unwrap();
        let batch = vec![Request {
            op: Op::Lock(LockOp::Acquire {
                keys: Arc::new(LockKeys::new("hasp", "a")),
                owner,
                lease_ms: 500,
                flag_waiting: false,
                nonce: nonces.next(),
            }),
            done: Box::new(|_| {}),
            retried: false,
            redirects: 0,
            scripted: false,
            wait_ends: None,
        }];
        let offer = Native {
            acquire: true,
            ..Native::default()
        };
        let call = Call::split(Vec::new(), batch, offer);
        assert_eq!(call.native.shared, 0);
        assert_eq!(call.native.commands(), 1);
        let (value, _) = crate::core::resp::read(&call.native.packed)
            .unwrap()
            .expect("whole");
        let Value::Array(args) = value else {
            panic!("a command: {value:?}")
        };
        assert_eq!(args[2], Value::BulkString(b"1".to_vec()));
    }
}
