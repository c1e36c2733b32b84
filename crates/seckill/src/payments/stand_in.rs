//! The development stand-in: a provider in the process that approves
//! every charge at once and keeps a ledger.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::{Charge, PaymentError, PaymentFuture, Payments, Receipt, Refund, Settlement, Totals};
use crate::domain::money::Currency;

/// A provider that approves every charge and keeps a ledger of what it
/// did, per currency. Like a real provider it charges once per key and
/// voids or refunds a charge once, however often it is asked (it remembers
/// every charge it made: a development stand-in, not for years of orders).
///
/// Each instance of the service runs its own: one that is asked to void or
/// refund a charge another instance's stand-in made approves it too, and
/// records it in its own ledger; only the sum of the instances' ledgers
/// is the whole of what was charged.
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
                settlement: Settlement::Now,
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
                Some(Fate::Refunded) => {
                    return Err(PaymentError::Declined(format!(
                        "charge {} is refunded",
                        receipt.reference
                    )))
                }
                // Another instance's stand-in made it.
                None => {
                    book.charges.insert(receipt.reference.clone(), Fate::Voided);
                }
            }
            let totals = book.ledger.entry(receipt.amount.currency()).or_default();
            totals.voids += 1;
            totals.voided_minor += receipt.amount.minor();
            Ok(())
        })
    }

    fn refund<'a>(&'a self, refund: &'a Refund) -> PaymentFuture<'a, Settlement> {
        Box::pin(async move {
            let mut book = self
                .state
                .lock()
                .map_err(|_| PaymentError::Unavailable("stand-in poisoned".into()))?;
            match book.charges.get_mut(&refund.reference) {
                Some(fate @ Fate::Kept) => *fate = Fate::Refunded,
                // Refunded before (the same refund asked again): done.
                Some(Fate::Refunded) => return Ok(Settlement::Now),
                Some(Fate::Voided) => {
                    return Err(PaymentError::Declined(format!(
                        "charge {} is voided",
                        refund.reference
                    )))
                }
                // Another instance's stand-in made it.
                None => {
                    book.charges
                        .insert(refund.reference.clone(), Fate::Refunded);
                }
            }
            let totals = book.ledger.entry(refund.amount.currency()).or_default();
            totals.refunds += 1;
            totals.refunded_minor += refund.amount.minor();
            Ok(Settlement::Now)
        })
    }
}
