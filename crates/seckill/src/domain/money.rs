//! Money: whole numbers of a currency's minor unit (cents, fen, yen),
//! never floats, with the ISO 4217 currency they count.

use std::fmt;

use serde::Serialize;

use crate::error::{Error, Result};

/// The largest amount a price, a face value or an order may carry, in
/// minor units: well inside the integers a JavaScript client reads exactly
/// (2^53), so a page never rounds a price.
pub const MAX_AMOUNT_MINOR: i64 = 1_000_000_000_000;

/// An ISO 4217 currency a voucher may be priced in: an active currency
/// with a minor unit (no funds, no precious metals, none superseded), or
/// `XXX`, the standard's code for "no currency involved", which only an
/// amount of zero may carry (a free voucher).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Currency(iso_currency::Currency);

impl Currency {
    /// "No currency involved": what free vouchers and their orders carry.
    pub const NONE: Currency = Currency(iso_currency::Currency::XXX);

    /// The currency of code `code` (`"CNY"`, `"EUR"`, …), as field `field`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `field` for a code ISO 4217 does not list,
    /// or one a price cannot be in.
    pub fn parse(field: &'static str, code: &str) -> Result<Self> {
        let Some(currency) = iso_currency::Currency::from_code(code) else {
            return Err(Error::invalid(
                field,
                format!("{code:?} is not an ISO 4217 currency code"),
            ));
        };
        if currency == iso_currency::Currency::XXX {
            return Ok(Self::NONE);
        }
        if currency.exponent().is_none() || currency.is_fund() || currency.is_special() {
            return Err(Error::invalid(
                field,
                format!("{code} is not a currency a price can be in"),
            ));
        }
        if let Some(now) = currency.is_superseded() {
            return Err(Error::invalid(
                field,
                format!("{code} is superseded by {}", now.code()),
            ));
        }
        Ok(Self(currency))
    }

    /// A currency as a database row stores it, trusted to have been
    /// checked when written.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the row holds what no check lets in.
    pub fn from_stored(code: &str) -> Result<Self> {
        Self::parse("currency", code).map_err(|e| Error::Protocol(format!("stored currency: {e}")))
    }

    /// The three-letter code.
    pub fn code(self) -> &'static str {
        self.0.code()
    }

    /// Decimal places of the minor unit (2 for CNY, 0 for JPY, 3 for KWD).
    pub fn exponent(self) -> u16 {
        self.0.exponent().unwrap_or(0)
    }

    /// Whether this is [`Currency::NONE`].
    pub fn is_none(self) -> bool {
        self == Self::NONE
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl Serialize for Currency {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.code())
    }
}

/// An amount of a currency, in its minor unit: 0 to [`MAX_AMOUNT_MINOR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Money {
    minor: i64,
    currency: Currency,
}

impl Money {
    /// `minor` units of `currency`, as field `field`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `field` for a negative or too large
    /// amount, or a non-zero amount of [`Currency::NONE`].
    pub fn new(field: &'static str, minor: i64, currency: Currency) -> Result<Self> {
        if !(0..=MAX_AMOUNT_MINOR).contains(&minor) {
            return Err(Error::invalid(
                field,
                format!("{minor} is not in 0..={MAX_AMOUNT_MINOR} (minor units)"),
            ));
        }
        if minor > 0 && currency.is_none() {
            return Err(Error::invalid(
                "currency",
                format!("an amount that is not zero needs a currency ({field} is {minor})"),
            ));
        }
        Ok(Self { minor, currency })
    }

    /// Nothing, in no currency: what a free voucher costs.
    pub fn zero() -> Self {
        Self {
            minor: 0,
            currency: Currency::NONE,
        }
    }

    /// An amount as a database row stores it (`minor`, `code`), trusted
    /// to have been checked when written.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the row holds what no check lets in.
    pub fn from_stored(minor: i64, code: &str) -> Result<Self> {
        let currency = Currency::from_stored(code)?;
        Self::new("amount", minor, currency)
            .map_err(|e| Error::Protocol(format!("stored amount: {e}")))
    }

    /// The amount in minor units.
    pub fn minor(self) -> i64 {
        self.minor
    }

    /// Its currency.
    pub fn currency(self) -> Currency {
        self.currency
    }
}

impl fmt::Display for Money {
    /// `19.90 CNY`, `500 JPY`, `0 XXX`: the amount in major units with the
    /// currency's decimals (for logs and reports; pages format their own).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let exponent = u32::from(self.currency.exponent());
        let scale = 10_i64.pow(exponent);
        let (major, minor) = (self.minor / scale, self.minor % scale);
        if exponent == 0 {
            write!(f, "{major} {}", self.currency)
        } else {
            let width = exponent as usize;
            write!(f, "{major}.{minor:0width$} {}", self.currency)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<T: fmt::Debug>(r: Result<T>) -> &'static str {
        match r {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_currencies_a_price_can_be_in() {
        for good in ["CNY", "EUR", "USD", "JPY", "KWD", "XXX"] {
            assert_eq!(Currency::parse("currency", good).unwrap().code(), good);
        }
        // Unknown, lower case, a fund, a metal, superseded.
        for bad in ["ABC", "cny", "", "CNYY", "BOV", "XAU", "BGN", "VES"] {
            assert_eq!(field(Currency::parse("currency", bad)), "currency", "{bad}");
        }
    }

    #[test]
    fn amounts_are_whole_minor_units_in_range() {
        let cny = Currency::parse("currency", "CNY").unwrap();
        assert_eq!(field(Money::new("price_minor", -1, cny)), "price_minor");
        assert_eq!(
            field(Money::new("price_minor", MAX_AMOUNT_MINOR + 1, cny)),
            "price_minor"
        );
        assert_eq!(
            field(Money::new("price_minor", 5, Currency::NONE)),
            "currency"
        );
        assert!(Money::new("price_minor", 0, Currency::NONE).is_ok());
        assert_eq!(Money::new("p", 1990, cny).unwrap().to_string(), "19.90 CNY");
        assert_eq!(Money::new("p", 5, cny).unwrap().to_string(), "0.05 CNY");
        let jpy = Currency::parse("currency", "JPY").unwrap();
        assert_eq!(Money::new("p", 500, jpy).unwrap().to_string(), "500 JPY");
        let kwd = Currency::parse("currency", "KWD").unwrap();
        assert_eq!(Money::new("p", 1005, kwd).unwrap().to_string(), "1.005 KWD");
        assert_eq!(Money::zero().to_string(), "0 XXX");
    }
}
