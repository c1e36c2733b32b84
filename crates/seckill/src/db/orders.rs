//! Storing the pipeline's orders, each with its unit of stock, and reading
//! one order back.

use std::collections::HashSet;

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row};

use super::{
    first_column, order_state, Backend, Database, OrderRecord, StoredOrder, SERIALIZATION_RETRIES,
};
use crate::domain::money::Money;
use crate::error::{Error, Result};

/// What [`Database::record_order`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The order is new: inserted, stock decremented, committed.
    Created,
    /// This order id is already stored (a re-delivery): nothing changed.
    AlreadyStored,
    /// The user already has another order for this voucher: nothing changed.
    UserAlreadyOrdered,
    /// The voucher has no stock left in the database: nothing changed.
    OutOfStock,
    /// No such voucher in the database: nothing changed.
    UnknownVoucher,
}

impl Database {
    /// `user_id`'s latest stored order of voucher `voucher_id`, whatever its
    /// state.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order_of(&self, user_id: i64, voucher_id: i64) -> Result<Option<StoredOrder>> {
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE user_id = ? AND voucher_id = ? ORDER BY id DESC LIMIT 1"
        )))
        .bind(user_id)
        .bind(voucher_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(stored_order).transpose()
    }

    /// Stored order `id`, if any.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn order(&self, id: i64) -> Result<Option<StoredOrder>> {
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE id = ?"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(stored_order).transpose()
    }

    /// The stored orders of `user_id`, newest first, at most 100.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn orders_of(&self, user_id: i64) -> Result<Vec<StoredOrder>> {
        let rows = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE user_id = ? ORDER BY id DESC LIMIT 100"
        )))
        .bind(user_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stored_order).collect()
    }

    /// Stores `order` and takes its unit of stock, in one transaction, or
    /// changes nothing. Safe to repeat: a re-delivered order is recognised
    /// by its id.
    ///
    /// # Errors
    /// [`Error::Database`] for failures other than the outcomes in
    /// [`Recorded`] (then nothing was committed; retrying is safe).
    pub async fn record_order(&self, order: &OrderRecord) -> Result<Recorded> {
        let mut attempt = 1;
        loop {
            match self.try_record_order(order).await {
                Err(Error::Database(sqlx::Error::Database(e)))
                    if attempt < SERIALIZATION_RETRIES
                        && matches!(e.code().as_deref(), Some("40001" | "40P01")) =>
                {
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// Stores several orders with one commit when all of them can be
    /// stored, which is the pipeline's usual case (Redis already decided):
    /// one transaction, one flush to disk, instead of one per order. If any
    /// order is refused or the transaction fails, nothing of it is kept and
    /// each order is recorded on its own ([`Database::record_order`]), so
    /// every element is exactly what `record_order` would have returned.
    ///
    /// # Errors
    /// Per order, as [`Database::record_order`].
    pub async fn record_orders(&self, orders: &[OrderRecord]) -> Vec<Result<Recorded>> {
        if orders.len() > 1 {
            if let Ok(true) = self.try_record_all(orders).await {
                return orders.iter().map(|_| Ok(Recorded::Created)).collect();
            }
            // Re-deliveries mixed with new orders (a take-over, a consumer
            // that died after its commit) need not cost one commit each:
            // the stored ones are set apart and the rest tried together.
            let ids: Vec<i64> = orders.iter().map(|o| o.id.as_i64()).collect();
            if let Ok(stored) = self.stored_among(&ids).await {
                let new: Vec<OrderRecord> = orders
                    .iter()
                    .filter(|o| !stored.contains(&o.id.as_i64()))
                    .copied()
                    .collect();
                if !stored.is_empty() && matches!(self.try_record_all(&new).await, Ok(true)) {
                    return orders
                        .iter()
                        .map(|o| {
                            Ok(if stored.contains(&o.id.as_i64()) {
                                Recorded::AlreadyStored
                            } else {
                                Recorded::Created
                            })
                        })
                        .collect();
                }
            }
        }
        let mut outcomes = Vec::with_capacity(orders.len());
        for order in orders {
            outcomes.push(self.record_order(order).await);
        }
        outcomes
    }

    /// Which of the order ids `ids` are stored.
    async fn stored_among(&self, ids: &[i64]) -> Result<HashSet<i64>> {
        let mut stored = HashSet::new();
        for chunk in ids.chunks(500) {
            let list: Vec<String> = (1..=chunk.len())
                .map(|n| match self.backend {
                    Backend::Postgres => format!("${n}"),
                    _ => "?".to_owned(),
                })
                .collect();
            let query = format!(
                "SELECT id FROM voucher_order WHERE id IN ({})",
                list.join(",")
            );
            let mut select = sqlx::query(AssertSqlSafe(query));
            for id in chunk {
                select = select.bind(*id);
            }
            let rows = select.fetch_all(&self.pool).await?;
            stored.extend(first_column(&rows)?);
        }
        Ok(stored)
    }

    /// All of `orders` in one transaction: `Ok(true)` if committed,
    /// `Ok(false)` (nothing kept) as soon as one would be refused.
    async fn try_record_all(&self, orders: &[OrderRecord]) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        for order in orders {
            if !self.take_and_insert(&mut tx, order).await? {
                return Ok(false); // dropping `tx` rolls back
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn try_record_order(&self, order: &OrderRecord) -> Result<Recorded> {
        let mut tx = self.pool.begin().await?;
        if self.take_and_insert(&mut tx, order).await? {
            tx.commit().await?;
            Ok(Recorded::Created)
        } else {
            drop(tx); // rolls the decrement back
            self.classify_refusal(order).await
        }
    }

    /// In `tx`: takes a unit of the voucher's stock and inserts `order`.
    /// `Ok(false)` if there was no stock or a unique key refused the order
    /// (the caller rolls back and finds out which).
    async fn take_and_insert(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        order: &OrderRecord,
    ) -> Result<bool> {
        // Take the voucher row's exclusive lock first. Inserting the order
        // first would take a shared lock on it (the foreign key) and then
        // need to upgrade it: two buyers doing that deadlock on InnoDB.
        let taken = sqlx::query(
            self.sql("UPDATE seckill_voucher SET stock = stock - 1 WHERE id = ? AND stock > 0"),
        )
        .bind(order.voucher_id)
        .execute(&mut **tx)
        .await?;
        if taken.rows_affected() == 0 {
            return Ok(false);
        }
        // Reserved until paid: due for the expiry sweep at its deadline,
        // the voucher's payment window after the purchase. Its amount is
        // the voucher's price, which never changes once published.
        let inserted = sqlx::query(self.sql(
            "INSERT INTO voucher_order \
             (id, user_id, voucher_id, created_ms, state, pay_by_ms, due_ms, claim_user_id, \
              amount_minor, currency) \
             SELECT ?, ?, id, ?, 'reserved', ? + pay_within_ms, ? + pay_within_ms, ?, \
              price_minor, currency \
             FROM seckill_voucher WHERE id = ?",
        ))
        .bind(order.id.as_i64())
        .bind(order.user_id)
        .bind(order.created_ms)
        .bind(order.created_ms)
        .bind(order.created_ms)
        .bind(order.user_id)
        .bind(order.voucher_id)
        .execute(&mut **tx)
        .await;
        match inserted {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            other => {
                other?;
                Ok(true)
            }
        }
    }

    /// Why `order` could not be stored (after a rolled-back attempt).
    async fn classify_refusal(&self, order: &OrderRecord) -> Result<Recorded> {
        let same_id = sqlx::query(self.sql("SELECT 1 FROM voucher_order WHERE id = ?"))
            .bind(order.id.as_i64())
            .fetch_optional(&self.pool)
            .await?;
        if same_id.is_some() {
            return Ok(Recorded::AlreadyStored);
        }
        let claimed = sqlx::query(
            self.sql("SELECT 1 FROM voucher_order WHERE voucher_id = ? AND claim_user_id = ?"),
        )
        .bind(order.voucher_id)
        .bind(order.user_id)
        .fetch_optional(&self.pool)
        .await?;
        if claimed.is_some() {
            return Ok(Recorded::UserAlreadyOrdered);
        }
        Ok(match self.voucher_stock(order.voucher_id).await? {
            Some(_) => Recorded::OutOfStock,
            None => Recorded::UnknownVoucher,
        })
    }
}

/// The `StoredOrder` of a `SELECT` of [`order_columns`].
pub(super) fn stored_order(r: &AnyRow) -> Result<StoredOrder> {
    let state: String = r.try_get(4)?;
    Ok(StoredOrder {
        record: OrderRecord {
            id: crate::OrderId::from_i64(r.try_get(0)?)?,
            user_id: r.try_get(1)?,
            voucher_id: r.try_get(2)?,
            created_ms: r.try_get(3)?,
        },
        state: order_state(&state)?,
        pay_by_ms: r.try_get(5)?,
        paid_ms: r.try_get(6)?,
        closed_ms: r.try_get(7)?,
        amount: Money::from_stored(r.try_get(8)?, &r.try_get::<String, _>(9)?)?,
        redeem_code: r.try_get(10)?,
        used_ms: r.try_get(11)?,
        refunded_ms: r.try_get(12)?,
        returned: r.try_get::<Option<i64>, _>(13)?.is_some(),
        pay_reference: r.try_get(14)?,
    })
}
