//! Proof that a lock is held.

use std::sync::Arc;

use crate::core::holds::HoldState;
use crate::core::Core;
use crate::error::Result;
use hasp_owner::Owner;

/// The methods of a guard that is a [`Guard`] (its field `.0`) by another
/// name, written once.
macro_rules! over_guard {
    () => {
        /// The lock's name.
        pub fn name(&self) -> &str {
            self.0.name()
        }

        /// The owner this hold is for.
        pub fn owner(&self) -> &hasp_owner::Owner {
            self.0.owner()
        }

        /// True once the hold is known to be lost (see
        /// [`Guard::is_lost`](crate::guard::Guard::is_lost)).
        pub fn is_lost(&self) -> bool {
            self.0.is_lost()
        }

        /// Resolves when the hold is lost (see
        /// [`Guard::lost`](crate::guard::Guard::lost)).
        ///
        /// # Cancel safety
        /// Cancel safe.
        pub async fn lost(&self) {
            self.0.lost().await
        }

        /// When this hold counts as lost unless a renewal is confirmed
        /// first (see [`Guard::valid_until`](crate::guard::Guard::valid_until)).
        pub fn valid_until(&self) -> std::time::Instant {
            self.0.valid_until()
        }

        /// Releases this hold (see [`Guard::unlock`](crate::guard::Guard::unlock)).
        ///
        /// # Errors
        /// As [`Guard::unlock`](crate::guard::Guard::unlock).
        ///
        /// # Cancel safety
        /// Cancel safe: once called, the release completes even if the
        /// future is dropped; only its result is lost.
        pub async fn unlock(self) -> crate::error::Result<()> {
            self.0.unlock().await
        }
    };
}
pub(crate) use over_guard;

/// A held lock, returned by [`Lock::lock`](crate::lock::Lock::lock) and friends.
///
/// The guard is `'static` and `Send`: it can be moved into another task and
/// released there (it remembers its owner). Each acquisition, re-entries
/// included, returns its own guard, and each must be released.
///
/// Release with [`unlock`](Self::unlock), which reports errors such as a
/// lock that was lost meanwhile.
///
/// # Dropping a guard
/// Dropping a guard without `unlock` gives back this hold in the background:
/// the local count drops at once, and if it was the last hold, the release is
/// sent to Redis on the client's runtime (a failure is logged with
/// `tracing`). If the runtime has shut down, nothing is sent and the lock
/// frees itself when its lease runs out (the watchdog no longer renews it).
/// Prefer `unlock().await`: it is the only way to learn that the lock was
/// lost before you released it.
///
/// # Examples
///
/// Stop working as soon as the lock is lost:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let guard = client.lock("report")?.lock().await?;
/// tokio::select! {
///     _ = guard.lost() => eprintln!("lost the lock: stop writing"),
///     _ = async { /* long critical section */ } => {}
/// }
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "if unused the lock is released at once, in the background"]
#[derive(Debug)]
pub struct Guard {
    core: Arc<Core>,
    state: Arc<HoldState>,
    released: bool,
}

impl Guard {
    pub(crate) fn new(core: Arc<Core>, state: Arc<HoldState>) -> Self {
        Self {
            core,
            state,
            released: false,
        }
    }

    /// The fencing token of this hold: greater than every token issued
    /// before for this lock name; a re-entry shares the token of the hold it
    /// re-enters.
    pub fn fencing_token(&self) -> u64 {
        self.state.token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.state.keys.name
    }

    /// The owner this guard holds the lock for.
    pub fn owner(&self) -> &Owner {
        &self.state.owner
    }

    /// True once the hold is known to be lost: renewal found the lock gone
    /// or owned by another, or the holder's belief ran out — the send time
    /// of the last acquire or renewal Redis confirmed, plus the lease, less
    /// the clock drift allowance (1% of the lease + 2 ms), has passed (so it
    /// turns true on time even while Redis is unreachable, and before the
    /// lock's key can expire on the server).
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Resolves when the hold is lost (see [`is_lost`](Self::is_lost)): at
    /// once when renewal finds the lock gone, at the latest when the
    /// holder's belief ends (as soon as `is_lost` would say so, not a timer
    /// tick later). After a reconnect every hold is checked at once.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        self.state.lost().await
    }

    /// The instant (monotonic) at which this hold counts as lost unless a
    /// renewal is confirmed first: when the last acquire or renewal that
    /// Redis confirmed was sent, plus the lease, less the clock drift
    /// allowance (1% of the lease + 2 ms).
    pub fn valid_until(&self) -> std::time::Instant {
        self.state.valid_until()
    }

    /// The shared state of this hold (its loss signal and belief end), for
    /// the kinds made of several locks.
    pub(crate) fn hold(&self) -> &Arc<HoldState> {
        &self.state
    }

    /// The server this hold lives on, as its client names it.
    pub(crate) fn server(&self) -> &Arc<str> {
        self.core.server()
    }

    /// Re-arms this hold's lease to `lease_ms` if its owner still holds the
    /// lock (true); false if it is gone (then marked lost).
    pub(crate) async fn extend(&self, lease_ms: u64) -> Result<bool> {
        self.core.extend(&self.state, lease_ms).await
    }

    /// Releases this hold. The lock is free for others once every hold of
    /// its owner is released.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::error::Error::NotHeld) if the lock is no longer
    /// held by this owner (expired, force-unlocked, lost); nothing held by
    /// anyone else is touched. [`Error::Redis`](crate::error::Error::Redis) if Redis
    /// cannot be reached; the release is then completed by the client as
    /// soon as Redis answers again (before any later operation of this
    /// client on the lock), so the lock is never left held by a hold that
    /// nobody tracks.
    ///
    /// # Cancel safety
    /// Cancel safe: once called, the release completes even if the future
    /// is dropped; only its result is lost.
    pub async fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.core.release(&self.state).await
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.released {
            self.core.release_detached(&self.state);
        }
    }
}
