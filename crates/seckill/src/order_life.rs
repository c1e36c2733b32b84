//! An order's life after the purchase: payment, cancellation by its buyer,
//! expiry at its payment deadline, and the unit of a given-back order put
//! on sale again in both stores; after the payment, redemption at the
//! shop or a refund to the buyer (whose unit goes back on sale as a
//! cancelled order's does, when the voucher says so).
//!
//! The database row decides every transition, by one conditional update
//! ([`Database::pay_order`], [`Database::give_back`]): only a reserved
//! order changes, once, and the deadline is judged by the database's clock.
//! A give-back commits the order's new state and the voucher's stock + 1
//! together; Redis then takes the unit back ([`FastPath::take_back`]),
//! exactly once per order whatever repeats it. The order stays due in the
//! database until Redis has the unit ([`Database::finish_return`]), so the
//! sweep finishes whatever a crash, a Redis outage or a lost reply left
//! half done.
//!
//! A refund is recorded as asked (refunding) before the provider is asked,
//! and stays due until it is finished: the sweep asks the provider again
//! with the same key (a provider refunds once per key) whatever a crash or
//! an outage of the provider left half done.
//!
//! The sweep runs on every instance every `sweep_every`: one indexed range
//! read of the due orders, and nothing more while none is due. When some
//! are, the instance that takes the `hasp` lock `<prefix>:expiry` (without
//! waiting) expires those past their deadline and takes back the units of
//! given-back ones, a batch per hold of the lock. The lock only keeps
//! instances from doing the same work; correctness rests on the rows and
//! the returned set. So its lease is one sweep period (at least
//! [`MIN_SWEEP_LEASE`]), never renewed: an instance that dies holding it
//! delays expiry by at most that, and a batch that outlasts it at worst
//! overlaps another instance's.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::db::{self, Database, GiveBack, Transition};
use crate::db::{EventOutcome, PaymentStart};
use crate::domain::money::Money;
use crate::domain::order::OrderState;
use crate::domain::order::{RedeemCode, StoredOrder};
use crate::error::Result;
use crate::metrics::Metrics;
use crate::payments::events::{Event, EventKind};
use crate::payments::{Charge, PaymentError, Payments, Receipt, Refund, Settlement};
use crate::store::{FastPath, TakeBack};

/// How long a refund asked of a provider that confirms by callback waits
/// for it before the sweep asks the provider again (by the same key).
pub const REFUND_RECHECK: Duration = Duration::from_secs(60);

/// Due orders read and handled at a time.
const BATCH: i64 = 100;

/// Batches one sweep handles at most.
const MOST_BATCHES: usize = 20;

/// The shortest lease of the sweep's lock, for very short sweep periods
/// (a batch of a hundred orders takes a few hundred milliseconds on a slow
/// machine with SQLite).
pub const MIN_SWEEP_LEASE: Duration = Duration::from_millis(500);

/// The end of a payment's or a cancellation's database budget, from now
/// ([`db::by`]).
fn database_deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + db::ACQUIRE_TIMEOUT
}

/// Payments, cancellations and expiry, over the database and (on the fast
/// path) Redis.
#[derive(Debug)]
pub struct OrderLife {
    db: Database,
    /// The Redis side of the sale (`None`: the locked path, where the
    /// database is the only store of stock).
    fast: Option<Arc<FastPath>>,
    payments: Arc<dyn Payments>,
    metrics: Metrics,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    /// Reserved orders expired (their unit given back in the database).
    pub expired: usize,
    /// Given-back units Redis took back.
    pub taken_back: usize,
    /// Refunds left half done, finished.
    pub refunds_finished: usize,
}

impl OrderLife {
    /// The order life of a sale stored in `db`, with its Redis side in
    /// `fast` (`None` on the locked path), charging through `payments`.
    pub fn new(
        db: Database,
        fast: Option<Arc<FastPath>>,
        payments: Arc<dyn Payments>,
        metrics: Metrics,
    ) -> Self {
        Self {
            db,
            fast,
            payments,
            metrics,
        }
    }

    /// Pays order `id` of `user`: charged through the provider with the
    /// client's idempotency `key`, then marked paid if it is still reserved
    /// and its deadline has not passed (else the charge is voided). The
    /// same key again answers [`Transition::Already`]. With a provider
    /// that confirms by callback, the payment is recorded as under way
    /// before the provider is asked, and the answer is
    /// [`Transition::Pending`]: the callback decides
    /// ([`OrderLife::apply_event`]); another key meanwhile is refused,
    /// uncharged ([`Error::PaymentUnderWay`](crate::Error::PaymentUnderWay)).
    ///
    /// # Errors
    /// [`Error::Payment`](crate::Error::Payment) if the provider did not
    /// charge; [`Error::Database`](crate::Error::Database) if the database
    /// failed (then ask again with the same key: the provider charges once
    /// per key, and the order's state tells what happened).
    pub async fn pay(&self, id: i64, user: i64, key: &str) -> Result<Transition> {
        let deadline = database_deadline();
        let Some(order) = db::by(deadline, self.db.order(id)).await? else {
            return Ok(Transition::NotFound);
        };
        if order.record.user_id != user {
            return Ok(Transition::NotFound);
        }
        let code = RedeemCode::generate();
        if order.state != OrderState::Reserved {
            // Paid (by this key or another) or given back: no charge.
            let unchanged = self.db.pay_order(id, user, key, "", code.as_str());
            return db::by(deadline, unchanged).await;
        }
        let charge = Charge {
            order_id: id,
            amount: order.amount,
            key: key.to_owned(),
        };
        if self.payments.confirms_by_callback() {
            return self.pay_by_callback(order, &charge).await;
        }
        let receipt = self.payments.charge(&charge).await?;
        // The charge's own time does not count against the database.
        let paid = self
            .db
            .pay_order(id, user, key, &receipt.reference, code.as_str());
        let outcome = db::by(database_deadline(), paid).await?;
        match &outcome {
            Transition::Done(_) => self.metrics.orders_paid.inc(),
            Transition::Already(_) | Transition::Pending(_) => {}
            Transition::Refused(_) | Transition::NotFound => self.void(id, &receipt).await,
        }
        Ok(outcome)
    }

    /// [`OrderLife::pay`] through a provider that confirms by callback:
    /// the payment is recorded as under way before the provider is asked
    /// (its callback may come before its answer), then its charge's
    /// reference.
    async fn pay_by_callback(&self, order: StoredOrder, charge: &Charge) -> Result<Transition> {
        let (id, user) = (charge.order_id, order.record.user_id);
        let begin = self.db.begin_payment(id, user, &charge.key);
        match db::by(database_deadline(), begin).await? {
            PaymentStart::Started(_) => {}
            PaymentStart::Busy(_) => return Err(crate::Error::PaymentUnderWay),
            PaymentStart::Other(outcome) => return Ok(outcome),
        }
        let receipt = match self.payments.charge(charge).await {
            Ok(receipt) => receipt,
            Err(e) => {
                // Declined at once: the buyer may pay again, with another
                // key. Unknown: the payment stays under way, for the same
                // key again (or the callback).
                if matches!(e, PaymentError::Declined(_)) {
                    db::by(
                        database_deadline(),
                        self.db.abandon_payment(id, &charge.key),
                    )
                    .await?;
                }
                return Err(e.into());
            }
        };
        let noted = self.db.note_reference(id, &charge.key, &receipt.reference);
        if let Err(e) = db::by(database_deadline(), noted).await {
            // The callback carries the reference too.
            tracing::warn!(order = id, error = %e, "recording a charge's reference failed");
        }
        let order = db::by(database_deadline(), self.db.order(id)).await?;
        Ok(
            order.map_or(Transition::NotFound, |order| match order.state {
                OrderState::Reserved => Transition::Pending(order),
                _ => Transition::Already(order),
            }),
        )
    }

    /// Gives back the charge asked for on `order`, given back before its
    /// provider confirmed it (a provider that never calls back leaves the
    /// order to expire, and its charge is voided here). If the callback
    /// comes after all, it finds the order given back and voids it again:
    /// a provider voids once.
    async fn void_unconfirmed(&self, order: &StoredOrder) {
        if let Some(reference) = &order.pay_reference {
            let receipt = Receipt {
                reference: reference.clone(),
                amount: order.amount,
                settlement: Settlement::Later,
            };
            self.void(order.record.id.as_i64(), &receipt).await;
        }
    }

    /// Gives charge `receipt` of order `id` back (its order could not be
    /// paid by it); a failure is logged (the provider's ledger shows it).
    async fn void(&self, id: i64, receipt: &Receipt) {
        if let Err(e) = self.payments.void(receipt).await {
            tracing::warn!(order = id, reference = %receipt.reference, error = %e, "voiding a charge of an order that could not be paid failed");
        }
    }

    /// Applies a provider's callback `event` (its signature checked by the
    /// caller), once per event id: a confirmed charge pays its order if it
    /// is still reserved with that charge and in time, else the charge is
    /// voided; a charge for another amount than the order's is refused,
    /// recorded and voided; a declined charge lets the buyer pay again; a
    /// confirmed refund finishes the order's refund (its unit back on sale
    /// if the voucher says so), a declined one puts it back to paid.
    ///
    /// # Errors
    /// [`Error::EventTooEarly`](crate::Error::EventTooEarly) for a refund's
    /// callback that arrives before the order's refund was recorded (the
    /// provider delivers it again later);
    /// [`Error::Database`](crate::Error::Database) if the database failed
    /// (the provider delivers it again; applying it again is safe).
    pub async fn apply_event(&self, event: &Event) -> Result<EventOutcome> {
        if self.db.event_outcome(&event.id).await?.is_some() {
            return Ok(EventOutcome::Duplicate);
        }
        let outcome = self.decide(event).await?;
        // A delivery applied at the same time recorded it first: the
        // changes above were conditional, so nothing happened twice.
        if !self.db.record_event(event, outcome).await? {
            return Ok(EventOutcome::Duplicate);
        }
        Ok(outcome)
    }

    /// What `event` does to its order.
    async fn decide(&self, event: &Event) -> Result<EventOutcome> {
        let Some(order) = (match event.order_id.parse::<i64>() {
            Ok(id) => self.db.order(id).await?,
            Err(_) => None,
        }) else {
            return Ok(EventOutcome::UnknownOrder);
        };
        let id = order.record.id.as_i64();
        let charged = Money::new("amount_minor", event.amount_minor, order.amount.currency())
            .ok()
            .filter(|_| event.currency == order.amount.currency().code());
        let receipt = Receipt {
            reference: event.reference.clone(),
            amount: charged.unwrap_or(order.amount),
            settlement: Settlement::Later,
        };
        match event.kind {
            EventKind::ChargeSucceeded => {
                if charged != Some(order.amount) {
                    tracing::warn!(order = id, event = %event.id, amount = event.amount_minor, currency = %event.currency, "a charge of another amount than the order's: refused and voided");
                    self.void(id, &receipt).await;
                    return Ok(EventOutcome::AmountMismatch);
                }
                let code = RedeemCode::generate();
                match self
                    .db
                    .confirm_payment(id, &event.reference, code.as_str())
                    .await?
                {
                    Transition::Done(_) => {
                        self.metrics.orders_paid.inc();
                        Ok(EventOutcome::Paid)
                    }
                    Transition::Already(_) => Ok(EventOutcome::Duplicate),
                    _ => {
                        // Expired or cancelled meanwhile, or paid by another
                        // charge: this one goes back.
                        self.void(id, &receipt).await;
                        Ok(EventOutcome::Voided)
                    }
                }
            }
            EventKind::ChargeFailed => {
                self.db.clear_payment(id, &event.reference).await?;
                Ok(EventOutcome::Declined)
            }
            EventKind::RefundSucceeded | EventKind::RefundFailed
                if order.pay_reference.as_deref() != Some(event.reference.as_str()) =>
            {
                Ok(EventOutcome::UnknownOrder)
            }
            EventKind::RefundSucceeded => match order.state {
                OrderState::Refunding => {
                    self.record_refund(id).await?;
                    Ok(EventOutcome::Refunded)
                }
                OrderState::Refunded => Ok(EventOutcome::Duplicate),
                _ => Err(crate::Error::EventTooEarly),
            },
            EventKind::RefundFailed => match order.state {
                OrderState::Refunding => {
                    self.db.abandon_refund(id).await?;
                    Ok(EventOutcome::RefundDeclined)
                }
                OrderState::Paid => Ok(EventOutcome::Duplicate),
                _ => Err(crate::Error::EventTooEarly),
            },
        }
    }

    /// Refunds paid order `id` of `user` in full, with the client's
    /// idempotency `key`: recorded as refunding, refunded by the provider,
    /// then refunded, its unit back on sale if its voucher says so. The
    /// same key again answers the order as it stands; a used order, or one
    /// not paid, is [`Transition::Refused`].
    ///
    /// # Errors
    /// [`Error::Payment`](crate::Error::Payment) if the provider did not
    /// refund (declined: the order is paid again; unavailable: it stays
    /// refunding, and the sweep asks the provider again);
    /// [`Error::Database`](crate::Error::Database) if the database failed
    /// (ask again with the same key).
    pub async fn refund(&self, id: i64, user: i64, key: &str) -> Result<Transition> {
        let started = self.db.start_refund(id, user, key);
        let (outcome, reference) = db::by(database_deadline(), started).await?;
        let order = match outcome {
            Transition::Done(order) | Transition::Already(order)
                if order.state == OrderState::Refunding =>
            {
                order
            }
            other => return Ok(other),
        };
        self.finish_refund(&order, reference, key).await
    }

    /// Asks the provider to refund refunding order `order` (charge
    /// `reference`, the client's `key`) and records the outcome.
    async fn finish_refund(
        &self,
        order: &StoredOrder,
        reference: Option<String>,
        key: &str,
    ) -> Result<Transition> {
        let id = order.record.id.as_i64();
        // An order of amount 0 stored before charges had references was
        // never charged: there is nothing to give back.
        if let Some(reference) = reference {
            let refund = Refund {
                reference,
                amount: order.amount,
                key: key.to_owned(),
            };
            match self.payments.refund(&refund).await {
                Ok(Settlement::Now) => {}
                Ok(Settlement::Later) => {
                    // The callback finishes it; if it is lost, the sweep
                    // asks again after a while.
                    db::by(
                        database_deadline(),
                        self.db.refund_asked(id, REFUND_RECHECK),
                    )
                    .await?;
                    return Ok(Transition::Pending(order.clone()));
                }
                Err(e) => {
                    if matches!(e, PaymentError::Declined(_)) {
                        db::by(database_deadline(), self.db.abandon_refund(id)).await?;
                    }
                    return Err(e.into());
                }
            }
        }
        self.record_refund(id).await
    }

    /// Records that the provider refunded refunding order `id`, and takes
    /// its unit back in Redis if it went back on sale.
    async fn record_refund(&self, id: i64) -> Result<Transition> {
        let (outcome, returned) = db::by(database_deadline(), self.db.finish_refund(id)).await?;
        if matches!(outcome, Transition::Done(_)) {
            self.metrics.orders_refunded.inc();
        }
        if let Some(returned) = returned {
            self.metrics
                .orders_returned
                .with_label_values(&["refunded"])
                .inc();
            self.take_back(returned.order_id, returned.user_id, returned.voucher_id)
                .await;
        }
        Ok(outcome)
    }

    /// Redeems the paid order whose redemption code is `code` (what its
    /// buyer shows at the shop): it becomes used, once.
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the database failed
    /// (the order's state tells whether it was redeemed).
    pub async fn redeem(&self, code: &str) -> Result<Transition> {
        let outcome = db::by(database_deadline(), self.db.redeem(code)).await?;
        if matches!(outcome, Transition::Done(_)) {
            self.metrics.orders_redeemed.inc();
        }
        Ok(outcome)
    }

    /// Cancels reserved order `id` of `user`: its unit goes back to the
    /// sale. Cancelling again answers [`Transition::Already`]; a paid or
    /// expired order is [`Transition::Refused`].
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the database failed
    /// (the order's state tells whether the cancellation committed).
    pub async fn cancel(&self, id: i64, user: i64) -> Result<Transition> {
        let cancel = self.db.give_back(id, Some(user), GiveBack::Cancel);
        let (outcome, returned) = db::by(database_deadline(), cancel).await?;
        if let Transition::Done(order) = &outcome {
            self.void_unconfirmed(order).await;
        }
        if let Some(returned) = returned {
            self.metrics
                .orders_returned
                .with_label_values(&["cancelled"])
                .inc();
            self.take_back(returned.order_id, returned.user_id, returned.voucher_id)
                .await;
        }
        Ok(outcome)
    }

    /// Puts the unit of given-back order `order` (of `user`, for `voucher`)
    /// on sale again in Redis, then marks the order done; whether it is. A
    /// failure is logged and left to the sweep (the order stays due).
    async fn take_back(&self, order: i64, user: i64, voucher: i64) -> bool {
        if let Some(fast) = &self.fast {
            match fast.take_back(voucher, user, order).await {
                Ok(TakeBack::TakenBack) => self.metrics.units_taken_back.inc(),
                Ok(TakeBack::Already | TakeBack::NoSale) => {}
                Err(e) => {
                    tracing::warn!(order, voucher, error = %e, "taking a unit back in Redis failed; the expiry sweep retries");
                    return false;
                }
            }
        }
        match self.db.finish_return(order).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(order, error = %e, "marking a return done failed; the expiry sweep retries");
                false
            }
        }
    }

    /// Whether any order is due now (one indexed read).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the database failed.
    pub async fn any_due(&self) -> Result<bool> {
        Ok(!self.db.due_orders(1).await?.is_empty())
    }

    /// Expires the reserved orders past their deadline and takes back the
    /// units of given-back orders, in batches, until none is due or a
    /// take-back fails (Redis down: the next sweep tries again).
    ///
    /// # Errors
    /// [`Error::Database`](crate::Error::Database) if the database failed.
    pub async fn sweep(&self) -> Result<SweepReport> {
        let mut report = SweepReport::default();
        for _ in 0..MOST_BATCHES {
            let (batch, more) = self.sweep_batch().await?;
            report.expired += batch.expired;
            report.taken_back += batch.taken_back;
            report.refunds_finished += batch.refunds_finished;
            if !more {
                break;
            }
        }
        Ok(report)
    }

    /// One batch of [`OrderLife::sweep`]; also whether more may be due.
    async fn sweep_batch(&self) -> Result<(SweepReport, bool)> {
        let mut report = SweepReport::default();
        let due = self.db.due_orders(BATCH).await?;
        let mut stuck = false;
        for order in &due {
            let record = &order.record;
            match order.state {
                OrderState::Reserved => {
                    let id = record.id.as_i64();
                    match self.db.give_back(id, None, GiveBack::Expire).await? {
                        (_, Some(_)) => {
                            self.void_unconfirmed(order).await;
                            report.expired += 1;
                            self.metrics
                                .orders_returned
                                .with_label_values(&["expired"])
                                .inc();
                        }
                        // Paid or cancelled since it was read.
                        (_, None) => continue,
                    }
                }
                // A refund a crash or the provider's outage left half done.
                OrderState::Refunding => {
                    let id = record.id.as_i64();
                    let Some((reference, key)) = self.db.refund_keys(id).await? else {
                        continue;
                    };
                    match self.finish_refund(order, reference, &key).await {
                        Ok(_) => report.refunds_finished += 1,
                        Err(e) => {
                            tracing::warn!(order = id, error = %e, "finishing a refund failed; the next sweep retries");
                            stuck = true;
                        }
                    }
                    // The refund took its unit back itself, if it returned one.
                    continue;
                }
                // Its unit is back on sale in the database; Redis has not
                // taken it back yet.
                _ if order.returned => {}
                _ => continue,
            }
            let (id, user, voucher) = (record.id.as_i64(), record.user_id, record.voucher_id);
            if self.take_back(id, user, voucher).await {
                report.taken_back += 1;
            } else {
                stuck = true;
            }
        }
        Ok((report, !stuck && due.len() == BATCH as usize))
    }
}

/// Sweeps every `every` until `stop` (see the module docs).
pub(crate) async fn sweep_until_stopped(
    life: Arc<OrderLife>,
    locks: hasp::Client,
    prefix: String,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let lease = every.clamp(MIN_SWEEP_LEASE, Duration::from_secs(30));
    let lock = match locks
        .plain_lock(&format!("{prefix}:expiry"))
        .and_then(|lock| lock.with_lease(lease))
    {
        Ok(lock) => lock,
        Err(e) => {
            tracing::error!(error = %e, "the expiry sweep's lock is refused; no sweep");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(every) => {}
        }
        match life.any_due().await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading due orders failed; the next sweep retries");
                continue;
            }
        }
        let mut report = SweepReport::default();
        for _ in 0..MOST_BATCHES {
            let guard = match lock.try_lock().await {
                Ok(Some(guard)) => guard,
                Ok(None) => break, // another instance sweeps
                Err(e) => {
                    tracing::warn!(error = %e, "the expiry sweep's lock failed; the next sweep retries");
                    break;
                }
            };
            let batch = life.sweep_batch().await;
            if let Err(e) = guard.unlock().await {
                tracing::debug!(error = %e, "expiry lock release failed; it expires");
            }
            match batch {
                Ok((batch, more)) => {
                    report.expired += batch.expired;
                    report.taken_back += batch.taken_back;
                    report.refunds_finished += batch.refunds_finished;
                    if !more {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "expiry sweep failed; the next one retries");
                    break;
                }
            }
        }
        if report != SweepReport::default() {
            tracing::info!(?report, "expiry sweep");
        }
    }
}
