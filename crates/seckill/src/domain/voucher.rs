//! A flash-sale voucher: its title and its sale terms.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Largest stock one voucher may offer.
pub const MAX_STOCK: i64 = 100_000_000;

/// Longest title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// A voucher's title, the same on every database: 1 to 200 characters, no
/// control characters (PostgreSQL cannot store U+0000 in text; the rule is
/// the same everywhere so every backend answers alike), no bidirectional
/// controls (an override or isolate makes "teapot\u{202E}gpj.exe" show as
/// "teapotexe.jpg"), no whitespace at either end (refused, not trimmed:
/// what is stored is what was sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Title(String);

impl Title {
    /// A checked title.
    ///
    /// # Errors
    /// [`Error::Invalid`] (field `title`) for a title breaking the rule.
    pub fn parse(title: &str) -> Result<Self> {
        let chars = title.chars().count();
        if !(1..=MAX_TITLE_CHARS).contains(&chars) {
            return Err(Error::invalid(
                "title",
                format!("must be 1 to {MAX_TITLE_CHARS} characters, not {chars}"),
            ));
        }
        if let Some(c) = title.chars().find(|c| c.is_control()) {
            return Err(Error::invalid(
                "title",
                format!(
                    "must not contain control characters (found U+{:04X})",
                    c as u32
                ),
            ));
        }
        if let Some(c) = title.chars().find(|&c| is_bidi_control(c)) {
            return Err(Error::invalid(
                "title",
                format!(
                    "must not contain bidirectional controls (found U+{:04X})",
                    c as u32
                ),
            ));
        }
        if title.trim() != title {
            return Err(Error::invalid(
                "title",
                "must not begin or end with whitespace",
            ));
        }
        Ok(Self(title.to_owned()))
    }

    /// The title.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The characters that change the direction text is shown in (Unicode's
/// embeddings, overrides, isolates and marks), which can make a text show
/// other than it reads.
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// How long a buyer has to pay when neither the voucher nor the service
/// says otherwise.
pub const DEFAULT_PAY_WITHIN: Duration = Duration::from_secs(15 * 60);

/// The shortest and the longest payment window a voucher may set.
pub const PAY_WITHIN_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(100)..=Duration::from_secs(7 * 24 * 3600);

/// The terms of a flash sale: how many, from when, until when; how long a
/// buyer has to pay, and whether a buyer whose order was given back
/// (cancelled, or not paid in time) may buy again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleTerms {
    stock: i64,
    begin_ms: i64,
    end_ms: i64,
    pay_within_ms: i64,
    rebuy_after_cancel: bool,
}

impl SaleTerms {
    /// Validated terms: `stock` in 1..=[`MAX_STOCK`], `begin < end`; a
    /// payment window of [`DEFAULT_PAY_WITHIN`], and buying again after a
    /// give-back allowed.
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
            pay_within_ms: DEFAULT_PAY_WITHIN.as_millis() as i64,
            rebuy_after_cancel: true,
        })
    }

    /// These terms with a payment window of `window`.
    ///
    /// # Errors
    /// [`Error::Invalid`] (field `pay_within_ms`) outside
    /// [`PAY_WITHIN_RANGE`].
    pub fn with_pay_within(mut self, window: Duration) -> Result<Self> {
        if !PAY_WITHIN_RANGE.contains(&window) {
            return Err(Error::invalid(
                "pay_within_ms",
                format!(
                    "{} ms is not in {}..={} ms",
                    window.as_millis(),
                    PAY_WITHIN_RANGE.start().as_millis(),
                    PAY_WITHIN_RANGE.end().as_millis()
                ),
            ));
        }
        self.pay_within_ms = window.as_millis() as i64;
        Ok(self)
    }

    /// These terms with buying again after a give-back allowed or not.
    pub fn with_rebuy_after_cancel(mut self, allowed: bool) -> Self {
        self.rebuy_after_cancel = allowed;
        self
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

    /// How long a buyer has to pay, in milliseconds from the purchase.
    pub fn pay_within_ms(&self) -> i64 {
        self.pay_within_ms
    }

    /// Whether a buyer whose order was given back may buy again.
    pub fn rebuy_after_cancel(&self) -> bool {
        self.rebuy_after_cancel
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
    use super::*;

    #[test]
    fn titles_follow_one_rule() {
        for bad in [
            "",
            " padded",
            "padded ",
            "nul\0inside",
            "tab\there",
            "bell\u{7}",
            "teapot\u{202E}gpj.exe",
            "mark\u{200F}",
            "isolate\u{2066}",
            "arabic\u{061C}mark",
        ] {
            assert!(Title::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Title::parse(&"x".repeat(MAX_TITLE_CHARS + 1)).is_err());
        for good in [
            "Hotpot for two",
            "火锅双人套餐",
            "a",
            &"é".repeat(MAX_TITLE_CHARS),
        ] {
            assert_eq!(Title::parse(good).unwrap().as_str(), good);
        }
    }

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
        let terms = SaleTerms::new(10, now, later).unwrap();
        for bad in [0, 99, 7 * 24 * 3600 * 1000 + 1] {
            let window = Duration::from_millis(bad);
            assert_eq!(
                field(terms.clone().with_pay_within(window)),
                "pay_within_ms"
            );
        }
        let short = terms.with_pay_within(Duration::from_millis(100)).unwrap();
        assert_eq!(short.pay_within_ms(), 100);
    }
}
