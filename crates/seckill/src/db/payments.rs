//! Payments a provider confirms by callback: a payment under way on a
//! reserved order and its charge's reference, its confirmation or refusal,
//! and the record of every callback, each applied once.

use sqlx::Row;

use super::{Database, Transition};
use crate::domain::now_ms;
use crate::domain::order::OrderState;
use crate::error::{Error, Result};
use crate::payments::events::{Event, EventKind};

/// What beginning a payment confirmed by callback found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentStart {
    /// Under way with this key (now, or before): ask the provider; its
    /// callback decides.
    Started(crate::db::StoredOrder),
    /// Another payment of the order is under way (another key).
    Busy(crate::db::StoredOrder),
    /// Otherwise, as a synchronous payment would answer.
    Other(Transition),
}

/// What the service did with a provider's callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventOutcome {
    /// The order is paid.
    Paid,
    /// The charge was declined; the buyer may pay again.
    Declined,
    /// The order is refunded.
    Refunded,
    /// The refund was declined; the order is paid again.
    RefundDeclined,
    /// The order could not be paid (expired, cancelled, or paid by another
    /// charge): the charge is to be voided.
    Voided,
    /// Refused: not the order's amount (the charge is to be voided).
    AmountMismatch,
    /// No such order.
    UnknownOrder,
    /// Applied before (the same event id, or the order already there).
    Duplicate,
}

impl EventOutcome {
    /// As the record stores it.
    pub fn as_stored(self) -> &'static str {
        match self {
            EventOutcome::Paid => "paid",
            EventOutcome::Declined => "declined",
            EventOutcome::Refunded => "refunded",
            EventOutcome::RefundDeclined => "refund_declined",
            EventOutcome::Voided => "voided",
            EventOutcome::AmountMismatch => "amount_mismatch",
            EventOutcome::UnknownOrder => "unknown_order",
            EventOutcome::Duplicate => "duplicate",
        }
    }
}

impl Database {
    /// Records on reserved order `id` of `user_id` that a payment of the
    /// client's key `key` is under way, before the provider is asked (its
    /// callback may come before its answer), if the order's deadline has
    /// not passed and no payment of another key is under way.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn begin_payment(&self, id: i64, user_id: i64, key: &str) -> Result<PaymentStart> {
        let started = sqlx::query(self.sql(
            "UPDATE voucher_order SET pay_key = ? \
             WHERE id = ? AND user_id = ? AND state = 'reserved' AND pay_by_ms > NOW_MS \
             AND (pay_key IS NULL OR pay_key = ?)",
        ))
        .bind(key)
        .bind(id)
        .bind(user_id)
        .bind(key)
        .execute(&self.pool)
        .await?;
        let Some(order) = self
            .order(id)
            .await?
            .filter(|o| o.record.user_id == user_id)
        else {
            return Ok(PaymentStart::Other(Transition::NotFound));
        };
        if order.state == OrderState::Reserved && started.rows_affected() == 1 {
            return Ok(PaymentStart::Started(order));
        }
        // Still reserved: past its deadline (the sweep has not expired it
        // yet), or another key's payment is under way.
        let row = sqlx::query(self.sql(
            "SELECT CASE WHEN pay_by_ms > NOW_MS THEN 1 ELSE 0 END FROM voucher_order WHERE id = ?",
        ))
        .bind(id)
        .fetch_one(&self.pool)
        .await?;
        let in_time = row.try_get::<i64, _>(0)? == 1;
        Ok(match order.state {
            OrderState::Reserved if in_time => PaymentStart::Busy(order),
            _ => PaymentStart::Other(Transition::Refused(order)),
        })
    }

    /// Records the provider's reference `reference` of the charge of key
    /// `key` on reserved order `id` (what a void names if the order is
    /// given back before the callback comes), unless the callback recorded
    /// it first.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn note_reference(&self, id: i64, key: &str, reference: &str) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE voucher_order SET pay_reference = ? \
             WHERE id = ? AND pay_key = ? AND pay_reference IS NULL",
        ))
        .bind(reference)
        .bind(id)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Forgets the payment of key `key` on reserved order `id`: the
    /// provider declined it at once, and the buyer may pay with another
    /// key.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn abandon_payment(&self, id: i64, key: &str) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE voucher_order SET pay_key = NULL, pay_reference = NULL \
             WHERE id = ? AND pay_key = ? AND state = 'reserved'",
        ))
        .bind(id)
        .bind(key)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The provider confirmed charge `reference` of order `id`: the order
    /// is paid (with redemption code `code`) if it is still reserved, a
    /// payment of it is under way and no other charge of it is recorded,
    /// and its deadline has not passed, by the database's clock.
    ///
    /// # Errors
    /// [`Error::Database`] on failure (the order's state tells whether it
    /// committed).
    pub async fn confirm_payment(
        &self,
        id: i64,
        reference: &str,
        code: &str,
    ) -> Result<Transition> {
        let paid = sqlx::query(self.sql(
            "UPDATE voucher_order SET state = 'paid', paid_ms = NOW_MS, redeem_code = ?, \
             pay_reference = ?, due_ms = NULL \
             WHERE id = ? AND state = 'reserved' AND pay_by_ms > NOW_MS AND pay_key IS NOT NULL \
             AND (pay_reference IS NULL OR pay_reference = ?)",
        ))
        .bind(code)
        .bind(reference)
        .bind(id)
        .bind(reference)
        .execute(&self.pool)
        .await?;
        let Some(order) = self.order(id).await? else {
            return Ok(Transition::NotFound);
        };
        let kept_this_charge =
            order.paid_ms.is_some() && order.pay_reference.as_deref() == Some(reference);
        Ok(match order.state {
            OrderState::Paid if paid.rows_affected() == 1 => Transition::Done(order),
            _ if kept_this_charge => Transition::Already(order),
            _ => Transition::Refused(order),
        })
    }

    /// The provider declined charge `reference` of reserved order `id`:
    /// the order may be paid again (with another key).
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn clear_payment(&self, id: i64, reference: &str) -> Result<()> {
        sqlx::query(self.sql(
            "UPDATE voucher_order SET pay_key = NULL, pay_reference = NULL \
             WHERE id = ? AND (pay_reference IS NULL OR pay_reference = ?) AND state = 'reserved'",
        ))
        .bind(id)
        .bind(reference)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// What the service did with the callback of id `event_id`, if it was
    /// applied before.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn event_outcome(&self, event_id: &str) -> Result<Option<String>> {
        let row = sqlx::query(self.sql("SELECT outcome FROM payment_event WHERE id = ?"))
            .bind(event_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    /// Records `event` and what was done with it; `false` if it was
    /// recorded before (another delivery of it, applied at the same time).
    ///
    /// # Errors
    /// [`Error::Database`] on other failures.
    pub async fn record_event(&self, event: &Event, outcome: EventOutcome) -> Result<bool> {
        let order_id: i64 = event.order_id.parse().unwrap_or(0);
        let kind = match event.kind {
            EventKind::ChargeSucceeded => "charge.succeeded",
            EventKind::ChargeFailed => "charge.failed",
            EventKind::RefundSucceeded => "refund.succeeded",
            EventKind::RefundFailed => "refund.failed",
        };
        let inserted = sqlx::query(self.sql(
            "INSERT INTO payment_event \
             (id, kind, reference, order_id, amount_minor, currency, outcome, received_ms) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ))
        .bind(&event.id)
        .bind(kind)
        .bind(&event.reference)
        .bind(order_id)
        .bind(event.amount_minor)
        .bind(&event.currency)
        .bind(outcome.as_stored())
        .bind(now_ms())
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => Ok(true),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
            Err(e) => Err(Error::Database(e)),
        }
    }
}
