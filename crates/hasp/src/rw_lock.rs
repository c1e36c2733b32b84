//! A named distributed read-write lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::holds::{Claim, Lease};
use crate::core::keys::LockKeys;
use crate::core::{deadline_after, rw_lock as floor, Core};
use crate::error::{Error, Result};
use crate::guard::Guard;
use hasp_owner::Owner;

/// A handle on one named read-write lock: many readers or one writer.
///
/// Made by [`Client::rw_lock`](crate::client::Client::rw_lock); cheap to clone. The
/// shape is tokio's `RwLock`: [`read`](Self::read) gives a [`ReadGuard`],
/// [`write`](Self::write) a [`WriteGuard`]. Owners, leases, the watchdog and
/// re-entry work as for a [`Lock`](crate::lock::Lock), per hold:
///
/// * **Writers are not starved.** Once a writer waits, readers that do not
///   already hold a read wait behind it, in one line kept in Redis with the
///   writers (served in order of arrival; readers next to each other in the
///   line enter together). [`prefer_readers`](Self::prefer_readers) lets new
///   readers in whenever no writer holds the lock instead.
/// * **Each read hold has its own lease**, renewed by its own client's
///   watchdog: a reader whose process dies frees its hold within one lease
///   without ending anyone else's, and no live client renews it.
/// * **Re-entry.** A reader re-reads, a writer re-writes and may also read.
///   A writer that takes a read hold and then releases the write lock has
///   **downgraded**: it holds the read, and no writer can enter in between.
///   **Upgrading** (a reader asking for the write lock) is refused at once
///   with [`Error::UpgradeNotSupported`]: it would wait for itself.
/// * **Fencing.** Every write acquisition gets a fresh token; a read guard
///   carries the token of the last write (0 if there was none since the
///   lock was last idle: the counter expires with the last lease, like
///   every key of the lock), so a reader can tell which write it sees.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let config = client.rw_lock("config")?;
///
/// let write = config.write().await?;
/// let token = write.fencing_token();
/// // ... update the configuration, tagged with `token` ...
/// let read = config.read().await?;  // the writer may read too
/// write.unlock().await?;            // downgraded: still reading
/// assert_eq!(read.fencing_token(), token);
///
/// let reader = config.clone().with_owner(hasp::Owner::new());
/// let shared = reader.read().await?; // readers share
/// let writer = config.clone().with_owner(hasp::Owner::new());
/// assert!(writer.try_write().await?.is_none()); // not while anyone reads
/// shared.unlock().await?;
/// read.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    core: Arc<Core>,
    read: Arc<LockKeys>,
    write: Arc<LockKeys>,
    lease: Lease,
    owner: Option<Owner>,
    prefer_readers: bool,
}

impl RwLock {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        let (read, write) = floor::keys(&core, name)?;
        Ok(Self {
            core,
            read,
            write,
            lease: Lease::Watchdog,
            owner: None,
            prefer_readers: false,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.read.name
    }

    // `with_lease`, `with_watchdog`, `with_owner`, `owner`: written once
    // for every kind that takes holds of its own (`terms.rs`).
    crate::terms::hold_terms!();

    /// This handle's readers enter whenever no writer holds the lock, even
    /// while writers wait (reader preference: more read throughput, and a
    /// writer may wait as long as readers keep overlapping).
    pub fn prefer_readers(mut self) -> Self {
        self.prefer_readers = true;
        self
    }

    /// Takes a read hold, waiting as long as it takes.
    ///
    /// # Errors
    /// As [`Lock::lock`](crate::lock::Lock::lock).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left held, and the place in line is given up.
    pub async fn read(&self) -> Result<ReadGuard> {
        let guard = self.take(&self.read, &self.write, None, true).await?;
        Ok(ReadGuard(unbounded(guard)?))
    }

    /// Tries once to read, never queuing: `Ok(None)` if a writer holds the
    /// lock or waits for it.
    ///
    /// # Errors
    /// As [`Lock::try_lock`](crate::lock::Lock::try_lock).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_read(&self) -> Result<Option<ReadGuard>> {
        let guard = self
            .take(&self.read, &self.write, Some(Instant::now()), false)
            .await?;
        Ok(guard.map(ReadGuard))
    }

    /// Waits at most `wait` to read: `Ok(None)` if it ran out.
    ///
    /// # Errors
    /// As [`Lock::try_lock_for`](crate::lock::Lock::try_lock_for).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_read_for(&self, wait: Duration) -> Result<Option<ReadGuard>> {
        let deadline = deadline_after(wait)?;
        let guard = self
            .take(&self.read, &self.write, Some(deadline), !wait.is_zero())
            .await?;
        Ok(guard.map(ReadGuard))
    }

    /// As [`try_read_for`](Self::try_read_for), but running out of time
    /// is an [`Error::TimedOut`].
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `try_read_for`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn read_within(&self, wait: Duration) -> Result<ReadGuard> {
        let found = self.try_read_for(wait).await?;
        Error::unless_timed_out(found, self.name(), wait)
    }

    /// Takes the write lock, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::UpgradeNotSupported`] if this owner holds a read (through
    /// this client); otherwise as [`Lock::lock`](crate::lock::Lock::lock).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is left held, and the place in line is given up.
    pub async fn write(&self) -> Result<WriteGuard> {
        let guard = self.take(&self.write, &self.read, None, true).await?;
        Ok(WriteGuard(unbounded(guard)?))
    }

    /// Tries once to write, never queuing: `Ok(None)` if anyone holds the
    /// lock or waits for it.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_write(&self) -> Result<Option<WriteGuard>> {
        let guard = self
            .take(&self.write, &self.read, Some(Instant::now()), false)
            .await?;
        Ok(guard.map(WriteGuard))
    }

    /// Waits at most `wait` to write: `Ok(None)` if it ran out.
    ///
    /// # Errors
    /// As [`write`](Self::write), and [`Error::InvalidArgument`] for a
    /// `wait` too large to represent.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn try_write_for(&self, wait: Duration) -> Result<Option<WriteGuard>> {
        let deadline = deadline_after(wait)?;
        let guard = self
            .take(&self.write, &self.read, Some(deadline), !wait.is_zero())
            .await?;
        Ok(guard.map(WriteGuard))
    }

    /// As [`try_write_for`](Self::try_write_for), but running out of time
    /// is an [`Error::TimedOut`].
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `try_write_for`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn write_within(&self, wait: Duration) -> Result<WriteGuard> {
        let found = self.try_write_for(wait).await?;
        Error::unless_timed_out(found, self.name(), wait)
    }

    async fn take(
        &self,
        side: &Arc<LockKeys>,
        other: &Arc<LockKeys>,
        deadline: Option<Instant>,
        wait: bool,
    ) -> Result<Option<Guard>> {
        let owner = self.owner();
        let claim = Claim {
            keys: side,
            owner: &owner,
            lease: self.lease,
        };
        let prefer_readers = self.prefer_readers;
        let hold = floor::acquire(&self.core, claim, other, deadline, wait, prefer_readers).await?;
        Ok(hold.map(|hold| Guard::new(self.core.clone(), hold)))
    }

    /// Whether some owner holds the write lock now.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn is_write_locked(&self) -> Result<bool> {
        self.core
            .query(redis::cmd("HEXISTS").arg(&*self.read.lock).arg(":writer"))
            .await
    }

    /// How many owners hold a read now (an expired hold may count until the
    /// next operation on the lock gives it back).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn reader_count(&self) -> Result<u64> {
        let count: Option<u64> = self
            .core
            .query(redis::cmd("HGET").arg(&*self.read.lock).arg(":rc"))
            .await?;
        Ok(count.unwrap_or(0))
    }
}

fn unbounded(guard: Option<Guard>) -> Result<Guard> {
    guard.ok_or_else(|| Error::Protocol("an unbounded wait ended without the lock".to_owned()))
}

/// A read hold, from [`RwLock::read`]. Released with
/// [`unlock`](Self::unlock) or, in the background, when dropped (as a
/// [`Guard`]).
#[must_use = "if unused the read hold is released at once, in the background"]
#[derive(Debug)]
pub struct ReadGuard(Guard);

impl ReadGuard {
    // `name`, `owner`, `is_lost`, `lost`, `valid_until`, `unlock`: the
    // inner `Guard`'s, written once for every guard over one (`guard.rs`).
    crate::guard::over_guard!();

    /// The token of the last write before this read was taken (0 if none
    /// is remembered: the lock was never written, or it sat idle after the
    /// last write's lease ended).
    pub fn fencing_token(&self) -> u64 {
        self.0.fencing_token()
    }
}

/// The write lock, from [`RwLock::write`]. Released with
/// [`unlock`](Self::unlock) or, in the background, when dropped (as a
/// [`Guard`]).
#[must_use = "if unused the write lock is released at once, in the background"]
#[derive(Debug)]
pub struct WriteGuard(Guard);

impl WriteGuard {
    // `name`, `owner`, `is_lost`, `lost`, `valid_until`, `unlock`: the
    // inner `Guard`'s, written once for every guard over one (`guard.rs`).
    crate::guard::over_guard!();

    /// This write's fencing token: greater than every token issued before
    /// for this lock; a re-entry shares it.
    pub fn fencing_token(&self) -> u64 {
        self.0.fencing_token()
    }
}
