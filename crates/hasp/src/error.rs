//! The one error type of the library.

use std::time::Duration;

/// What went wrong in a lock operation.
///
/// Outcomes a caller plans for ([`NotHeld`](Error::NotHeld),
/// [`TimedOut`](Error::TimedOut)) are separate from failures of the
/// infrastructure ([`Redis`](Error::Redis)): an unreachable Redis is never
/// reported as "not acquired".
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before any Redis call (empty or over-long
    /// name, zero or over-large duration, malformed setting).
    #[error("invalid argument `{argument}`: {reason}")]
    InvalidArgument {
        /// Which argument.
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// The lock is not held by this owner: it was never acquired, was
    /// already released, expired, or was taken over after a loss.
    /// Nothing was changed in Redis.
    #[error("lock {name:?} is not held by this owner")]
    NotHeld {
        /// The lock's name.
        name: String,
    },

    /// A count-down latch that was never set (or whose expiry ended it) was
    /// counted down or waited for. Nothing was created.
    #[error("latch {name:?} is not set")]
    NotSet {
        /// The latch's name.
        name: String,
    },

    /// A count-down latch was deleted (or expired) while this task waited
    /// for it.
    #[error("latch {name:?} was deleted while waited for")]
    Deleted {
        /// The latch's name.
        name: String,
    },

    /// A read holder asked for the write lock of the same read-write lock:
    /// it would wait for itself forever, so it is refused at once. Release
    /// the read first (or take the write lock first and downgrade).
    #[error("lock {name:?}: a read hold cannot be upgraded to write")]
    UpgradeNotSupported {
        /// The lock's name.
        name: String,
    },

    /// A wait that the caller asked to treat as an error ran out.
    #[error("lock {name:?} was not acquired within {waited:?}")]
    TimedOut {
        /// The lock's name.
        name: String,
        /// How long the caller was prepared to wait.
        waited: Duration,
    },

    /// Redis could not be reached or answered with an error.
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),

    /// Fewer replicas than
    /// [`Settings::set_replica_ack`](crate::config::Settings::set_replica_ack) asks
    /// for confirmed an acquisition in time; it was released again.
    #[error("acquisition confirmed by {acked} of the {wanted} replicas required; released")]
    NotReplicated {
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas required.
        wanted: u32,
    },

    /// Servers of a [`MultiLock`](crate::multi::multi_lock::MultiLock) or
    /// [`RedLock`](crate::multi::red_lock::RedLock) failed to answer (down, unreachable, or
    /// slower than the per-server timeout), so it is unknown whether the
    /// lock could have been taken. Nothing the call took is left held.
    #[error("servers {servers:?} failed: {first}")]
    ServersFailed {
        /// The servers that failed, as their clients name them.
        servers: Vec<String>,
        /// The first failure.
        first: Box<Error>,
    },

    /// Redis answered something this library does not expect (for instance a
    /// key of the wrong type sits where a lock should be).
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
}

impl Error {
    /// True when the same call may succeed if repeated later: connection
    /// drops, time-outs, refused connections, a Redis loading its data or
    /// failing over (or demoted to a replica), sentinels that name no
    /// reachable master yet (between a master's death and a promotion),
    /// and too few replicas. Outcomes such as
    /// [`NotHeld`](Error::NotHeld) and bad arguments are not retryable.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Redis(e) => {
                e.is_io_error()
                    || e.is_timeout()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::MasterNameNotFoundBySentinel
                            | redis::ErrorKind::NoValidReplicasFoundBySentinel
                    )
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::BusyLoading
                                | redis::ServerErrorKind::ReadOnly
                                | redis::ServerErrorKind::TryAgain
                                | redis::ServerErrorKind::MasterDown
                                | redis::ServerErrorKind::ClusterDown
                        )
                    )
            }
            Error::NotReplicated { .. } => true,
            Error::ServersFailed { first, .. } => first.is_retryable(),
            _ => false,
        }
    }

    /// What a `_within` method answers for what its `try_…_for` found:
    /// `Ok(taken)`, or [`Error::TimedOut`] naming `name` if the wait ran
    /// out with nothing.
    pub(crate) fn unless_timed_out<T>(found: Option<T>, name: &str, waited: Duration) -> Result<T> {
        found.ok_or_else(|| Error::TimedOut {
            name: name.to_owned(),
            waited,
        })
    }

    pub(crate) fn invalid(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }
}

impl From<hasp_owner::InvalidOwner> for Error {
    fn from(e: hasp_owner::InvalidOwner) -> Self {
        Error::invalid("owner", e.0)
    }
}

/// A call a Redis Cluster turned away without applying it: the slot is
/// elsewhere or moving, the cluster is failing over, or the node it was
/// meant for has no connection yet (a replica just promoted).
pub(crate) fn is_redirect(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::ClusterConnectionNotFound
            | redis::ErrorKind::Server(
                redis::ServerErrorKind::Moved
                    | redis::ServerErrorKind::Ask
                    | redis::ServerErrorKind::TryAgain
                    | redis::ServerErrorKind::ClusterDown
            )
    )
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_without_a_master_yet_is_retryable() {
        for kind in [
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            redis::ErrorKind::NoValidReplicasFoundBySentinel,
        ] {
            let e = redis::RedisError::from((kind, "no master yet"));
            assert!(Error::Redis(e).is_retryable(), "{kind:?}");
        }
        let e = redis::RedisError::from((redis::ErrorKind::Parse, "bad reply"));
        assert!(!Error::Redis(e).is_retryable());
    }
}
