//! Comparing the Redis side of a sale with the database, and repairing
//! what can be repaired safely.
//!
//! With the fast path, for every voucher:
//!
//! * every buyer in Redis has an order in the database that holds their one
//!   order of the voucher (reserved or paid), or one still in the voucher's
//!   stream (on its way), or one given back whose unit Redis has not taken
//!   back yet; and every such database order has its buyer in Redis;
//! * the stock Redis shows is the database's stock minus the orders still
//!   in the stream (the database takes its unit when the pipeline stores it)
//!   minus the units the database took back that Redis has not yet.
//!
//! [`reconcile`] reports each breach. [`repair`] fixes the two that have a
//! safe fix — a database buyer missing from the Redis set is added (else the
//! user could buy twice), and a Redis stock above what the database allows
//! is lowered (else Redis would oversell) — and leaves the rest to a person:
//! a buyer with neither order nor stream entry was accepted and then lost
//! (look in the dead-letter stream), and a Redis stock below the database's
//! only undersells.

use std::collections::HashSet;

use crate::db::{Database, OrderBuyer};
use crate::error::Result;
use crate::store::{add_buyers, lower_stock, read_sale, Redis};

/// The state of one voucher on both sides, and where they disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciliation {
    /// The voucher.
    pub voucher_id: i64,
    /// Stock in Redis (`None`: not loaded).
    pub redis_stock: Option<i64>,
    /// Stock in the database (`None`: no such voucher).
    pub db_stock: Option<i64>,
    /// Buyers recorded in Redis.
    pub redis_buyers: usize,
    /// Orders stored in the database.
    pub db_orders: usize,
    /// Orders accepted and still in the stream.
    pub in_stream: usize,
    /// Those orders: (user id, order id).
    pub in_stream_orders: Vec<(i64, i64)>,
    /// Buyers in Redis with no order in the database nor in the stream.
    pub lost_orders: Vec<i64>,
    /// Users with a database order that Redis does not list as buyers.
    pub missing_buyers: Vec<i64>,
    /// Orders the database gave back whose unit Redis has not taken back
    /// yet (the expiry sweep does it).
    pub pending_returns: Vec<i64>,
    /// What Redis' stock should be: database stock minus the orders in the
    /// stream the database does not have yet, minus the pending returns.
    pub expected_redis_stock: Option<i64>,
}

impl Reconciliation {
    /// True when both sides agree.
    pub fn is_consistent(&self) -> bool {
        self.lost_orders.is_empty()
            && self.missing_buyers.is_empty()
            && self.redis_stock == self.expected_redis_stock
    }

    /// One line per difference, for people.
    pub fn differences(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.redis_stock != self.expected_redis_stock {
            out.push(format!(
                "voucher {}: Redis stock {:?}, expected {:?} (database {:?} minus {} in the stream, minus {} returns Redis has not taken back)",
                self.voucher_id, self.redis_stock, self.expected_redis_stock, self.db_stock, self.in_stream, self.pending_returns.len()
            ));
        }
        for user in &self.lost_orders {
            out.push(format!(
                "voucher {}: user {user} is a buyer in Redis but has no order in the database or the stream",
                self.voucher_id
            ));
        }
        for user in &self.missing_buyers {
            out.push(format!(
                "voucher {}: user {user} has a database order but is not a buyer in Redis",
                self.voucher_id
            ));
        }
        out
    }
}

/// Compares voucher `voucher_id` across Redis and the database. Run it when
/// the sale is quiet: purchases in flight show up as transient differences.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) or
/// [`Error::Database`](crate::Error::Database) if either side fails.
pub async fn reconcile(redis: &Redis, db: &Database, voucher_id: i64) -> Result<Reconciliation> {
    let sale = read_sale(redis, voucher_id).await?;
    // The returns before the stock: one committed between the two reads is
    // then in the stock but not in the list, which can only make the
    // expected stock higher than it is (never lowered below it).
    let taken_back: HashSet<i64> = sale.returned.iter().copied().collect();
    let pending: Vec<OrderBuyer> = db
        .returned_orders(voucher_id)
        .await?
        .into_iter()
        .filter(|o| !taken_back.contains(&o.order_id))
        .collect();
    let db_stock = db.voucher_stock(voucher_id).await?;
    let db_users: HashSet<i64> = db.order_users(voucher_id).await?.into_iter().collect();
    let streamed: HashSet<i64> = sale.in_stream.iter().map(|&(user, _)| user).collect();
    let returning: HashSet<i64> = pending.iter().map(|o| o.user_id).collect();
    let buyers: HashSet<i64> = sale.buyers.into_iter().collect();
    let mut lost_orders: Vec<i64> = buyers
        .iter()
        .filter(|u| !db_users.contains(u) && !streamed.contains(u) && !returning.contains(u))
        .copied()
        .collect();
    lost_orders.sort_unstable();
    let mut missing_buyers: Vec<i64> = db_users.difference(&buyers).copied().collect();
    missing_buyers.sort_unstable();
    // An entry whose order the database already has (stored, not yet
    // acknowledged; paid or given back since, even) took its unit there
    // already.
    let stored: HashSet<i64> = db.order_ids(voucher_id).await?.into_iter().collect();
    let in_flight = sale
        .in_stream
        .iter()
        .filter(|(_, order)| !stored.contains(order))
        .count() as i64;
    Ok(Reconciliation {
        voucher_id,
        redis_stock: sale.stock,
        db_stock,
        redis_buyers: buyers.len(),
        db_orders: db_users.len(),
        in_stream: sale.stream_len,
        in_stream_orders: sale.in_stream,
        lost_orders,
        missing_buyers,
        expected_redis_stock: db_stock.map(|s| s - in_flight - pending.len() as i64),
        pending_returns: pending.into_iter().map(|o| o.order_id).collect(),
    })
}

/// Applies the safe fixes for `found` (see the module docs) and returns how
/// many changes were made.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) if Redis fails.
pub async fn repair(redis: &Redis, found: &Reconciliation) -> Result<usize> {
    let voucher = found.voucher_id;
    let mut changes = add_buyers(redis, voucher, &found.missing_buyers).await?;
    if let (Some(actual), Some(expected)) = (found.redis_stock, found.expected_redis_stock) {
        // Only ever lowered, and only if nobody bought meanwhile.
        if actual > expected && lower_stock(redis, voucher, actual, expected).await? {
            changes += 1;
        }
    }
    Ok(changes)
}
