//! Taking a buyer's money: the one seam a real payment provider plugs into.
//!
//! The service asks a [`Payments`] to charge an order before it marks the
//! order paid, and to void that charge if the order could not be marked
//! (it was cancelled or expired meanwhile). A provider must make a charge
//! idempotent by the client's key: the same key charges once, however often
//! it is asked. [`StandIn`] approves every charge; it is what the service
//! runs until a provider is wired in. Refunds of paid orders are out of
//! scope: a paid order is final here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// A charge the provider made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The provider's reference of the charge.
    pub reference: String,
}

/// A payment provider.
pub trait Payments: std::fmt::Debug + Send + Sync {
    /// Charges order `order_id`'s price once per `key` (the same key
    /// answers the same receipt).
    fn charge<'a>(&'a self, order_id: i64, key: &'a str) -> PaymentFuture<'a, Receipt>;

    /// Gives back the charge of `receipt` (its order could not be marked
    /// paid).
    fn void<'a>(&'a self, receipt: &'a Receipt) -> PaymentFuture<'a, ()>;
}

/// A provider that approves every charge and counts what it did.
#[derive(Debug, Default)]
pub struct StandIn {
    charges: AtomicU64,
    voids: AtomicU64,
}

impl StandIn {
    /// Charges approved, and charges voided.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.charges.load(Ordering::Relaxed),
            self.voids.load(Ordering::Relaxed),
        )
    }
}

impl Payments for StandIn {
    fn charge<'a>(&'a self, order_id: i64, key: &'a str) -> PaymentFuture<'a, Receipt> {
        Box::pin(async move {
            self.charges.fetch_add(1, Ordering::Relaxed);
            Ok(Receipt {
                reference: format!("stand-in:{order_id}:{key}"),
            })
        })
    }

    fn void<'a>(&'a self, _receipt: &'a Receipt) -> PaymentFuture<'a, ()> {
        Box::pin(async move {
            self.voids.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
    }
}
