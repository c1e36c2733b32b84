//! An order: as the pipeline stores it, and where it stands.

use serde::Serialize;

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
/// then a database row (created), or, if the pipeline gave up on it, an
/// entry in the dead-letter stream (failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    /// Accepted, on its way to the database.
    Pending,
    /// Stored in the database.
    Created,
    /// The pipeline gave up on it (see the dead-letter stream).
    Failed,
}
