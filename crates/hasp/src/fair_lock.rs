//! A named reentrant lock that serves its waiters in order of arrival.

use std::time::Duration;

use crate::error::Result;
use crate::guard::Guard;
use crate::lock::Lock;

/// A handle on one named fair lock: a [`Lock`] whose waiters, across all
/// clients, acquire in the order they started waiting.
///
/// Made by [`Client::fair_lock`](crate::client::Client::fair_lock); cheap to clone.
/// Everything [`Lock`] says about owners, leases, the watchdog, re-entry,
/// [`Guard`]s and fencing tokens holds. What differs:
///
/// * **Order.** A waiting task takes a place in a line kept in Redis; the
///   lock goes to the head of the line only, and a release wakes exactly
///   that waiter (its own client is told its id). Nobody barges: not a new
///   task of the releasing client (a plain lock hands over inside its
///   client first), not [`try_lock`](Self::try_lock), which never queues
///   and fails while anyone waits.
/// * **Dead waiters leave** by the server's clock: a waiter's place lasts
///   [`Settings::set_waiter_ttl`](crate::config::Settings::set_waiter_ttl) (10 s)
///   and its client refreshes it every third of that while it waits, so a
///   waiter whose process died leaves within one waiter TTL, and the live
///   waiter behind it re-checks when that place ends. Places never drift
///   into the future (Redisson computes them from client clocks), and each
///   call removes at most 100 dead ones.
/// * **Re-entry** by the holder is immediate: fairness is between owners.
/// * A fair lock named `N` and a [`Lock`] named `N` are distinct locks.
///
/// It costs more than a plain lock: each acquisition reads the line, and a
/// hand-over takes a wake-up message and a try (about two round trips).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let turn = client.fair_lock("printer")?;
/// let guard = turn.lock().await?;
/// let next = tokio::spawn({
///     let turn = turn.clone();
///     async move { turn.lock().await?.unlock().await }
/// });
/// // ... print; `next` waits in line, and gets the lock when we release ...
/// guard.unlock().await?;
/// next.await.expect("task panicked")?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct FairLock {
    lock: Lock,
}

impl FairLock {
    pub(crate) fn new(lock: Lock) -> Self {
        Self { lock }
    }

    // `name`, `with_lease`, `with_watchdog`, `with_owner`, `owner`,
    // `force_unlock`, `is_locked`, `is_held_by_me`, `hold_count`: the inner
    // `Lock`'s, written once for every kind over one (`lock.rs`).
    crate::lock::over_lock!();

    /// Acquires the lock, waiting in line as long as it takes.
    ///
    /// # Errors
    /// As [`Lock::lock`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no lock held and gives up the
    /// place in line.
    pub async fn lock(&self) -> Result<Guard> {
        self.lock.lock().await
    }

    /// Tries once, never queuing: `Ok(None)` if the lock is held, or free
    /// but someone waits in line.
    ///
    /// # Errors
    /// As [`Lock::try_lock`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.lock.try_lock().await
    }

    /// Waits in line at most `wait`: `Ok(None)` if it ran out (the place is
    /// given up).
    ///
    /// # Errors
    /// As [`Lock::try_lock_for`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<Guard>> {
        self.lock.try_lock_for(wait).await
    }

    /// As [`try_lock_for`](Self::try_lock_for), but running out of time is
    /// an [`Error::TimedOut`](crate::error::Error::TimedOut).
    ///
    /// # Errors
    /// As [`Lock::lock_within`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lock_within(&self, wait: Duration) -> Result<Guard> {
        self.lock.lock_within(wait).await
    }
}
