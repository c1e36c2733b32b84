//! What one call carries: the split of a lane's batch between the batch
//! function and native commands (`wire::native`), which may go as a
//! command only where no other operation of the call touches its lock.

use super::queue::Request;
use super::resp;
use super::CROWDED;
use crate::core::wire::native::Native;
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
#[derive(Default)]
pub(super) struct Natives {
    pub(super) requests: Vec<Request>,
    pub(super) packed: Vec<u8>,
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
        // Room for the commands of every request (a command is about 100
        // bytes and a lock's name), so packing them does not grow it.
        let mut packed = Vec::with_capacity(batch.len() * 128);
        let mut i = 0;
        // The requests that go as commands stay in `batch`, in order.
        let scripted = batch
            .extract_if(.., |request| {
                let alone = alone.get(i);
                i += 1;
                match request.native_command(offer, crowded).filter(|_| alone) {
                    Some(command) => {
                        resp::pack(&command, &mut packed);
                        false
                    }
                    None => true,
                }
            })
            .collect();
        Self {
            settle,
            batch: scripted,
            native: Natives {
                requests: batch,
                packed,
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
            let (value, used) = resp::read(&packed[at..]).unwrap().expect("whole");
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
}
