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
//!
//! A provider answers a charge or a refund at once ([`Settlement::Now`]:
//! the stand-in) or later, by a signed callback ([`Settlement::Later`]:
//! a real provider over HTTP, [`provider::HttpProvider`]); `events` reads
//! and checks those callbacks.

use std::future::Future;
use std::pin::Pin;

use crate::domain::money::Money;
pub use crate::error::PaymentError;

pub mod events;
pub mod provider;
mod stand_in;

pub use stand_in::StandIn;

/// A charge's future, boxed so that a provider can be chosen at run time.
pub type PaymentFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, PaymentError>> + Send + 'a>>;

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

/// When a provider's answer is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Done now.
    Now,
    /// Asked; the provider confirms (or refuses) later, by a signed
    /// callback.
    Later,
}

/// A charge the provider made, or was asked to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The provider's reference of the charge.
    pub reference: String,
    /// What it charges.
    pub amount: Money,
    /// Whether it is charged now or confirmed by a callback.
    pub settlement: Settlement,
}

/// A payment provider.
pub trait Payments: std::fmt::Debug + Send + Sync {
    /// Charges `charge.amount` for `charge.order_id` once per
    /// `charge.key` (the same key answers the same receipt).
    fn charge<'a>(&'a self, charge: &'a Charge) -> PaymentFuture<'a, Receipt>;

    /// Whether this provider confirms charges later, by callback: the
    /// service then records that a payment is under way before it asks
    /// (a callback may arrive before the charge's answer does).
    fn confirms_by_callback(&self) -> bool {
        false
    }

    /// Gives back the charge of `receipt` (its order could not be marked
    /// paid).
    fn void<'a>(&'a self, receipt: &'a Receipt) -> PaymentFuture<'a, ()>;

    /// Refunds the charge `refund.reference` in full, once per
    /// `refund.key` (asking again with the key answers the same).
    fn refund<'a>(&'a self, refund: &'a Refund) -> PaymentFuture<'a, Settlement>;
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
