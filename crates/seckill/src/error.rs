//! The library error of the service's building blocks.

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument was rejected before any Redis call.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// Which field or argument.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// More than 2^32 order ids were asked for in one day.
    #[error("the order sequence of day {day} is exhausted")]
    SequenceExhausted {
        /// Days since 1970-01-01.
        day: u64,
    },
    /// The clock is outside the range order ids can encode.
    #[error("the clock is outside the order id range: {0}")]
    Clock(String),
    /// Redis could not be reached or answered with an error.
    #[error("redis error: {0}")]
    Redis(#[from] redis::RedisError),
    /// The SQL database failed (unreachable, constraint not mapped to an
    /// outcome, …). Nothing was committed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A migration failed.
    #[error("migration failed: {0}")]
    Migration(#[from] sqlx::migrate::MigrateError),
    /// A lock operation failed (Redis unreachable, lock wait timed out).
    #[error("lock error: {0}")]
    Lock(#[from] hasp::Error),
    /// A lock kept in the database failed (database unreachable).
    #[error("table lock error: {0}")]
    TableLock(#[from] hasp_sql::Error),
    /// Redis restarted (it no longer knows the purchase script) and the
    /// sale state it holds has not been checked against the database since;
    /// nothing was bought. Retry once the repair is done.
    #[error("redis restarted; the sale state is being verified")]
    SaleUnverified,
    /// A purchase was accepted by the Redis primary, but fewer replicas than
    /// asked for confirmed it in time: it stands unless the primary fails
    /// before replicating it (an unknown outcome for the buyer).
    #[error("accepted by the primary but confirmed by {acked} of {wanted} replicas")]
    NotReplicated {
        /// Replicas that confirmed.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },
    /// Redis answered something unexpected.
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
    /// The payment provider did not charge.
    #[error(transparent)]
    Payment(#[from] PaymentError),
    /// Another payment of the order, by another key, is under way: its
    /// provider's callback decides first.
    #[error("another payment of this order is under way")]
    PaymentUnderWay,
    /// A provider's callback about a refund arrived before the order's
    /// refund was recorded: not applied; the provider delivers it again.
    #[error("the callback came before what it answers; deliver it again later")]
    EventTooEarly,
    /// A waiting-room pass that does not let its bearer buy.
    #[error(transparent)]
    Pass(#[from] PassError),
}

/// Why a payment provider did not charge, void or refund.
#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    /// The provider refused the charge (the buyer's card, say): asking again
    /// with the same key is refused again.
    #[error("payment declined: {0}")]
    Declined(String),
    /// The provider could not be asked or did not answer: the outcome is
    /// unknown; ask again with the same key.
    #[error("payment provider unavailable: {0}")]
    Unavailable(String),
}

/// Why a pass does not let its bearer buy (a purchase without one, in a
/// sale with a room, is [`Refusal::PassRequired`](crate::domain::purchase::Refusal::PassRequired)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PassError {
    /// Not a pass this service signed (or one altered).
    #[error("the pass is not one this service issued")]
    Forged,
    /// Its time is up.
    #[error("the pass ran out: the turn it gave has passed")]
    Expired,
    /// Issued to another person.
    #[error("the pass was issued to someone else")]
    NotYours,
    /// Issued for another sale.
    #[error("the pass is for another sale")]
    OtherSale,
}

impl Error {
    /// True when a dependency could not answer now (Redis or the database
    /// unreachable, busy or locked): the service answers these 503 with
    /// `Retry-After`. A database failure of this kind changed nothing; a
    /// Redis one after a purchase was sent leaves its outcome unknown.
    pub fn is_unavailable(&self) -> bool {
        match self {
            // The table lock's classification, as `db::is_unavailable`'s.
            Error::Database(e) => hasp_sql::is_transient(e),
            Error::TableLock(e) => e.is_retryable(),
            Error::Lock(e) => e.is_retryable(),
            Error::Redis(e) => hasp::Error::Redis(e.clone()).is_retryable(),
            Error::Payment(PaymentError::Unavailable(_)) => true,
            _ => false,
        }
    }

    /// A connection's error from hasp as the service's: Redis's own stays
    /// one (a 503), the rest (a bad URL or TLS setting) are hasp's.
    pub(crate) fn from_connection(e: hasp::Error) -> Self {
        match e {
            hasp::Error::Redis(e) => Error::Redis(e),
            other => Error::Lock(other),
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
