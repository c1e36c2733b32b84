//! A voucher's orders as lists and counts: what the repair of a lost
//! sale, the reconciliation and the checks read.

use sqlx::Row;

use std::collections::BTreeMap;

use super::{first_column, order_state, Backend, Database};
use crate::domain::money::{Currency, Money};
use crate::domain::order::OrderState;
use crate::error::{Error, Result};

/// An order and its buyer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderBuyer {
    /// The order's id.
    pub order_id: i64,
    /// Its buyer.
    pub user_id: i64,
}

/// An order, its buyer and its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderStateRow {
    /// The order's id.
    pub order_id: i64,
    /// Its buyer.
    pub user_id: i64,
    /// Its state.
    pub state: OrderState,
    /// Whether its unit went back on sale (in the database).
    pub returned: bool,
    /// What its buyer pays.
    pub amount: Money,
}

/// How many of a voucher's orders are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Reserved: bought, not paid yet.
    pub reserved: i64,
    /// Paid.
    pub paid: i64,
    /// Cancelled by their buyers.
    pub cancelled: i64,
    /// Expired unpaid.
    pub expired: i64,
    /// Paid, then redeemed at the shop.
    pub used: i64,
    /// Paid, refund under way.
    pub refunding: i64,
    /// Paid, then refunded.
    pub refunded: i64,
    /// Of the refunded, those whose unit went back on sale.
    pub refunded_returned: i64,
    /// Orders that hold their buyer's one order of the voucher (see
    /// [`Database::order_users`]), counted by the same statement as the
    /// states, so the two agree even while orders change.
    pub claims: i64,
}

impl StateCounts {
    /// Orders that hold a unit of the stock: every order but those whose
    /// unit went back on sale (cancelled, expired, and refunded ones the
    /// voucher took back). The stock a sale began with is the database's
    /// available stock plus these.
    pub fn holding_units(&self) -> i64 {
        self.reserved + self.paid + self.used + self.refunding + self.refunded
            - self.refunded_returned
    }

    /// Orders whose unit went back on sale.
    pub fn returned(&self) -> i64 {
        self.cancelled + self.expired + self.refunded_returned
    }
}

impl Database {
    /// Users whose order holds their one order of voucher `id` (reserved or
    /// paid; given back too when the voucher does not let them buy again):
    /// the buyers Redis must know.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_users(&self, voucher_id: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(self.sql(
            "SELECT claim_user_id FROM voucher_order \
             WHERE voucher_id = ? AND claim_user_id IS NOT NULL",
        ))
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await?;
        first_column(&rows)
    }

    /// Ids of the orders stored for voucher `id`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_ids(&self, voucher_id: i64) -> Result<Vec<i64>> {
        let rows = sqlx::query(self.sql("SELECT id FROM voucher_order WHERE voucher_id = ?"))
            .bind(voucher_id)
            .fetch_all(&self.pool)
            .await?;
        first_column(&rows)
    }

    /// The orders of voucher `id` that hold their buyer's one order of it
    /// (see [`Database::order_users`]).
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_orders(&self, voucher_id: i64) -> Result<Vec<OrderBuyer>> {
        self.pairs(
            "SELECT id, user_id FROM voucher_order \
             WHERE voucher_id = ? AND claim_user_id IS NOT NULL",
            voucher_id,
        )
        .await
    }

    /// Every stored order of voucher `id`, with its buyer and state.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_order_states(&self, voucher_id: i64) -> Result<Vec<OrderStateRow>> {
        let rows = sqlx::query(self.sql(
            "SELECT id, user_id, state, returned_ms, amount_minor, currency \
                 FROM voucher_order WHERE voucher_id = ?",
        ))
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(OrderStateRow {
                    order_id: r.try_get(0)?,
                    user_id: r.try_get(1)?,
                    state: order_state(&r.try_get::<String, _>(2)?)?,
                    returned: r.try_get::<Option<i64>, _>(3)?.is_some(),
                    amount: Money::from_stored(r.try_get(4)?, &r.try_get::<String, _>(5)?)?,
                })
            })
            .collect()
    }

    /// The orders of voucher `id` whose unit went back on sale (cancelled,
    /// expired, or refunded while the voucher takes refunded units back).
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn returned_orders(&self, voucher_id: i64) -> Result<Vec<OrderBuyer>> {
        self.pairs(
            "SELECT id, user_id FROM voucher_order \
             WHERE voucher_id = ? AND returned_ms IS NOT NULL",
            voucher_id,
        )
        .await
    }

    /// The orders and buyers `query` selects (`id, user_id`; one `?`: `id`).
    async fn pairs(&self, query: &'static str, id: i64) -> Result<Vec<OrderBuyer>> {
        let rows = sqlx::query(self.sql(query))
            .bind(id)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(OrderBuyer {
                    order_id: r.try_get(0)?,
                    user_id: r.try_get(1)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::from)
    }

    /// Number of orders stored for voucher `id`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_count(&self, voucher_id: i64) -> Result<i64> {
        let row = sqlx::query(self.sql("SELECT COUNT(*) FROM voucher_order WHERE voucher_id = ?"))
            .bind(voucher_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// What voucher `id`'s paid and used orders add up to, per currency:
    /// the money the provider must have kept for it.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn revenue(&self, voucher_id: i64) -> Result<BTreeMap<Currency, i64>> {
        // A SUM of BIGINT is NUMERIC on PostgreSQL and DECIMAL on MariaDB,
        // which the `Any` driver cannot read: cast back to a 64-bit integer.
        let query = match self.backend {
            Backend::Sqlite => {
                "SELECT currency, SUM(amount_minor) FROM voucher_order \
                 WHERE voucher_id = ? AND state IN ('paid', 'used') GROUP BY currency"
            }
            Backend::Postgres => {
                "SELECT currency, CAST(SUM(amount_minor) AS BIGINT) FROM voucher_order \
                 WHERE voucher_id = ? AND state IN ('paid', 'used') GROUP BY currency"
            }
            Backend::MySql => {
                "SELECT currency, CAST(SUM(amount_minor) AS SIGNED) FROM voucher_order \
                 WHERE voucher_id = ? AND state IN ('paid', 'used') GROUP BY currency"
            }
        };
        let rows = sqlx::query(self.sql(query))
            .bind(voucher_id)
            .fetch_all(&self.pool)
            .await?;
        let mut sums = BTreeMap::new();
        for row in &rows {
            let currency = Currency::from_stored(&row.try_get::<String, _>(0)?)?;
            sums.insert(currency, row.try_get::<i64, _>(1)?);
        }
        Ok(sums)
    }

    /// How many orders of voucher `id` are in each state.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_states(&self, voucher_id: i64) -> Result<StateCounts> {
        let rows = sqlx::query(self.sql(
            "SELECT state, COUNT(*), COUNT(returned_ms), COUNT(claim_user_id) \
                 FROM voucher_order WHERE voucher_id = ? GROUP BY state",
        ))
        .bind(voucher_id)
        .fetch_all(&self.pool)
        .await?;
        let mut counts = StateCounts::default();
        for row in &rows {
            let n: i64 = row.try_get(1)?;
            counts.claims += row.try_get::<i64, _>(3)?;
            match order_state(&row.try_get::<String, _>(0)?)? {
                OrderState::Reserved => counts.reserved = n,
                OrderState::Paid => counts.paid = n,
                OrderState::Cancelled => counts.cancelled = n,
                OrderState::Expired => counts.expired = n,
                OrderState::Used => counts.used = n,
                OrderState::Refunding => counts.refunding = n,
                OrderState::Refunded => {
                    counts.refunded = n;
                    counts.refunded_returned = row.try_get(2)?;
                }
                // Not a stored state: an order not stored yet, or refused.
                OrderState::Pending | OrderState::Failed => {}
            }
        }
        Ok(counts)
    }
}
