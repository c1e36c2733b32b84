//! An order: as the pipeline stores it, and where it stands.

use serde::Serialize;

use crate::domain::money::Money;
use crate::domain::order_id::OrderId;

/// An order as the pipeline writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderRecord {
    /// The global order id minted at purchase.
    pub id: OrderId,
    /// The buyer.
    pub user_id: i64,
    /// The voucher bought.
    pub voucher_id: i64,
    /// When Redis accepted it (Unix milliseconds).
    pub created_ms: i64,
}

/// Where an accepted order stands.
///
/// An accepted order is first an entry in its voucher's stream (pending),
/// then a database row that reserves its unit (reserved), or, if the
/// pipeline gave up on it, an entry in the dead-letter stream (failed). A
/// reserved order is then paid, cancelled by its buyer, or expired at its
/// payment deadline, once and for good: the database row's state decides,
/// by one conditional update. A cancelled or expired order gave its unit
/// back to the sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    /// Accepted, on its way to the database.
    Pending,
    /// Stored; its unit is reserved until it is paid or its deadline passes.
    Reserved,
    /// Paid: the sale is complete.
    Paid,
    /// Cancelled by its buyer before payment; its unit went back.
    Cancelled,
    /// Not paid by its deadline; its unit went back.
    Expired,
    /// The pipeline gave up on it (see the dead-letter stream).
    Failed,
}

impl OrderState {
    /// The state as the database stores it (a stored order's only).
    pub fn as_stored(self) -> &'static str {
        match self {
            OrderState::Reserved => "reserved",
            OrderState::Paid => "paid",
            OrderState::Cancelled => "cancelled",
            OrderState::Expired => "expired",
            OrderState::Pending => "pending",
            OrderState::Failed => "failed",
        }
    }

    /// A stored state read back (`None`: not one the database stores).
    pub fn from_stored(text: &str) -> Option<Self> {
        Some(match text {
            "reserved" => OrderState::Reserved,
            "paid" => OrderState::Paid,
            "cancelled" => OrderState::Cancelled,
            "expired" => OrderState::Expired,
            _ => return None,
        })
    }

    /// Whether the order gave its unit back (cancelled or expired).
    pub fn gave_back(self) -> bool {
        matches!(self, OrderState::Cancelled | OrderState::Expired)
    }
}

/// A stored order and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOrder {
    /// The order.
    pub record: OrderRecord,
    /// Reserved, paid, cancelled or expired.
    pub state: OrderState,
    /// The payment deadline (Unix ms).
    pub pay_by_ms: i64,
    /// When it was paid (Unix ms).
    pub paid_ms: Option<i64>,
    /// When it was cancelled or expired (Unix ms).
    pub closed_ms: Option<i64>,
    /// What its buyer pays: its voucher's price when it was stored.
    pub amount: Money,
}
