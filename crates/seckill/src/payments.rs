//! Taking a buyer's money: the one seam a real payment provider plugs into.
//!
//! The service asks a [`Payments`] to charge an order before it marks the
//! order paid, to void that charge if the order could not be marked (it
//! was cancelled or expired meanwhile), and to refund it when its buyer
//! asks for a refund of the paid order. A provider must make a charge
//! idempotent by the client's key: the same key charges once, however often
//! it is asked. [`StandIn`] approves every charge; it is what the service
//! runs until a provider is wired in, and keeps a ledger of what it did,
//! per currency, that checks compare with the database's paid orders.
//!
//! Every charge and void carries its amount: the order's, fixed when it
//! was stored.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use crate::domain::money::{Currency, Money};

/// A charge's future, boxed so that a provider can be chosen at run time.
pub type PaymentFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, PaymentError>> + Send + 'a>>;

/// Why a payment provider did not charge.
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

/// What the service asks a provider to charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The order paid for.
    pub order_id: i64,
    /// Its amount.
    pub amount: Money,
    /// The client's idempotency key.
    pub key: String,
}

/// A charge the provider made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The provider's reference of the charge.
    pub reference: String,
    /// What it charged.
    pub amount: Money,
}

/// A payment provider.
pub trait Payments: std::fmt::Debug + Send + Sync {
    /// Charges `charge.amount` for `charge.order_id` once per
    /// `charge.key` (the same key answers the same receipt).
    fn charge<'a>(&'a self, charge: &'a Charge) -> PaymentFuture<'a, Receipt>;

    /// Gives back the charge of `receipt` (its order could not be marked
    /// paid).
    fn void<'a>(&'a self, receipt: &'a Receipt) -> PaymentFuture<'a, ()>;

    /// Refunds the charge `refund.reference` in full, once per
    /// `refund.key` (asking again with the key answers the same).
    fn refund<'a>(&'a self, refund: &'a Refund) -> PaymentFuture<'a, ()>;
}

/// What the service asks a provider to refund: a charge, in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refund {
    /// The provider's reference of the charge.
    pub reference: String,
    /// Its amount.
    pub amount: Money,
    /// The client's idempotency key of the refund.
    pub key: String,
}

/// What a provider did in one currency: how many charges and voids, and
/// their sums in minor units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Charges made.
    pub charges: u64,
    /// Their sum.
    pub charged_minor: i64,
    /// Charges voided.
    pub voids: u64,
    /// Their sum.
    pub voided_minor: i64,
    /// Charges refunded.
    pub refunds: u64,
    /// Their sum.
    pub refunded_minor: i64,
}

impl Totals {
    /// What the provider kept: charged, less voided and refunded.
    pub fn kept_minor(&self) -> i64 {
        self.charged_minor - self.voided_minor - self.refunded_minor
    }
}

/// A provider that approves every charge and keeps a ledger of what it
/// did, per currency. Like a real provider it charges once per key and
/// voids a charge once, however often it is asked (it remembers every
/// charge it made: a development stand-in, not for years of orders).
#[derive(Debug, Default)]
pub struct StandIn {
    state: Mutex<Book>,
}

/// The stand-in's records.
#[derive(Debug, Default)]
struct Book {
    ledger: BTreeMap<Currency, Totals>,
    /// Every charge by its reference, and what became of it.
    charges: HashMap<String, Fate>,
}

/// What became of a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Kept,
    Voided,
    Refunded,
}

impl StandIn {
    /// The ledger: per currency, what was charged and voided.
    pub fn ledger(&self) -> BTreeMap<Currency, Totals> {
        self.state
            .lock()
            .map(|book| book.ledger.clone())
            .unwrap_or_default()
    }

    /// Charges approved, and charges voided, in every currency.
    pub fn counts(&self) -> (u64, u64) {
        self.ledger()
            .values()
            .fold((0, 0), |(c, v), t| (c + t.charges, v + t.voids))
    }
}

impl Payments for StandIn {
    fn charge<'a>(&'a self, charge: &'a Charge) -> PaymentFuture<'a, Receipt> {
        Box::pin(async move {
            let reference = format!("stand-in:{}:{}", charge.order_id, charge.key);
            let mut book = self
                .state
                .lock()
                .map_err(|_| PaymentError::Unavailable("stand-in poisoned".into()))?;
            if !book.charges.contains_key(&reference) {
                book.charges.insert(reference.clone(), Fate::Kept);
                let totals = book.ledger.entry(charge.amount.currency()).or_default();
                totals.charges += 1;
                totals.charged_minor += charge.amount.minor();
            }
            Ok(Receipt {
                reference,
                amount: charge.amount,
            })
        })
    }

    fn void<'a>(&'a self, receipt: &'a Receipt) -> PaymentFuture<'a, ()> {
        Box::pin(async move {
            let mut book = self
                .state
                .lock()
                .map_err(|_| PaymentError::Unavailable("stand-in poisoned".into()))?;
            match book.charges.get_mut(&receipt.reference) {
                Some(fate @ Fate::Kept) => *fate = Fate::Voided,
                Some(Fate::Voided) => return Ok(()),
                Some(Fate::Refunded) | None => {
                    return Err(PaymentError::Declined(format!(
                        "no charge {} to void",
                        receipt.reference
                    )))
                }
            }
            let totals = book.ledger.entry(receipt.amount.currency()).or_default();
            totals.voids += 1;
            totals.voided_minor += receipt.amount.minor();
            Ok(())
        })
    }

    fn refund<'a>(&'a self, refund: &'a Refund) -> PaymentFuture<'a, ()> {
        Box::pin(async move {
            let mut book = self
                .state
                .lock()
                .map_err(|_| PaymentError::Unavailable("stand-in poisoned".into()))?;
            match book.charges.get_mut(&refund.reference) {
                Some(fate @ Fate::Kept) => *fate = Fate::Refunded,
                // Refunded before (the same refund asked again): done.
                Some(Fate::Refunded) => return Ok(()),
                Some(Fate::Voided) | None => {
                    return Err(PaymentError::Declined(format!(
                        "no charge {} to refund",
                        refund.reference
                    )))
                }
            }
            let totals = book.ledger.entry(refund.amount.currency()).or_default();
            totals.refunds += 1;
            totals.refunded_minor += refund.amount.minor();
            Ok(())
        })
    }
}
