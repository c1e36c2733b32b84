//! A named distributed count-down latch.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{lease_millis, validate_lease, MAX_COUNT};
use crate::core::keys::LockKeys;
use crate::core::wire::latch::LatchOp;
use crate::core::{deadline_after, latch as floor, Core};
use crate::error::{Error, Result};

/// How long a completed latch is remembered by default.
const DONE_TTL: Duration = Duration::from_secs(3600);

/// A handle on one named count-down latch: a count that any client lowers,
/// and waiters (any client) released together when it reaches zero.
///
/// Made by [`Client::latch`](crate::client::Client::latch); cheap to clone.
///
/// * **Set once per round.** [`try_set_count`](Self::try_set_count) arms a
///   latch that is absent or completed; re-arming one that still counts is
///   refused (false), so two coordinators cannot reset each other's round.
/// * **Waiting.** [`wait`](Self::wait) subscribes to the latch's channel,
///   then reads the count, so a completion between the two is never
///   missed; every waiter of every client is woken when it reaches zero.
/// * **Completed latches are remembered** for an hour by default
///   ([`with_tombstone`](Self::with_tombstone)): a waiter that arrives late
///   returns at once.
/// * **Never set is not zero.** Unlike Redisson, whose missing key reads as
///   "count 0" (so a waiter that arrives before the setter passes at once),
///   waiting for or counting down a latch that was never set is
///   [`Error::NotSet`], and creates nothing; [`wait_until_set`](Self::wait_until_set)
///   makes waits wait for the setter instead. Counting down below zero does
///   nothing.
/// * **Retries.** A count down whose reply was lost is sent again once, so
///   [`count_down`](Self::count_down) is at least once; with an id,
///   [`count_down_once`](Self::count_down_once) counts each id at most once.
/// * **Expiry.** [`try_set_count_for`](Self::try_set_count_for) gives the
///   latch an expiry, so one that is never counted down does not stay
///   forever; its waiters then get [`Error::Deleted`], as they do when it is
///   [`delete`](Self::delete)d.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let ready = client.latch("warm-up")?;
/// assert!(ready.try_set_count(2).await?);
///
/// let waiter = tokio::spawn({
///     let ready = ready.clone();
///     async move { ready.wait().await }
/// });
/// ready.count_down_once("cache").await?;
/// ready.count_down_once("cache").await?; // the same id counts once
/// assert_eq!(ready.count().await?, Some(1));
/// ready.count_down_once("index").await?;
/// waiter.await.expect("waiter panicked")?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct CountDownLatch {
    core: Arc<Core>,
    keys: Arc<LockKeys>,
    until_set: bool,
    done_ttl_ms: u64,
}

impl CountDownLatch {
    pub(crate) fn new(core: Arc<Core>, name: &str) -> Result<Self> {
        let keys = floor::keys(&core, name)?;
        Ok(Self {
            core,
            keys,
            until_set: false,
            done_ttl_ms: lease_millis(DONE_TTL).unwrap_or(3_600_000),
        })
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// This handle's waits wait for a latch that is not set yet to be set
    /// (and then to complete), instead of failing with [`Error::NotSet`].
    pub fn wait_until_set(mut self) -> Self {
        self.until_set = true;
        self
    }

    /// How long a latch that this handle completes is remembered as
    /// completed (default 1 h).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero or more than the client's
    /// `max_lease`.
    pub fn with_tombstone(mut self, ttl: Duration) -> Result<Self> {
        self.done_ttl_ms = validate_lease(self.core.settings(), ttl)
            .map_err(|_| Error::invalid("tombstone", format!("{ttl:?} is not valid")))?;
        Ok(self)
    }

    /// Arms the latch with `count` if it is absent or completed: false if
    /// it is still counting (nothing changes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero count; [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn try_set_count(&self, count: u64) -> Result<bool> {
        self.arm(count, 0).await
    }

    /// As [`try_set_count`](Self::try_set_count), and the latch expires
    /// after `expiry` whether or not it completes.
    ///
    /// # Errors
    /// As `try_set_count`, and [`Error::InvalidArgument`] for a zero or
    /// over-large `expiry`.
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn try_set_count_for(&self, count: u64, expiry: Duration) -> Result<bool> {
        let ms = validate_lease(self.core.settings(), expiry)
            .map_err(|_| Error::invalid("expiry", format!("{expiry:?} is not a valid expiry")))?;
        self.arm(count, ms).await
    }

    async fn arm(&self, count: u64, expiry_ms: u64) -> Result<bool> {
        if count == 0 || count > MAX_COUNT {
            return Err(Error::invalid(
                "count",
                format!("{count} is not in 1..={MAX_COUNT}"),
            ));
        }
        let op = LatchOp::Arm {
            keys: self.keys.clone(),
            count,
            expiry_ms,
        };
        Ok(floor::run(&self.core, op).await? == 1)
    }

    /// Counts down once; returns the count left (0: completed, or it was
    /// already). At least once: a call whose reply was lost is sent again.
    ///
    /// # Errors
    /// [`Error::NotSet`] if the latch is not set (nothing is created);
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe as the other changes (made once sent, whatever becomes of
    /// the future); a count whose answer was lost and that is sent again
    /// may count twice: [`count_down_once`](Self::count_down_once) does not.
    pub async fn count_down(&self) -> Result<u64> {
        self.count_down_as(None).await
    }

    /// Counts down for `id`, at most once per id while the latch counts:
    /// safe to retry. Returns the count left.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty id; as [`count_down`](Self::count_down).
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn count_down_once(&self, id: &str) -> Result<u64> {
        if id.is_empty() || id.len() > self.core.settings().max_name_len {
            return Err(Error::invalid("id", "must be 1 to max_name_len bytes"));
        }
        self.count_down_as(Some(id.into())).await
    }

    async fn count_down_as(&self, id: Option<Arc<str>>) -> Result<u64> {
        let op = LatchOp::CountDown {
            keys: self.keys.clone(),
            id,
            done_ttl_ms: self.done_ttl_ms,
        };
        let left = floor::run(&self.core, op).await?;
        u64::try_from(left).map_err(|_| Error::NotSet {
            name: self.name().to_owned(),
        })
    }

    /// The count left: `None` if the latch is not set.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn count(&self) -> Result<Option<u64>> {
        floor::count(&self.core, &self.keys).await
    }

    /// Waits until the count reaches zero.
    ///
    /// # Errors
    /// [`Error::NotSet`] (see [`wait_until_set`](Self::wait_until_set)),
    /// [`Error::Deleted`], [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait(&self) -> Result<()> {
        floor::wait(&self.core, &self.keys, None, self.until_set)
            .await
            .map(drop)
    }

    /// Waits at most `wait`: true once the count reached zero, false if
    /// the wait ran out first.
    ///
    /// # Errors
    /// As [`wait`](Self::wait), and [`Error::InvalidArgument`] for a `wait`
    /// too large to represent.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_for(&self, wait: Duration) -> Result<bool> {
        let deadline = deadline_after(wait)?;
        floor::wait(&self.core, &self.keys, Some(deadline), self.until_set).await
    }

    /// As [`wait_for`](Self::wait_for), but running out of time is an
    /// [`Error::TimedOut`].
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `wait_for`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_within(&self, wait: Duration) -> Result<()> {
        let opened = self.wait_for(wait).await?.then_some(());
        Error::unless_timed_out(opened, self.name(), wait)
    }

    /// Deletes the latch; its waiters get [`Error::Deleted`]. False if there
    /// was none.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: the change is sent when the future is first polled and
    /// made even if the future is dropped afterwards; only its answer is
    /// lost.
    pub async fn delete(&self) -> Result<bool> {
        let op = LatchOp::Delete {
            keys: self.keys.clone(),
        };
        Ok(floor::run(&self.core, op).await? == 1)
    }
}
