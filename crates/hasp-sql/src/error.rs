//! The error type of the database lock.

use std::time::Duration;

/// What went wrong in a database lock operation: outcomes a caller plans
/// for ([`NotHeld`](Error::NotHeld), [`TimedOut`](Error::TimedOut)) apart
/// from failures of the database ([`Db`](Error::Db)), which are never
/// reported as "not acquired".
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before any statement ran.
    #[error("invalid argument `{argument}`: {reason}")]
    InvalidArgument {
        /// Which argument.
        argument: &'static str,
        /// Why it was rejected.
        reason: String,
    },

    /// The lock is not held by this owner (never taken, released, expired,
    /// or taken over after it expired). Nothing was changed.
    #[error("lock {name:?} is not held by this owner")]
    NotHeld {
        /// The lock's name.
        name: String,
    },

    /// A wait the caller asked to treat as an error ran out.
    #[error("lock {name:?} was not acquired within {waited:?}")]
    TimedOut {
        /// The lock's name.
        name: String,
        /// How long the caller was prepared to wait.
        waited: Duration,
    },

    /// The database could not be reached or refused a statement.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

impl Error {
    pub(crate) fn invalid(argument: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument,
            reason: reason.into(),
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
