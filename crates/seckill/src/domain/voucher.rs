//! A flash-sale voucher's sale terms.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Largest stock one voucher may offer.
pub const MAX_STOCK: i64 = 100_000_000;

/// The terms of a flash sale: how many, from when, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleTerms {
    stock: i64,
    begin_ms: i64,
    end_ms: i64,
}

impl SaleTerms {
    /// Validated terms: `stock` in 1..=[`MAX_STOCK`], `begin < end`.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the offending field.
    pub fn new(stock: i64, begin: SystemTime, end: SystemTime) -> Result<Self> {
        if !(1..=MAX_STOCK).contains(&stock) {
            return Err(Error::invalid(
                "stock",
                format!("{stock} is not in 1..={MAX_STOCK}"),
            ));
        }
        // Named as the API spells them.
        let begin_ms = epoch_ms("begin_ms", begin)?;
        let end_ms = epoch_ms("end_ms", end)?;
        if end_ms <= begin_ms {
            return Err(Error::invalid("end_ms", "must be after begin_ms"));
        }
        Ok(Self {
            stock,
            begin_ms,
            end_ms,
        })
    }

    /// Units for sale.
    pub fn stock(&self) -> i64 {
        self.stock
    }

    /// Sale start, in Unix milliseconds.
    pub fn begin_ms(&self) -> i64 {
        self.begin_ms
    }

    /// Sale end (exclusive), in Unix milliseconds.
    pub fn end_ms(&self) -> i64 {
        self.end_ms
    }
}

fn epoch_ms(field: &'static str, t: SystemTime) -> Result<i64> {
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| Error::invalid(field, "is before 1970"))?
        .as_millis();
    i64::try_from(ms).map_err(|_| Error::invalid(field, "is too far in the future"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bad_terms_name_their_field() {
        let now = SystemTime::now();
        let later = now + Duration::from_secs(60);
        let field = |r: Result<SaleTerms>| match r {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(SaleTerms::new(0, now, later)), "stock");
        assert_eq!(field(SaleTerms::new(-5, now, later)), "stock");
        assert_eq!(field(SaleTerms::new(MAX_STOCK + 1, now, later)), "stock");
        assert_eq!(field(SaleTerms::new(10, later, now)), "end_ms");
        assert_eq!(field(SaleTerms::new(10, now, now)), "end_ms");
        assert!(SaleTerms::new(10, now, later).is_ok());
    }
}
