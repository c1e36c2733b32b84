//! A named lock kept in the table, and its guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::hold::SqlHold;

/// The most a waiter on MySQL/MariaDB or SQLite sleeps between tries.
const BACKOFF_CAP: Duration = Duration::from_millis(500);
/// The most a PostgreSQL waiter sleeps without a notification (one lost
/// while the listener reconnected is covered by the re-check at the
/// holder's expiry, or by this).
const RECHECK: Duration = Duration::from_secs(1);

/// A handle on one lock kept in the database table: the same shape as
/// `hasp::Lock`. Cheap to clone.
///
/// * **Owner**: the current tokio task by default;
///   [`with_owner`](Self::with_owner) sets an explicit one.
/// * **Lease**: without one the client renews the row every third of its
///   watchdog timeout while held; [`with_lease`](Self::with_lease) sets a
///   fixed lease, never renewed. Expiry is judged by the database's clock.
/// * **Reentrancy**: the owner re-enters at once; the row counts holds.
/// * **Fencing**: the row's token grows on every take-over of a free or
///   expired row; a re-entry keeps it.
/// * **Waiting**: PostgreSQL wakes waiters with `LISTEN/NOTIFY`; MySQL,
///   MariaDB and SQLite retry with jittered back-off (5 ms doubling to
///   500 ms, never past the holder's expiry or the wait's end), reading
///   the row before each retry and writing only when it looks free. A
///   release wakes the longest waiter of its own client at once on every
///   backend (one: waking all sent a write each, all but one in vain).
///   Waiting holds no pooled connection.
#[derive(Clone, Debug)]
pub struct SqlLock {
    engine: Arc<Engine>,
    name: Arc<str>,
    lease_ms: Option<u64>,
    owner: Option<hasp_owner::Owner>,
}

impl SqlLock {
    pub(crate) fn new(engine: Arc<Engine>, name: &str) -> Self {
        Self {
            engine,
            name: name.into(),
            lease_ms: None,
            owner: None,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This handle with a fixed lease, never renewed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero lease or one above `max_lease`.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self> {
        self.lease_ms = Some(self.engine.settings.lease_ms(lease)?);
        Ok(self)
    }

    /// This handle acting for `owner` instead of the current task.
    pub fn with_owner(mut self, owner: hasp_owner::Owner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The owner this handle acts for, resolved now.
    pub fn owner(&self) -> hasp_owner::Owner {
        if let Some(owner) = &self.owner {
            return owner.clone();
        }
        let id = match tokio::task::try_id() {
            Some(task) => format!("{}:t{task}", self.engine.id),
            None => format!("{}:{:?}", self.engine.id, std::thread::current().id()),
        };
        // The id never starts with ":" (it starts with the client id).
        hasp_owner::Owner::from_id(id).unwrap_or_else(|_| hasp_owner::Owner::new())
    }

    /// Acquires the lock, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::Db`] if the database cannot be reached (then the lock is not
    /// held by this call).
    ///
    /// # Cancel safety
    /// Cancel safe between statements; a statement already sent may still
    /// take the row, which then expires with its lease.
    pub async fn lock(&self) -> Result<SqlGuard> {
        self.acquire(None, true)
            .await?
            .ok_or_else(|| Error::invalid("wait", "an unbounded wait ended"))
    }

    /// One try, never waiting: `Ok(None)` if another owner holds it.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn try_lock(&self) -> Result<Option<SqlGuard>> {
        self.acquire(Some(Instant::now()), false).await
    }

    /// Tries for at most `wait`: `Ok(None)` if still held then.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `wait` too large; [`Error::Db`].
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<SqlGuard>> {
        let deadline = Instant::now()
            .checked_add(wait)
            .ok_or_else(|| Error::invalid("wait", format!("{wait:?} is too large")))?;
        self.acquire(Some(deadline), !wait.is_zero()).await
    }

    /// As [`try_lock_for`](Self::try_lock_for), running out of time being
    /// [`Error::TimedOut`].
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `try_lock_for`.
    pub async fn lock_within(&self, wait: Duration) -> Result<SqlGuard> {
        self.try_lock_for(wait)
            .await?
            .ok_or_else(|| Error::TimedOut {
                name: self.name.to_string(),
                waited: wait,
            })
    }

    /// Whether any owner holds the lock now (by the database's clock).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn is_locked(&self) -> Result<bool> {
        let inner = &self.engine;
        inner.sql.is_locked(&inner.db, &self.name).await
    }

    /// Whether this handle's owner holds the lock now.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn is_held_by_me(&self) -> Result<bool> {
        Ok(self.hold_count().await? > 0)
    }

    /// How many holds this handle's owner has on the lock now (0 if none:
    /// never taken, released, or expired), as the row counts them.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn hold_count(&self) -> Result<u32> {
        let inner = &self.engine;
        let held = inner
            .sql
            .held_by(&inner.db, &self.name, self.owner().id())
            .await?;
        Ok(held.map_or(0, |(holds, _)| u32::try_from(holds).unwrap_or(u32::MAX)))
    }

    /// What is left of the holder's lease, by the database's clock (`None`:
    /// nobody holds the lock).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let inner = &self.engine;
        inner.sql.remaining(&inner.db, &self.name).await
    }

    /// Frees the lock whoever holds it (an operator's tool) and wakes its
    /// waiters; the holder learns of it at its next renewal and gets
    /// [`Error::NotHeld`] on release. True if it was held.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn force_unlock(&self) -> Result<bool> {
        let inner = &self.engine;
        inner.sql.force_release(&inner.db, &self.name).await
    }

    async fn acquire(&self, deadline: Option<Instant>, wait: bool) -> Result<Option<SqlGuard>> {
        let inner = &self.engine;
        let owner = self.owner();
        let (lease_ms, watchdog) = match self.lease_ms {
            Some(ms) => (ms, false),
            None => (inner.settings.watchdog_lease_ms(), true),
        };
        // A try after a pause reads first (`Inner::probe`) and writes only
        // if the row looks free: waiters polling a held row then take no
        // write lock, which on SQLite queued them in front of the holder's
        // renewals. So does the first try when other tasks of this client
        // already wait for the name (a burst of buyers of one item: one
        // write per client, not per task). Otherwise, and after a release
        // woke this waiter, the acquiring statement goes at once.
        let waker = wait.then(|| Waiting::join(&self.engine, &self.name));
        let mut read_first = waker.as_ref().is_some_and(|w| w.others > 0);
        let mut backoff = Duration::from_millis(5);
        loop {
            let woken = waker.as_ref().map(|w| w.notify.clone());
            let notified = woken.as_ref().map(|n| n.notified());
            tokio::pin!(notified);
            if let Some(n) = notified.as_mut().as_pin_mut() {
                n.enable();
            }
            let busy = if read_first {
                inner.probe(&self.name, &owner).await?
            } else {
                None
            };
            let left = match busy {
                Some(left) => Some(left),
                None => match inner
                    .attempt(&self.name, &owner, lease_ms, watchdog)
                    .await?
                {
                    Ok(hold) => return Ok(Some(SqlGuard::new(self.engine.clone(), hold))),
                    Err(left) => left,
                },
            };
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if !wait || remaining.is_some_and(|r| r.is_zero()) {
                return Ok(None);
            }
            let pause = if inner.db.is_postgres() {
                left.unwrap_or(RECHECK).min(RECHECK)
            } else {
                let jittered = backoff.mul_f64(0.5 + fastrand::f64());
                backoff = (backoff * 2).min(BACKOFF_CAP);
                left.map_or(jittered, |l| jittered.min(l))
            };
            let pause = remaining.map_or(pause, |r| pause.min(r));
            read_first = match notified.as_mut().as_pin_mut() {
                Some(n) => tokio::time::timeout(pause, n).await.is_err(),
                None => {
                    tokio::time::sleep(pause).await;
                    true
                }
            };
        }
    }
}

/// A waiting task's registration for in-process and NOTIFY wake-ups.
struct Waiting {
    engine: Arc<Engine>,
    name: Arc<str>,
    notify: Arc<tokio::sync::Notify>,
    /// Tasks of this client that waited for the name when this one joined.
    others: usize,
}

impl Waiting {
    fn join(engine: &Arc<Engine>, name: &Arc<str>) -> Self {
        let (notify, others) = engine.waker(name);
        Self {
            notify,
            others,
            engine: engine.clone(),
            name: name.clone(),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.engine.leave(&self.name);
    }
}

/// A held database lock, from [`SqlLock::lock`] and friends. Dropping it
/// releases the hold in the background; [`unlock`](Self::unlock) reports
/// errors such as a lock lost meanwhile.
#[must_use = "if unused the lock is released at once, in the background"]
#[derive(Debug)]
pub struct SqlGuard {
    engine: Arc<Engine>,
    hold: Arc<SqlHold>,
    released: bool,
}

impl SqlGuard {
    fn new(engine: Arc<Engine>, hold: Arc<SqlHold>) -> Self {
        Self {
            engine,
            hold,
            released: false,
        }
    }

    /// The lock's fencing token: greater than every earlier take-over's for
    /// this name; a re-entry shares it.
    pub fn fencing_token(&self) -> u64 {
        self.hold.token.unsigned_abs()
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// True once the hold is known lost: a renewal found the row taken or
    /// expired, or the belief ran out (the send time of the last confirmed
    /// acquire or renewal plus the lease), also while the database is
    /// unreachable.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when the hold is lost (see [`is_lost`](Self::is_lost)).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        self.hold.lost().await
    }

    /// When (monotonic) the hold counts as lost unless renewed first.
    pub fn valid_until(&self) -> Instant {
        self.hold.valid_until()
    }

    /// Releases this hold; the lock is free once every hold of its owner is.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if it was lost (expired, taken over); nothing held
    /// by anyone else is touched. [`Error::Db`].
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.engine.release(&self.hold).await
    }
}

impl Drop for SqlGuard {
    fn drop(&mut self) {
        if !self.released {
            self.engine.release_detached(self.hold.clone());
        }
    }
}
