//! Operation ids: what lets the client tell, after a call whose reply was
//! lost, whether Redis applied an operation (see `lock.lua`, "nonce"), and
//! what a hold's value in Redis carries.

use std::sync::atomic::{AtomicU64, Ordering};

/// Identifies one operation, so that the client can tell afterwards whether
/// a call whose reply was lost applied it (see `lock.lua`, "nonce").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Nonce(u64);

/// Nonces unique across clients: a random start per client, then counted.
#[derive(Debug)]
pub(crate) struct Nonces(AtomicU64);

impl Nonces {
    pub(crate) fn new() -> Self {
        let (high, low) = uuid::Uuid::new_v4().as_u64_pair();
        Self(AtomicU64::new(high ^ low))
    }

    pub(crate) fn next(&self) -> Nonce {
        Nonce(self.0.fetch_add(1, Ordering::Relaxed))
    }
}

impl Nonce {
    /// The 16 hex digits Redis stores (as `Display` writes them).
    pub(crate) fn hex(self) -> [u8; 16] {
        let mut buf = [0u8; 16];
        let digits = b"0123456789abcdef";
        for (i, b) in buf.iter_mut().enumerate() {
            *b = digits[((self.0 >> (60 - 4 * i)) & 0xf) as usize];
        }
        buf
    }
}

impl std::fmt::Display for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The digits Redis stores, from the one place that writes them.
        self.hex()
            .iter()
            .try_for_each(|&b| std::fmt::Write::write_char(f, char::from(b)))
    }
}

impl redis::ToRedisArgs for Nonce {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        out.write_arg(&self.hex());
    }
}
