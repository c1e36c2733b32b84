//! An order's life after it is stored: payment, cancellation and expiry;
//! then redemption or refund. Each is one conditional update decided by
//! the order's row.

use sqlx::Row;

use super::orders::stored_order;
use super::{Database, StoredOrder, SERIALIZATION_RETRIES};
use crate::domain::order::OrderState;
use crate::error::{Error, Result};

/// What asking a stored order to change found. Only a reserved order
/// changes, by one conditional update: the row's state decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// Done now; the order as it is after.
    Done(StoredOrder),
    /// The same change was made before (a repeat): nothing changed.
    Already(StoredOrder),
    /// The order's state forbids it (paid, given back, or past its
    /// deadline): nothing changed.
    Refused(StoredOrder),
    /// No stored order of that id (for that buyer).
    NotFound,
    /// Asked of the payment provider, whose callback decides; the order as
    /// it stands meanwhile (reserved with its payment under way, or
    /// refunding).
    Pending(StoredOrder),
}

/// The client's keys an order's row keeps: of its payment and its refund.
struct Keys {
    pay: Option<String>,
    refund: Option<String>,
}

/// Why a reserved order gives its unit back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBack {
    /// Its buyer cancelled it (at any time before payment).
    Cancel,
    /// Its payment deadline passed (by the database's clock).
    Expire,
}

/// A stored order that gave its unit back: what the Redis side needs to
/// take the unit back too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Returned {
    /// The order.
    pub order_id: i64,
    /// Its buyer.
    pub user_id: i64,
    /// Its voucher.
    pub voucher_id: i64,
    /// Whether the buyer may buy again (their claim was released).
    pub rebuy: bool,
}

impl Database {
    /// Marks reserved order `id` of `user_id` paid with the payment of
    /// client key `key` (the provider's charge `reference`), if its
    /// deadline has not passed by the database's clock, and gives it the
    /// redemption code `code`. Paying again with the same key is
    /// [`Transition::Already`] (whatever happened to the order since);
    /// with another key, or an order given back or past its deadline,
    /// [`Transition::Refused`].
    ///
    /// # Errors
    /// [`Error::Database`] on failure (then nothing changed, or the
    /// outcome is unknown if the commit's answer was lost: asking again
    /// with the same key tells).
    pub async fn pay_order(
        &self,
        id: i64,
        user_id: i64,
        key: &str,
        reference: &str,
        code: &str,
    ) -> Result<Transition> {
        let paid = sqlx::query(self.sql(
            "UPDATE voucher_order SET state = 'paid', paid_ms = NOW_MS, pay_key = ?, \
             pay_reference = ?, redeem_code = ?, due_ms = NULL \
             WHERE id = ? AND user_id = ? AND state = 'reserved' AND pay_by_ms > NOW_MS",
        ))
        .bind(key)
        .bind(reference)
        .bind(code)
        .bind(id)
        .bind(user_id)
        .execute(&self.pool)
        .await?;
        let Some((order, keys)) = self.order_with_keys(id, user_id).await? else {
            return Ok(Transition::NotFound);
        };
        Ok(match order.state {
            OrderState::Paid if paid.rows_affected() == 1 => Transition::Done(order),
            _ if order.paid_ms.is_some() && keys.pay.as_deref() == Some(key) => {
                Transition::Already(order)
            }
            _ => Transition::Refused(order),
        })
    }

    /// Order `id` of `user_id` and the keys of its payment and refund.
    async fn order_with_keys(&self, id: i64, user_id: i64) -> Result<Option<(StoredOrder, Keys)>> {
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            ", pay_key, refund_key FROM voucher_order WHERE id = ? AND user_id = ?"
        )))
        .bind(id)
        .bind(user_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let keys = Keys {
                pay: r.try_get(15)?,
                refund: r.try_get(16)?,
            };
            Ok((stored_order(&r)?, keys))
        })
        .transpose()
    }

    /// Asks for a refund of paid order `id` of `user_id` with the client's
    /// key `key`: the order becomes refunding (due for the sweep, which
    /// finishes a refund a crash left half done) until
    /// [`Database::finish_refund`]. Asking again with the same key is
    /// [`Transition::Already`]; a used order, or one not paid, is
    /// [`Transition::Refused`]. Also answers what the provider's refund
    /// names: the charge's reference.
    ///
    /// # Errors
    /// [`Error::Database`] on failure (the order's state tells whether the
    /// change committed).
    pub async fn start_refund(
        &self,
        id: i64,
        user_id: i64,
        key: &str,
    ) -> Result<(Transition, Option<String>)> {
        let started = sqlx::query(self.sql(
            "UPDATE voucher_order SET state = 'refunding', refund_key = ?, due_ms = NOW_MS \
             WHERE id = ? AND user_id = ? AND state = 'paid'",
        ))
        .bind(key)
        .bind(id)
        .bind(user_id)
        .execute(&self.pool)
        .await?;
        let Some((order, keys)) = self.order_with_keys(id, user_id).await? else {
            return Ok((Transition::NotFound, None));
        };
        let outcome = match order.state {
            OrderState::Refunding if started.rows_affected() == 1 => Transition::Done(order),
            OrderState::Refunding | OrderState::Refunded if keys.refund.as_deref() == Some(key) => {
                Transition::Already(order)
            }
            _ => Transition::Refused(order),
        };
        let reference = match &outcome {
            Transition::Done(order)
            | Transition::Already(order)
            | Transition::Refused(order)
            | Transition::Pending(order) => order.pay_reference.clone(),
            Transition::NotFound => None,
        };
        Ok((outcome, reference))
    }

    /// What the provider's refund of refunding order `id` needs (its
    /// charge's reference and the client's key), for the sweep.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn refund_keys(&self, id: i64) -> Result<Option<(Option<String>, String)>> {
        let row = sqlx::query(self.sql(
            "SELECT pay_reference, refund_key FROM voucher_order \
             WHERE id = ? AND state = 'refunding'",
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let key: Option<String> = row.try_get(1)?;
        Ok(key
            .map(|key| row.try_get(0).map(|reference| (reference, key)))
            .transpose()?)
    }

    /// Records that the provider refunded refunding order `id`: it becomes
    /// refunded, and, if its voucher takes refunded units back and its sale
    /// has not ended (by the database's clock), its unit goes back on sale
    /// as a cancelled order's does, in the same transaction.
    ///
    /// # Errors
    /// [`Error::Database`] on failure (the order's state tells whether the
    /// change committed).
    pub async fn finish_refund(&self, id: i64) -> Result<(Transition, Option<Returned>)> {
        let row = sqlx::query(self.sql(
            "SELECT o.voucher_id, o.user_id, v.rebuy_after_cancel, \
             CASE WHEN v.refund_restock = 'while_open' AND v.end_ms > NOW_MS THEN 1 ELSE 0 END \
             FROM voucher_order o JOIN seckill_voucher v ON v.id = o.voucher_id WHERE o.id = ?",
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok((Transition::NotFound, None));
        };
        let (voucher_id, buyer, rebuy, restock): (i64, i64, i64, i64) = (
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
        );
        let restock = restock == 1;
        let mut tx = self.pool.begin().await?;
        let changed = if restock {
            sqlx::query(self.sql(
                "UPDATE voucher_order SET state = 'refunded', refunded_ms = NOW_MS, \
                 closed_ms = NOW_MS, returned_ms = NOW_MS, due_ms = NOW_MS, \
                 claim_user_id = CASE WHEN ? = 1 THEN NULL ELSE claim_user_id END \
                 WHERE id = ? AND state = 'refunding'",
            ))
            .bind(rebuy)
            .bind(id)
            .execute(&mut *tx)
            .await?
        } else {
            sqlx::query(self.sql(
                "UPDATE voucher_order SET state = 'refunded', refunded_ms = NOW_MS, \
                 closed_ms = NOW_MS, due_ms = NULL WHERE id = ? AND state = 'refunding'",
            ))
            .bind(id)
            .execute(&mut *tx)
            .await?
        };
        if changed.rows_affected() == 1 && restock {
            sqlx::query(self.sql("UPDATE seckill_voucher SET stock = stock + 1 WHERE id = ?"))
                .bind(voucher_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        let order = self
            .order(id)
            .await?
            .ok_or_else(|| Error::Protocol(format!("order {id} vanished")))?;
        let returned = (changed.rows_affected() == 1 && restock).then_some(Returned {
            order_id: id,
            user_id: buyer,
            voucher_id,
            rebuy: rebuy == 1,
        });
        Ok(match order.state {
            OrderState::Refunded if changed.rows_affected() == 1 => {
                (Transition::Done(order), returned)
            }
            OrderState::Refunded => (Transition::Already(order), None),
            _ => (Transition::Refused(order), None),
        })
    }

    /// Puts refunding order `id` back to paid: the provider declined the
    /// refund.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn abandon_refund(&self, id: i64) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE voucher_order SET state = 'paid', refund_key = NULL, due_ms = NULL \
             WHERE id = ? AND state = 'refunding'",
        ))
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Redeems the paid order whose redemption code is `code`: it becomes
    /// used, once. A code already used, or of an order being refunded or
    /// refunded, is [`Transition::Refused`]; an unknown code
    /// [`Transition::NotFound`].
    ///
    /// # Errors
    /// [`Error::Database`] on failure (the order's state tells whether the
    /// change committed).
    pub async fn redeem(&self, code: &str) -> Result<Transition> {
        let used = sqlx::query(self.sql(
            "UPDATE voucher_order SET state = 'used', used_ms = NOW_MS \
             WHERE redeem_code = ? AND state = 'paid'",
        ))
        .bind(code)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE redeem_code = ?"
        )))
        .bind(code)
        .fetch_optional(&self.pool)
        .await?;
        let Some(order) = row.as_ref().map(stored_order).transpose()? else {
            return Ok(Transition::NotFound);
        };
        Ok(match order.state {
            OrderState::Used if used.rows_affected() == 1 => Transition::Done(order),
            _ => Transition::Refused(order),
        })
    }

    /// Gives back reserved order `id`'s unit, in one transaction: the order
    /// becomes cancelled (`why`: [`GiveBack::Cancel`], only by its buyer
    /// `user_id`) or expired ([`GiveBack::Expire`], only once its deadline
    /// passed by the database's clock), the voucher's stock rises by one,
    /// and the buyer's claim is released if the voucher lets them buy
    /// again. The order stays due for the sweep until
    /// [`Database::finish_return`] says Redis has the unit back too.
    ///
    /// # Errors
    /// [`Error::Database`] on failure (then nothing changed, or the
    /// outcome is unknown if the commit's answer was lost: the order's
    /// state tells).
    pub async fn give_back(
        &self,
        id: i64,
        user_id: Option<i64>,
        why: GiveBack,
    ) -> Result<(Transition, Option<Returned>)> {
        let mut attempt = 1;
        loop {
            match self.try_give_back(id, user_id, why).await {
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

    async fn try_give_back(
        &self,
        id: i64,
        user_id: Option<i64>,
        why: GiveBack,
    ) -> Result<(Transition, Option<Returned>)> {
        // An order's voucher, buyer and the voucher's rebuy rule never
        // change: read before the transaction, whose first statement then
        // writes. (On SQLite a transaction that reads first cannot wait for
        // the write lock: it fails at once when another writer holds it.)
        let row = sqlx::query(self.sql(
            "SELECT o.voucher_id, o.user_id, v.rebuy_after_cancel \
             FROM voucher_order o JOIN seckill_voucher v ON v.id = o.voucher_id WHERE o.id = ?",
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else {
            return Ok((Transition::NotFound, None));
        };
        let (voucher_id, buyer, rebuy): (i64, i64, i64) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        if user_id.is_some_and(|user| user != buyer) {
            return Ok((Transition::NotFound, None));
        }
        let (state, query) = match why {
            GiveBack::Cancel => (
                OrderState::Cancelled,
                self.sql(
                    "UPDATE voucher_order SET state = 'cancelled', closed_ms = NOW_MS, \
                     returned_ms = NOW_MS, due_ms = NOW_MS, claim_user_id = CASE WHEN ? = 1 THEN NULL ELSE claim_user_id END \
                     WHERE id = ? AND state = 'reserved'",
                ),
            ),
            GiveBack::Expire => (
                OrderState::Expired,
                self.sql(
                    "UPDATE voucher_order SET state = 'expired', closed_ms = NOW_MS, \
                     returned_ms = NOW_MS, due_ms = NOW_MS, claim_user_id = CASE WHEN ? = 1 THEN NULL ELSE claim_user_id END \
                     WHERE id = ? AND state = 'reserved' AND pay_by_ms <= NOW_MS",
                ),
            ),
        };
        let mut tx = self.pool.begin().await?;
        let changed = sqlx::query(query)
            .bind(rebuy)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        if changed.rows_affected() == 1 {
            sqlx::query(self.sql("UPDATE seckill_voucher SET stock = stock + 1 WHERE id = ?"))
                .bind(voucher_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        } else {
            drop(tx);
        }
        let order = self
            .order(id)
            .await?
            .ok_or_else(|| Error::Protocol(format!("order {id} vanished")))?;
        let returned = Returned {
            order_id: id,
            user_id: buyer,
            voucher_id,
            rebuy: rebuy == 1,
        };
        Ok(match order.state {
            s if s == state && changed.rows_affected() == 1 => {
                (Transition::Done(order), Some(returned))
            }
            s if s == state => (Transition::Already(order), None),
            _ => (Transition::Refused(order), None),
        })
    }

    /// Leaves refunding order `id` to the provider's callback: due for the
    /// sweep again only after `later` (it then asks the provider again, by
    /// the same key, in case the callback was lost).
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn refund_asked(&self, id: i64, later: std::time::Duration) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE voucher_order SET due_ms = NOW_MS + ? WHERE id = ? AND state = 'refunding'",
        ))
        .bind(later.as_millis() as i64)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Orders the expiry sweep must look at now (by the database's clock),
    /// the most overdue first, at most `limit`: reserved orders past their
    /// deadline, refunds not finished, and orders whose unit went back on
    /// sale in the database but not in Redis yet. One range read of an index: orders not due cost nothing.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn due_orders(&self, limit: i64) -> Result<Vec<StoredOrder>> {
        let rows = sqlx::query(self.sql(concat!(
            "SELECT ",
            order_columns!(),
            " FROM voucher_order WHERE due_ms <= NOW_MS ORDER BY due_ms LIMIT ?"
        )))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stored_order).collect()
    }

    /// Records that Redis has returned order `id`'s unit too: the order
    /// is no longer due.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn finish_return(&self, id: i64) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE voucher_order SET due_ms = NULL \
             WHERE id = ? AND returned_ms IS NOT NULL",
        ))
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
