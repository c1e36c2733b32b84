//! Fencing tokens of locks made of several parts.

use std::fmt;

/// One part's fencing token: the token `token` of lock `name` on `server`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The part's server, as its client names it (the address it was
    /// opened with).
    pub server: String,
    /// The part's lock name.
    pub name: String,
    /// The part's fencing token, from that server's counter for the name.
    pub token: u64,
}

/// The fencing tokens of a [`MultiLock`](crate::multi::multi_lock::MultiLock) or
/// [`RedLock`](crate::multi::red_lock::RedLock) acquisition: one per part held.
///
/// No single number can order acquisitions of locks that live on
/// independent servers: each server counts on its own. The vector can:
/// [`supersedes`](Self::supersedes) compares the components two
/// acquisitions have in common. A resource guarded by a MultiLock keeps
/// the vector of the last accepted write and refuses one that does not
/// supersede it; with a RedLock, any two acquisitions share at least one
/// server (two majorities intersect), so two acquisitions are always
/// ordered.
///
/// Tokens survive what each server's counter survives: see the crate docs'
/// "Tokens never go back".
///
/// ```
/// use hasp::{Fence, FenceVector};
/// let part = |server: &str, token| Fence { server: server.into(), name: "stock".into(), token };
/// let older = FenceVector::new(vec![part("a:6379", 7), part("b:6379", 3)]);
/// let newer = FenceVector::new(vec![part("a:6379", 9), part("b:6379", 3)]);
/// assert!(newer.supersedes(&older));
/// assert!(!older.supersedes(&newer));
/// assert!(!newer.supersedes(&newer));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct FenceVector {
    parts: Vec<Fence>,
}

impl FenceVector {
    /// A vector of these components.
    pub fn new(parts: Vec<Fence>) -> Self {
        Self { parts }
    }

    /// The components, one per part held, in the order of the lock's parts.
    pub fn parts(&self) -> &[Fence] {
        &self.parts
    }

    /// True iff the two share at least one component (same server and
    /// name), every shared component of `self` is ≥ the one of `older`, and
    /// at least one is greater. A later acquisition that took every part of
    /// the same lock free supersedes an earlier one; a re-entry (the same
    /// vector) does not supersede itself.
    pub fn supersedes(&self, older: &FenceVector) -> bool {
        let mut shared = false;
        let mut greater = false;
        for mine in &self.parts {
            for theirs in older
                .parts
                .iter()
                .filter(|t| t.server == mine.server && t.name == mine.name)
            {
                shared = true;
                if mine.token < theirs.token {
                    return false;
                }
                greater |= mine.token > theirs.token;
            }
        }
        shared && greater
    }

    /// The sum of the tokens: increases with every acquisition of the same
    /// set of parts that took every part free, as long as no server's
    /// counter is reset. A scalar for a resource that can store only one
    /// number; it orders acquisitions of one MultiLock, not of a RedLock
    /// (whose acquisitions may hold different servers).
    pub fn sum(&self) -> u128 {
        self.parts.iter().map(|p| u128::from(p.token)).sum()
    }
}

impl fmt::Display for FenceVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}/{}={}", p.server, p.name, p.token)?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(tokens: &[(&str, u64)]) -> FenceVector {
        FenceVector::new(
            tokens
                .iter()
                .map(|(s, t)| Fence {
                    server: (*s).into(),
                    name: "n".into(),
                    token: *t,
                })
                .collect(),
        )
    }

    #[test]
    fn supersedes_compares_shared_components_only() {
        assert!(v(&[("a", 2), ("b", 5)]).supersedes(&v(&[("a", 1), ("b", 5)])));
        assert!(!v(&[("a", 2), ("b", 4)]).supersedes(&v(&[("a", 1), ("b", 5)])));
        // RedLock majorities: {a,b,c} then {c,d,e} share c.
        assert!(v(&[("c", 9), ("d", 1), ("e", 1)]).supersedes(&v(&[("a", 5), ("b", 5), ("c", 5)])));
        // Nothing shared: no order.
        assert!(!v(&[("x", 9)]).supersedes(&v(&[("y", 1)])));
        assert_eq!(v(&[("a", 2), ("b", 5)]).sum(), 7);
    }
}
