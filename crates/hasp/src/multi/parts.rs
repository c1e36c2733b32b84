//! The parts of a lock made of several locks: trying them all at once,
//! releasing them all, waiting for one of them to be released.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;

use crate::core::{Attempt, Watch};
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::lock::Lock;
use hasp_owner::Owner;

/// What one part's try found.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Taken (or re-entered) for its owner.
    Held(Guard),
    /// Held by another owner, for this long if known.
    Busy(Option<Duration>),
    /// The server failed to answer in time, or answered an error. The part
    /// is not held: the floor undoes an acquisition whose reply was lost.
    Failed(Error),
}

/// One part's answer: which part, what, and when it arrived.
#[derive(Debug)]
pub(crate) struct Tried {
    pub(crate) index: usize,
    pub(crate) outcome: Outcome,
}

/// The locks a MultiLock or RedLock is made of: at least one, no lock twice.
#[derive(Debug)]
pub(crate) struct Parts {
    locks: Vec<Lock>,
}

impl Parts {
    /// Checks the parts before any Redis call.
    pub(crate) fn new(locks: Vec<Lock>) -> Result<Self> {
        if locks.is_empty() {
            return Err(Error::invalid("parts", "needs at least one lock"));
        }
        for (i, lock) in locks.iter().enumerate() {
            if locks[..i].iter().any(|earlier| earlier.same_lock(lock)) {
                return Err(Error::invalid(
                    "parts",
                    format!("lock {:?} on {} is named twice", lock.name(), lock.server()),
                ));
            }
        }
        Ok(Self { locks })
    }

    pub(crate) fn locks(&self) -> &[Lock] {
        &self.locks
    }

    pub(crate) fn len(&self) -> usize {
        self.locks.len()
    }

    /// Every part with `f` applied (setting a lease, an owner).
    pub(crate) fn try_map(&self, f: impl Fn(Lock) -> Result<Lock>) -> Result<Self> {
        let locks = self.locks.iter().cloned().map(f).collect::<Result<_>>()?;
        Ok(Self { locks })
    }

    /// Every part with `f` applied, when it cannot fail.
    pub(crate) fn map(&self, f: impl Fn(Lock) -> Lock) -> Self {
        Self {
            locks: self.locks.iter().cloned().map(f).collect(),
        }
    }

    /// The owner each part acts for, resolved now (the current task unless
    /// set).
    pub(crate) fn owners(&self) -> Vec<Owner> {
        self.locks.iter().map(Lock::owner).collect()
    }

    /// One try of every part at once, each bounded by `timeout`, answers in
    /// the order they arrive. Dropping the stream before it ends abandons
    /// the tries still out; the floor releases what they take.
    pub(crate) fn try_each<'a>(
        &'a self,
        owners: &'a [Owner],
        flag_waiting: bool,
        timeout: Duration,
    ) -> FuturesUnordered<impl Future<Output = Tried> + 'a> {
        self.locks
            .iter()
            .zip(owners)
            .enumerate()
            .map(|(index, (lock, owner))| async move {
                let outcome =
                    match tokio::time::timeout(timeout, lock.try_once(owner, flag_waiting)).await {
                        Ok(Ok(Attempt::Done(guard))) => Outcome::Held(guard),
                        Ok(Ok(Attempt::Busy(ttl))) => Outcome::Busy(ttl),
                        Ok(Err(e)) => Outcome::Failed(e),
                        Err(_) => Outcome::Failed(no_answer(lock, timeout)),
                    };
                Tried { index, outcome }
            })
            .collect()
    }

    /// Subscribes to the releases of every part.
    pub(crate) fn watch(&self) -> Watches {
        Watches(self.locks.iter().map(Lock::watch).collect())
    }
}

/// Releases every guard at once; never stops at a failure. Returns each
/// guard's result, in the order given.
pub(crate) async fn release_all(guards: Vec<Guard>) -> Vec<Result<()>> {
    join_all(guards.into_iter().map(Guard::unlock)).await
}

/// The error of a server that did not answer in time.
pub(crate) fn no_answer(lock: &Lock, after: Duration) -> Error {
    Error::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{} did not answer within {after:?}", lock.server()),
    )))
}

/// The error of a call that some servers failed: their names and the first
/// failure.
pub(crate) fn servers_failed(parts: &Parts, failed: Vec<(usize, Error)>) -> Error {
    let mut servers: Vec<String> = failed
        .iter()
        .map(|(i, _)| parts.locks()[*i].server().to_string())
        .collect();
    servers.dedup();
    let first = failed.into_iter().next().map(|(_, e)| e);
    Error::ServersFailed {
        servers,
        first: Box::new(first.unwrap_or_else(|| Error::Protocol("no failure recorded".into()))),
    }
}

/// Subscriptions to the releases of every part.
#[derive(Debug)]
pub(crate) struct Watches(Vec<Watch>);

impl Watches {
    /// Waits until every subscription is confirmed (a release before that
    /// would be missed), at most `limit` in all.
    pub(crate) async fn ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        for watch in &self.0 {
            watch
                .ready(deadline.saturating_duration_since(Instant::now()))
                .await;
        }
    }

    /// Resolves when any part may have been released since the last call.
    pub(crate) async fn any_freed(&mut self) {
        let freed = self.0.iter_mut().map(|w| Box::pin(w.freed()));
        futures_util::future::select_all(freed).await;
    }
}
