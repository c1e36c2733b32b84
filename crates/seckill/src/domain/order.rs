//! An order: as the pipeline stores it, and where it stands.

use serde::Serialize;

use crate::domain::money::Money;
use crate::domain::order_id::OrderId;
use crate::error::{Error, Result};

/// An order as the pipeline writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderRecord {
    /// The global order id minted at purchase.
    pub id: OrderId,
    /// The buyer.
    pub user_id: i64,
    /// The voucher bought.
    pub voucher_id: i64,
    /// When Redis accepted it (Unix milliseconds).
    pub created_ms: i64,
}

/// Where an accepted order stands.
///
/// An accepted order is first an entry in its voucher's stream (pending),
/// then a database row that reserves its unit (reserved), or, if the
/// pipeline gave up on it, an entry in the dead-letter stream (failed). A
/// reserved order is then paid, cancelled by its buyer, or expired at its
/// payment deadline, once and for good: the database row's state decides,
/// by one conditional update. A cancelled or expired order gave its unit
/// back to the sale. A paid order is then used (redeemed at its shop) or
/// refunded to its buyer (refunding while the provider refunds), once
/// and for good; a refunded order's unit goes back on sale if its voucher
/// says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    /// Accepted, on its way to the database.
    Pending,
    /// Stored; its unit is reserved until it is paid or its deadline passes.
    Reserved,
    /// Paid: the sale is complete.
    Paid,
    /// Cancelled by its buyer before payment; its unit went back.
    Cancelled,
    /// Not paid by its deadline; its unit went back.
    Expired,
    /// The pipeline gave up on it (see the dead-letter stream).
    Failed,
    /// Paid, then redeemed at its shop.
    Used,
    /// Paid; its buyer asked for a refund, which the provider is making.
    Refunding,
    /// Paid, then refunded to its buyer.
    Refunded,
}

impl OrderState {
    /// The state as the database stores it (a stored order's only).
    pub fn as_stored(self) -> &'static str {
        match self {
            OrderState::Reserved => "reserved",
            OrderState::Paid => "paid",
            OrderState::Cancelled => "cancelled",
            OrderState::Expired => "expired",
            OrderState::Pending => "pending",
            OrderState::Failed => "failed",
            OrderState::Used => "used",
            OrderState::Refunding => "refunding",
            OrderState::Refunded => "refunded",
        }
    }

    /// A stored state read back (`None`: not one the database stores).
    pub fn from_stored(text: &str) -> Option<Self> {
        Some(match text {
            "reserved" => OrderState::Reserved,
            "paid" => OrderState::Paid,
            "cancelled" => OrderState::Cancelled,
            "expired" => OrderState::Expired,
            "used" => OrderState::Used,
            "refunding" => OrderState::Refunding,
            "refunded" => OrderState::Refunded,
            _ => return None,
        })
    }

    /// Whether the order was given back before payment (cancelled or
    /// expired), which always returns its unit to the sale.
    pub fn gave_back(self) -> bool {
        matches!(self, OrderState::Cancelled | OrderState::Expired)
    }
}

/// A stored order and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOrder {
    /// The order.
    pub record: OrderRecord,
    /// Reserved, paid, cancelled, expired, used, refunding or refunded.
    pub state: OrderState,
    /// The payment deadline (Unix ms).
    pub pay_by_ms: i64,
    /// When it was paid (Unix ms).
    pub paid_ms: Option<i64>,
    /// When it was cancelled or expired (Unix ms).
    pub closed_ms: Option<i64>,
    /// What its buyer pays: its voucher's price when it was stored.
    pub amount: Money,
    /// The one-time code its buyer shows at the shop (once paid).
    pub redeem_code: Option<String>,
    /// When its shop redeemed it (Unix ms).
    pub used_ms: Option<i64>,
    /// When its refund completed (Unix ms).
    pub refunded_ms: Option<i64>,
    /// Whether its unit went back on sale (in the database): cancelled,
    /// expired, or refunded while its voucher takes refunded units back.
    pub returned: bool,
    /// The provider's reference of its charge: the one it kept once paid;
    /// while reserved, one asked for and not confirmed yet.
    pub pay_reference: Option<String>,
}

/// Crockford's base32 alphabet: no I, L, O or U, which read as other
/// characters.
const CODE_ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A one-time redemption code, as its buyer shows it at the shop: ten
/// characters of Crockford's base32 in two groups, `XXXXX-XXXXX`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedeemCode(String);

impl RedeemCode {
    /// A fresh code: 50 bits from the system's cryptographic generator (a
    /// v4 UUID's), which nobody can guess and a person can read out.
    pub fn generate() -> Self {
        let random = u128::from_be_bytes(*uuid::Uuid::new_v4().as_bytes());
        let mut code = String::with_capacity(11);
        for i in 0..10 {
            if i == 5 {
                code.push('-');
            }
            code.push(CODE_ALPHABET[((random >> (5 * i)) & 31) as usize] as char);
        }
        Self(code)
    }

    /// A code as a person typed it: case, spaces and dashes do not matter,
    /// and O, I and L read as 0, 1 and 1, as Crockford's decoding does.
    ///
    /// # Errors
    /// [`Error::Invalid`] (field `code`) for anything else.
    pub fn parse(typed: &str) -> Result<Self> {
        let mut symbols = String::with_capacity(10);
        for c in typed.chars().filter(|c| !matches!(c, '-' | ' ')) {
            let c = match c.to_ascii_uppercase() {
                'O' => '0',
                'I' | 'L' => '1',
                c => c,
            };
            if !c.is_ascii() || !CODE_ALPHABET.contains(&(c as u8)) || symbols.len() == 10 {
                return Err(Error::invalid(
                    "code",
                    "must be ten characters of 0-9 and A-Z but I, L, O and U (XXXXX-XXXXX)",
                ));
            }
            symbols.push(c);
        }
        if symbols.len() != 10 {
            return Err(Error::invalid(
                "code",
                format!("must be ten characters, not {}", symbols.len()),
            ));
        }
        symbols.insert(5, '-');
        Ok(Self(symbols))
    }

    /// The code as stored and shown (`XXXXX-XXXXX`).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_read_as_people_type_them() {
        let code = RedeemCode::generate();
        assert_eq!(code.as_str().len(), 11);
        assert_eq!(RedeemCode::parse(code.as_str()).unwrap(), code);
        let typed = code.as_str().to_lowercase().replace('-', " ");
        assert_eq!(RedeemCode::parse(&typed).unwrap(), code);
        assert_eq!(
            RedeemCode::parse("oil00-abcde").unwrap().as_str(),
            "01100-ABCDE"
        );
        for bad in [
            "",
            "ABCDE",
            "ABCDE-ABCDEF",
            "ABCDE-ABCDU",
            "ABCDE-ABCD!",
            "ÄBCDE-ABCDE",
        ] {
            assert!(RedeemCode::parse(bad).is_err(), "{bad:?}");
        }
        assert_ne!(RedeemCode::generate(), RedeemCode::generate());
    }
}
