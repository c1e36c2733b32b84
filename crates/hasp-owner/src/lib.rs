//! Who holds a lock: the owner identity shared by `hasp` (locks on Redis)
//! and `hasp-sql` (locks in a database table).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An owner id that cannot be used: empty, longer than 256 bytes, or
/// starting with `:` (reserved for a lock's own fields).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid owner id: {0}")]
pub struct InvalidOwner(pub &'static str);

/// The identity a lock is held by.
///
/// By default a lock is owned by the *current task on this client* — the
/// async analogue of Redisson's thread id: a lock taken in one task is
/// re-entered by that task and released by it, and another task of the same
/// client is a different owner. The guard remembers its owner, so a
/// `Guard` can be moved to another task and released there.
///
/// When a lock must be *re-entered* or *checked* from several tasks, give
/// them an explicit owner: create one with [`Owner::new`] and pass it to
/// `Lock::with_owner`. An owner is cheap to clone
/// and can be sent between tasks; its [`id`](Owner::id) can even cross
/// processes with [`Owner::from_id`].
///
/// ```
/// let owner = hasp_owner::Owner::new();
/// let same = hasp_owner::Owner::from_id(owner.id()).unwrap();
/// assert_eq!(owner, same);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Owner(Arc<str>);

impl Owner {
    /// A new owner, distinct from every other owner (a random UUID).
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self(format!("o:{}", uuid::Uuid::new_v4()).into())
    }

    /// The owner with this id. Ids must be non-empty, at most 256 bytes, and
    /// must not start with `:` (reserved for the lock's own fields).
    ///
    /// # Errors
    /// [`InvalidOwner`] for an id that breaks these rules.
    pub fn from_id(id: impl Into<String>) -> Result<Self, InvalidOwner> {
        let id = id.into();
        if id.is_empty() {
            return Err(InvalidOwner("must not be empty"));
        }
        if id.len() > 256 {
            return Err(InvalidOwner("must be at most 256 bytes"));
        }
        if id.starts_with(':') {
            return Err(InvalidOwner("must not start with ':'"));
        }
        Ok(Self(id.into()))
    }

    /// The id stored in Redis as the holder of a lock.
    pub fn id(&self) -> &str {
        &self.0
    }

    /// The id, shared: a registry keyed by owner keeps it without a copy.
    pub fn shared_id(&self) -> &Arc<str> {
        &self.0
    }

    /// The default owner of a client whose id is `client_id`: the current
    /// tokio task, or, outside any task (for instance the future passed to
    /// `block_on`), the current thread. Two clients' owners never meet.
    pub fn current(client_id: &str) -> Self {
        let Some(task) = tokio::task::try_id() else {
            return Self(format!("{client_id}:th{}", thread_number()).into());
        };
        // A task typically asks again and again for the same client's
        // owner (each lock call does), and a worker thread runs many tasks
        // by turns: the last answers are kept per thread (formatting an
        // owner costs three allocations), each with its task and the
        // length of the client id it was made for (an id of that length
        // that begins the owner's is that client id). The oldest answer
        // makes room for a new one.
        thread_local! {
            static KEPT: std::cell::RefCell<Kept> = const {
                std::cell::RefCell::new(Kept {
                    owners: [const { None }; KEPT_OWNERS],
                    next: 0,
                })
            };
        }
        KEPT.with(|kept| {
            let mut kept = kept.borrow_mut();
            let found = kept.owners.iter().flatten().find(|(id, len, owner)| {
                *id == task && *len == client_id.len() && owner.0.starts_with(client_id)
            });
            if let Some((_, _, owner)) = found {
                return owner.clone();
            }
            let owner = Self(format!("{client_id}:t{task}").into());
            let next = kept.next;
            kept.owners[next] = Some((task, client_id.len(), owner.clone()));
            kept.next = (next + 1) % KEPT_OWNERS;
            owner
        })
    }
}

/// The owners a thread keeps ([`Owner::current`]).
struct Kept {
    owners: [Option<(tokio::task::Id, usize, Owner)>; KEPT_OWNERS],
    /// The slot the next new owner takes.
    next: usize,
}

/// How many tasks' owners each thread keeps ([`Owner::current`]).
const KEPT_OWNERS: usize = 32;

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Owner").field(&&*self.0).finish()
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_and_empty_ids_are_rejected() {
        assert!(Owner::from_id("").is_err());
        assert!(Owner::from_id(":t").is_err());
        assert!(Owner::from_id("x".repeat(257)).is_err());
        assert!(Owner::from_id("worker-7").is_ok());
    }

    #[tokio::test]
    async fn tasks_are_distinct_owners() {
        let here = tokio::spawn(async { Owner::current("c") }).await.unwrap();
        let there = tokio::spawn(async { Owner::current("c") }).await.unwrap();
        assert_ne!(here, there);
    }

    #[tokio::test]
    async fn one_task_is_one_owner_per_client_whatever_it_asked_before() {
        let (a, b, a_again, prefix) = tokio::spawn(async {
            (
                Owner::current("c:1"),
                Owner::current("c:2"),
                Owner::current("c:1"),
                // A client id that begins another's owner id is another
                // client.
                Owner::current("c"),
            )
        })
        .await
        .unwrap();
        assert_eq!(a, a_again);
        assert_ne!(a, b);
        assert!(a.id().starts_with("c:1:t") && b.id().starts_with("c:2:t"));
        assert!(prefix.id().starts_with("c:t"), "{prefix:?}");
    }

    #[tokio::test]
    async fn tasks_taking_turns_on_one_thread_keep_their_own_owners() {
        // More tasks than a thread keeps owners of.
        let tasks: Vec<_> = (0..3 * KEPT_OWNERS)
            .map(|_| {
                tokio::spawn(async {
                    let first = Owner::current("c");
                    for _ in 0..3 {
                        tokio::task::yield_now().await;
                        assert_eq!(Owner::current("c"), first);
                    }
                    first
                })
            })
            .collect();
        let mut owners = std::collections::HashSet::new();
        for task in tasks {
            assert!(owners.insert(task.await.unwrap()), "an owner given twice");
        }
    }
}
