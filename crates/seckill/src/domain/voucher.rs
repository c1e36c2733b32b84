//! A flash-sale voucher: its title, what a shop offers with it (its
//! shop, texts and money) and its sale terms.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::domain::money::Money;
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
        check_text("title", title, 1..=MAX_TITLE_CHARS, Lines::One)?;
        Ok(Self(title.to_owned()))
    }

    /// The title.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether a text may span lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lines {
    /// One line: no control character at all.
    One,
    /// Line feeds (`\n`) allowed, no other control character.
    Many,
}

/// The rule every text a shop publishes follows (see [`Title`]): a length
/// in characters within `chars`, no control characters (line feeds only
/// where `lines` allows), no bidirectional controls, no whitespace at
/// either end.
fn check_text(
    field: &'static str,
    text: &str,
    chars: std::ops::RangeInclusive<usize>,
    lines: Lines,
) -> Result<()> {
    let count = text.chars().count();
    if !chars.contains(&count) {
        return Err(Error::invalid(
            field,
            format!(
                "must be {} to {} characters, not {count}",
                chars.start(),
                chars.end()
            ),
        ));
    }
    let allowed = |c: char| lines == Lines::Many && c == '\n';
    if let Some(c) = text.chars().find(|&c| c.is_control() && !allowed(c)) {
        let lines = if lines == Lines::Many {
            " other than line feeds"
        } else {
            ""
        };
        return Err(Error::invalid(
            field,
            format!(
                "must not contain control characters{lines} (found U+{:04X})",
                c as u32
            ),
        ));
    }
    if let Some(c) = text.chars().find(|&c| is_bidi_control(c)) {
        return Err(Error::invalid(
            field,
            format!(
                "must not contain bidirectional controls (found U+{:04X})",
                c as u32
            ),
        ));
    }
    if text.trim() != text {
        return Err(Error::invalid(
            field,
            "must not begin or end with whitespace",
        ));
    }
    Ok(())
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

/// Longest sub-title, in characters.
pub const MAX_SUBTITLE_CHARS: usize = 200;

/// Longest rules text, in characters.
pub const MAX_RULES_CHARS: usize = 2_000;

/// Longest shop name, in characters.
pub const MAX_SHOP_NAME_CHARS: usize = 100;

/// The shop a voucher is spent at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shop {
    /// The shop's id in the shop's own system (positive).
    pub id: i64,
    /// Its name as buyers see it (1 to [`MAX_SHOP_NAME_CHARS`] characters,
    /// the title's rule).
    pub name: String,
}

impl Shop {
    /// A checked shop.
    ///
    /// # Errors
    /// [`Error::Invalid`] (`shop.id`, `shop.name`).
    pub fn new(id: i64, name: &str) -> Result<Self> {
        if id < 1 {
            return Err(Error::invalid("shop.id", format!("{id} is not positive")));
        }
        check_text("shop.name", name, 1..=MAX_SHOP_NAME_CHARS, Lines::One)?;
        Ok(Self {
            id,
            name: name.to_owned(),
        })
    }
}

/// Whether a refunded order's unit goes back on sale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundRestock {
    /// Back on sale if the sale is still open when the refund is made.
    #[default]
    WhileOpen,
    /// Never: a refunded unit stays sold.
    Never,
}

impl RefundRestock {
    /// As the database stores it.
    pub fn as_stored(self) -> &'static str {
        match self {
            RefundRestock::WhileOpen => "while_open",
            RefundRestock::Never => "never",
        }
    }

    /// A stored value read back.
    ///
    /// # Errors
    /// [`Error::Protocol`] for a value no check lets in.
    pub fn from_stored(text: &str) -> Result<Self> {
        match text {
            "while_open" => Ok(RefundRestock::WhileOpen),
            "never" => Ok(RefundRestock::Never),
            other => Err(Error::Protocol(format!(
                "refund_restock {other:?} in the database"
            ))),
        }
    }
}

/// What a shop offers with a voucher besides its title: where it is spent,
/// what it says, what it costs and what it is worth.
///
/// A price is fixed when the voucher is published: every order copies it
/// when it is stored, and no route changes it afterwards (a shop that
/// wants another price publishes another voucher), so an order's amount is
/// the price the buyer saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    shop: Option<Shop>,
    subtitle: String,
    rules: String,
    price: Money,
    face_value: Money,
    refund_restock: RefundRestock,
}

impl Offer {
    /// A free voucher (price and face value zero, no currency), of no
    /// named shop, with no sub-title or rules.
    pub fn free() -> Self {
        Self {
            shop: None,
            subtitle: String::new(),
            rules: String::new(),
            price: Money::zero(),
            face_value: Money::zero(),
            refund_restock: RefundRestock::default(),
        }
    }

    /// A voucher sold at `price` and worth `face_value` at its shop, both
    /// in one currency; a price above the face value only when
    /// `allow_price_above_face`.
    ///
    /// # Errors
    /// [`Error::Invalid`] (`face_value_minor`, `price_minor`).
    pub fn priced(price: Money, face_value: Money, allow_price_above_face: bool) -> Result<Self> {
        if price.currency() != face_value.currency() {
            return Err(Error::invalid(
                "face_value_minor",
                "must be in the price's currency",
            ));
        }
        if price.minor() > face_value.minor() && !allow_price_above_face {
            return Err(Error::invalid(
                "price_minor",
                format!(
                    "{} is above the face value {} (set allow_price_above_face to publish it)",
                    price.minor(),
                    face_value.minor()
                ),
            ));
        }
        Ok(Self {
            price,
            face_value,
            ..Self::free()
        })
    }

    /// This offer spent at `shop`.
    pub fn at_shop(mut self, shop: Shop) -> Self {
        self.shop = Some(shop);
        self
    }

    /// This offer with sub-title `subtitle` (0 to [`MAX_SUBTITLE_CHARS`]
    /// characters, one line, the title's rule otherwise).
    ///
    /// # Errors
    /// [`Error::Invalid`] (`subtitle`).
    pub fn with_subtitle(mut self, subtitle: &str) -> Result<Self> {
        check_text("subtitle", subtitle, 0..=MAX_SUBTITLE_CHARS, Lines::One)?;
        self.subtitle = subtitle.to_owned();
        Ok(self)
    }

    /// This offer with the rules text `rules` shown to buyers (0 to
    /// [`MAX_RULES_CHARS`] characters; line feeds allowed, the title's rule
    /// otherwise).
    ///
    /// # Errors
    /// [`Error::Invalid`] (`rules`).
    pub fn with_rules(mut self, rules: &str) -> Result<Self> {
        check_text("rules", rules, 0..=MAX_RULES_CHARS, Lines::Many)?;
        self.rules = rules.to_owned();
        Ok(self)
    }

    /// This offer with refunded units going back on sale as `restock` says.
    pub fn with_refund_restock(mut self, restock: RefundRestock) -> Self {
        self.refund_restock = restock;
        self
    }

    /// The shop, if named.
    pub fn shop(&self) -> Option<&Shop> {
        self.shop.as_ref()
    }

    /// The sub-title (may be empty).
    pub fn subtitle(&self) -> &str {
        &self.subtitle
    }

    /// The rules (may be empty).
    pub fn rules(&self) -> &str {
        &self.rules
    }

    /// What a buyer pays.
    pub fn price(&self) -> Money {
        self.price
    }

    /// What the voucher is worth at its shop.
    pub fn face_value(&self) -> Money {
        self.face_value
    }

    /// Whether refunded units go back on sale.
    pub fn refund_restock(&self) -> RefundRestock {
        self.refund_restock
    }
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
    fn a_shops_texts_follow_the_titles_rule() {
        let offer = Offer::free();
        assert!(offer.clone().with_subtitle("").is_ok());
        assert!(offer.clone().with_subtitle("Two people, any day").is_ok());
        for bad in [" padded", "line\nbreak", "teapot\u{202E}gpj.exe", "nul\0"] {
            assert!(offer.clone().with_subtitle(bad).is_err(), "{bad:?}");
        }
        let too_long = "x".repeat(MAX_SUBTITLE_CHARS + 1);
        assert!(offer.clone().with_subtitle(&too_long).is_err());
        assert!(offer
            .clone()
            .with_rules("One per table.\nNot on holidays.")
            .is_ok());
        for bad in [
            "tab\there",
            "cr\r\nlf",
            "\nleading",
            "bell\u{7}",
            "rlo\u{202E}",
        ] {
            assert!(offer.clone().with_rules(bad).is_err(), "{bad:?}");
        }
        assert!(offer.with_rules(&"x".repeat(MAX_RULES_CHARS + 1)).is_err());
        assert!(Shop::new(7, "Hotpot House").is_ok());
        let field = |r: Result<Shop>| match r {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(Shop::new(0, "x")), "shop.id");
        assert_eq!(field(Shop::new(-3, "x")), "shop.id");
        assert_eq!(field(Shop::new(1, "")), "shop.name");
        assert_eq!(field(Shop::new(1, "a\u{2066}b")), "shop.name");
    }

    #[test]
    fn a_price_is_at_most_the_face_value_unless_allowed() {
        use crate::domain::money::Currency;
        let cny = Currency::parse("currency", "CNY").unwrap();
        let eur = Currency::parse("currency", "EUR").unwrap();
        let money = |minor, currency| Money::new("x", minor, currency).unwrap();
        let field = |r: Result<Offer>| match r {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert!(Offer::priced(money(1990, cny), money(5000, cny), false).is_ok());
        assert!(Offer::priced(money(5000, cny), money(5000, cny), false).is_ok());
        assert_eq!(
            field(Offer::priced(money(6000, cny), money(5000, cny), false)),
            "price_minor"
        );
        assert!(Offer::priced(money(6000, cny), money(5000, cny), true).is_ok());
        assert_eq!(
            field(Offer::priced(money(100, cny), money(100, eur), false)),
            "face_value_minor"
        );
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
