//! Key layout.
//!
//! For a lock named `N` under prefix `P` (default `hasp`):
//!
//! | key / channel              | type    | content                                   |
//! |----------------------------|---------|-------------------------------------------|
//! | `P:{E}`                    | string  | `<count> <nonce> <flag> <owner id> <token>`, expiring with the lease: the hold count; the nonce of the last operation that changed it; the id of the client whose tasks wait, `*` if several (since the lock was last free), `-` if none; the holder (it may hold spaces); the hold's fencing token |
//! | `P:{E}:fence`              | string  | last fencing token issued for `N` (lives 100 ms from its seeding with the server's clock) |
//! | `P:{E}:released` (channel) | pub/sub | a release message, payload = releasing client id or `*` |
//!
//! A semaphore named `N` lives beside a lock of that name, in the same slot:
//!
//! | key / channel                  | type    | content                                |
//! |--------------------------------|---------|----------------------------------------|
//! | `P:{E}:sem`                    | hash    | `:cap` → capacity |
//! | `P:{E}:sem:grants`             | hash    | `:held` → permits held; `<owner id>` → its permits; `:n:<owner id>` → nonce of the last operation that changed them (expires with the last lease) |
//! | `P:{E}:sem:leases`             | zset    | owner id → end of its lease (server ms; expires with the last) |
//! | `P:{E}:sem:queue`              | zset    | `<k>\|<waiter id>` → order of arrival |
//! | `P:{E}:sem:due`                | zset    | `<k>\|<waiter id>` → end of the waiter's place (server ms) |
//! | `P:{E}:sem:released` (channel) | pub/sub | `>` and the ids of the waiters whose permits are free |
//!
//! A plain lock named `N` (no fencing token) has a lock's value under
//! `P:{E}:plain` and its channel `P:{E}:plain:released`; no counter.
//!
//! A fair lock named `N` has a lock's value and fencing counter under
//! `P:{E}:fair` and `P:{E}:fair:fence`, and a queue of waiters as a
//! semaphore's (`P:{E}:fair:queue`, `P:{E}:fair:due`, members `1|<waiter id>`);
//! its channel `P:{E}:fair:released` carries `>` and the head waiter's id.
//!
//! A read-write lock named `N`: `P:{E}:rw` (hash: `w:<owner>`,
//! `r:<owner>` hold counts, `:writer`, `:rc` readers, nonces),
//! `P:{E}:rw:leases` (zset: `<side>:<owner>` → end of that hold's lease,
//! server ms), `P:{E}:rw:fence`, and a line (`P:{E}:rw:queue`,
//! `P:{E}:rw:due`, members `W|`, `R|` or `P|` and the waiter's id);
//! channel `P:{E}:rw:released`.
//!
//! And a count-down latch named `N`:
//!
//! | key / channel                    | type    | content                              |
//! |----------------------------------|---------|--------------------------------------|
//! | `P:{E}:latch`                    | hash    | `n` → the count left (0: completed, kept as a tombstone for an hour) |
//! | `P:{E}:latch:ids`                | set     | ids counted down by `count_down_once` |
//! | `P:{E}:latch:released` (channel) | pub/sub | `set`, `0` (completed) or `deleted`  |
//!
//! `E` is `N` with `%`, `{` and `}` percent-encoded (`%25`, `%7B`, `%7D`).
//! The encoding is injective, so distinct names never share keys, and `E`
//! contains no brace, so `{E}` is the Redis Cluster hash tag of all three:
//! one lock's keys always live in one slot, whatever characters `N` holds.

use std::sync::Arc;

/// What kind of object a name's keys are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Lock,
    /// A lock without fencing tokens (its counter is never written).
    PlainLock,
    FairLock,
    /// The read side of a read-write lock.
    RwRead,
    /// The write side of a read-write lock (same keys as the read side).
    RwWrite,
    Semaphore,
    Latch,
    /// The history a class of adaptive locks shares.
    LeaseHistory,
}

/// A key under `prefix` that no lock uses (a lock's keys have a hash tag
/// right after the prefix): what a connection runs `DELIFEQ` on to learn
/// whether its ACL user may send it.
pub(crate) fn probe_key(prefix: &str) -> String {
    format!("{prefix}:native-probe")
}

/// The holder's id in a lock's value (`<count> <nonce> <flag> <owner>
/// <token>`, see the layout above); `None` for a value hasp did not write.
pub(crate) fn holder_of(value: &[u8]) -> Option<&[u8]> {
    let digits = |field: &[u8]| !field.is_empty() && field.iter().all(u8::is_ascii_digit);
    let mut fields = value.splitn(4, |&b| b == b' ');
    let count = fields.next()?;
    let (_nonce, _flag) = (fields.next()?, fields.next()?);
    // The owner may hold spaces; the token is the last field.
    let rest = fields.next()?;
    let space = rest.iter().rposition(|&b| b == b' ')?;
    let (owner, token) = (&rest[..space], &rest[space + 1..]);
    (digits(count) && digits(token)).then_some(owner)
}

/// The precomputed keys of one object (a lock, by default) of one name.
#[derive(Debug)]
pub(crate) struct LockKeys {
    pub(crate) kind: Kind,
    pub(crate) name: Arc<str>,
    pub(crate) lock: Arc<str>,
    pub(crate) fence: String,
    pub(crate) channel: Arc<str>,
    /// Which shard of a client's registries this lock belongs to: the same
    /// for every handle on the name (FNV-1a of the name).
    pub(crate) shard: usize,
    /// The Redis Cluster slot of every key of the lock (that of `{E}`).
    #[cfg(feature = "cluster")]
    pub(crate) slot: u16,
    /// The other keys of a kind that has more than one (a semaphore's
    /// grants, leases, queue and due); empty for a lock.
    pub(crate) extra: Box<[String]>,
}

impl LockKeys {
    /// Whether its holds carry fencing tokens (every lock-like kind but
    /// the plain lock).
    pub(crate) fn fenced(&self) -> bool {
        self.kind != Kind::PlainLock
    }

    /// Whether the object's waiters, of every client, wait in a line kept
    /// in Redis (fair lock, read-write lock, semaphore) and are woken from
    /// its script; a lock's wait in their own client, for its release
    /// message or a hand-over.
    pub(crate) fn has_line(&self) -> bool {
        matches!(
            self.kind,
            Kind::FairLock | Kind::RwRead | Kind::RwWrite | Kind::Semaphore
        )
    }

    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let tag = encode_name(name);
        Self::with_base(Kind::Lock, format!("{prefix}:{{{tag}}}"), name, &tag, &[])
    }

    /// The keys of the plain lock called `name`.
    pub(crate) fn plain(prefix: &str, name: &str) -> Self {
        let tag = encode_name(name);
        let base = format!("{prefix}:{{{tag}}}:plain");
        Self::with_base(Kind::PlainLock, base, name, &tag, &[])
    }

    /// The keys of the fair lock called `name`.
    pub(crate) fn fair(prefix: &str, name: &str) -> Self {
        let tag = encode_name(name);
        let base = format!("{prefix}:{{{tag}}}:fair");
        Self::with_base(Kind::FairLock, base, name, &tag, &["queue", "due"])
    }

    /// The keys of one side (`kind`: [`Kind::RwRead`] or [`Kind::RwWrite`])
    /// of the read-write lock called `name`.
    pub(crate) fn rw(prefix: &str, name: &str, kind: Kind) -> Self {
        let tag = encode_name(name);
        let base = format!("{prefix}:{{{tag}}}:rw");
        Self::with_base(kind, base, name, &tag, &["leases", "queue", "due"])
    }

    /// The keys of the semaphore called `name`.
    pub(crate) fn semaphore(prefix: &str, name: &str) -> Self {
        let tag = encode_name(name);
        let base = format!("{prefix}:{{{tag}}}:sem");
        Self::with_base(
            Kind::Semaphore,
            base,
            name,
            &tag,
            &["grants", "leases", "queue", "due"],
        )
    }

    /// The key of the history shared by the adaptive locks of class
    /// `class`: `P:{C}:lease`, its own slot.
    pub(crate) fn lease_history(prefix: &str, class: &str) -> Self {
        let tag = encode_name(class);
        let base = format!("{prefix}:{{{tag}}}:lease");
        Self::with_base(Kind::LeaseHistory, base, class, &tag, &[])
    }

    /// The keys of the count-down latch called `name`.
    pub(crate) fn latch(prefix: &str, name: &str) -> Self {
        let tag = encode_name(name);
        let base = format!("{prefix}:{{{tag}}}:latch");
        Self::with_base(Kind::Latch, base, name, &tag, &["ids"])
    }

    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))] // `tag`: for the slot
    fn with_base(kind: Kind, lock: String, name: &str, tag: &str, extra: &[&str]) -> Self {
        Self {
            kind,
            extra: extra.iter().map(|e| format!("{lock}:{e}")).collect(),
            name: name.into(),
            fence: format!("{lock}:fence"),
            channel: format!("{lock}:released").into(),
            shard: name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            }) as usize,
            lock: lock.into(),
            #[cfg(feature = "cluster")]
            slot: slot(tag.as_bytes()),
        }
    }
}

/// The Redis Cluster slot of a key whose hash tag is `tag`: CRC16-XMODEM
/// modulo 16384.
#[cfg(feature = "cluster")]
fn slot(tag: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag) % 16384
}

fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_a_locks_value() {
        let value = b"2 0123456789abcdef - worker one 1764201234567890";
        assert_eq!(holder_of(value), Some(&b"worker one"[..]));
        assert_eq!(holder_of(b"1 n c:x o 1"), Some(&b"o"[..]));
        assert_eq!(holder_of(b"not a lock"), None);
        assert_eq!(holder_of(b"1 n - o"), None, "no token");
        assert_eq!(holder_of(b"1 n -"), None);
        assert_eq!(holder_of(b""), None);
    }

    /// The hash tag Redis Cluster would use for `key`.
    fn hash_tag(key: &str) -> &str {
        if let Some(open) = key.find('{') {
            if let Some(len) = key[open + 1..].find('}') {
                if len > 0 {
                    return &key[open + 1..open + 1 + len];
                }
            }
        }
        key
    }

    #[test]
    fn all_keys_of_a_lock_share_one_hash_tag() {
        for name in [
            "plain",
            "{}",
            "}{",
            "a}b",
            "{x}",
            "%7B",
            "with space:colon",
            "锁",
        ] {
            let k = LockKeys::new("hasp", name);
            assert_eq!(hash_tag(&k.lock), hash_tag(&k.fence), "{name}");
            assert_eq!(hash_tag(&k.lock), hash_tag(&k.channel), "{name}");
            assert_ne!(hash_tag(&k.lock), &*k.lock, "{name} must have a tag");
        }
    }

    #[test]
    #[cfg(feature = "cluster")]
    fn slots_are_redis_clusters() {
        // `CLUSTER KEYSLOT {3}` = 1584, `{w}` = 3696, `a` = 15495.
        assert_eq!(LockKeys::new("hasp", "3").slot, 1584);
        assert_eq!(LockKeys::new("hasp", "w").slot, 3696);
        assert_eq!(slot(b"a"), 15495);
    }

    #[test]
    fn names_that_look_alike_map_to_distinct_keys() {
        let names = [
            "{", "%7B", "%257B", "}", "%7D", "%", "%25", "a", "a:fence", "a}:fence",
        ];
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let k = LockKeys::new("hasp", name);
            assert!(seen.insert(k.lock.to_string()), "collision for {name}");
            assert!(seen.insert(k.fence.clone()), "collision for {name}");
        }
    }
}
