//! What a purchase comes to, whichever path decided it (the Redis fast
//! path or the locked database path).

use crate::domain::order_id::OrderId;

/// Why a purchase was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The sale has not begun.
    NotStarted,
    /// The sale is over.
    Ended,
    /// No stock left.
    SoldOut,
    /// This user already has an order for this voucher.
    AlreadyBought,
    /// No such voucher is on sale.
    UnknownVoucher,
    /// Another purchase of this user is being decided (the locked path's
    /// per-user lock stayed busy for its whole wait); nothing changed.
    InProgress,
    /// A waiting room stands in front of the sale and the buyer showed no
    /// valid pass.
    PassRequired,
}

/// The outcome of a purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purchase {
    /// Accepted: the order is in the voucher's stream under this id.
    Accepted(OrderId),
    /// Refused; nothing changed.
    Refused(Refusal),
}
