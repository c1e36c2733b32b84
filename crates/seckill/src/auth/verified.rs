//! Tokens verified lately, by their text.
//!
//! A buyer's client sends the same token with every request, and checking
//! its signature and claims again (an HMAC or a public-key check, base64,
//! a JSON parse) costs an instance more than the rest of a purchase's own
//! work. A token verified once is taken again without those checks while
//! it is unexpired, for at most [`REUSE_FOR`], and only while the identity
//! provider's key set is the one it was verified with: a key removed from
//! the set stops being honoured at the refresh that drops it, as without
//! this memory. Only tokens that passed every check are kept, so a forged
//! or broken token is checked in full each time; a hit needs the exact
//! text of a token that passed.

use std::time::{Duration, Instant};

use super::Principal;

/// How long one verification is taken again at most.
pub(super) const REUSE_FOR: Duration = Duration::from_secs(60);

/// Tokens kept at most (each costs its text, a few hundred bytes).
const CAPACITY: usize = 50_000;

/// What one verification found.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    principal: Principal,
    /// The token's `exp` (Unix seconds) plus the leeway: past it, the
    /// token is refused as expired.
    usable_until_s: u64,
    verified_at: Instant,
    /// The key set's generation it was verified with.
    key_set: u64,
}

/// The tokens [`super::Tokens`] verified lately.
pub(super) struct Verified {
    cache: quick_cache::sync::Cache<String, Verdict>,
}

impl Verified {
    pub(super) fn new() -> Self {
        Self {
            cache: quick_cache::sync::Cache::new(CAPACITY),
        }
    }

    /// Whom `token` speaks for, if it was verified lately, with key set
    /// generation `key_set`, and is still usable at `now_s` (Unix seconds).
    pub(super) fn get(&self, token: &str, now_s: u64, key_set: u64) -> Option<Principal> {
        let verdict = self.cache.get(token)?;
        (now_s <= verdict.usable_until_s
            && verdict.key_set == key_set
            && verdict.verified_at.elapsed() < REUSE_FOR)
            .then_some(verdict.principal)
    }

    /// Keeps `token`'s verification with key set generation `key_set`: it
    /// speaks for `principal` until `usable_until_s` (Unix seconds).
    pub(super) fn keep(
        &self,
        token: &str,
        principal: Principal,
        usable_until_s: u64,
        key_set: u64,
    ) {
        self.cache.insert(
            token.to_owned(),
            Verdict {
                principal,
                usable_until_s,
                verified_at: Instant::now(),
                key_set,
            },
        );
    }
}
