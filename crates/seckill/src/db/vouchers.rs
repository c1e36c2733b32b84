//! A sale's terms: creating vouchers and reading them back.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{first_column, Database};
use crate::domain::money::Money;
use crate::domain::now_ms;
use crate::domain::voucher::{Offer, RefundRestock, SaleTerms, Shop, Title};
use crate::error::{Error, Result};

/// The columns [`voucher_row`] reads, in its order.
macro_rules! voucher_columns {
    () => {
        "id, title, stock, begin_ms, end_ms, pay_within_ms, rebuy_after_cancel, \
         shop_id, shop_name, subtitle, rules, price_minor, face_value_minor, currency, \
         refund_restock"
    };
}

/// A voucher row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoucherRow {
    /// Id.
    pub id: i64,
    /// Title.
    pub title: String,
    /// Stock left in the database.
    pub stock: i64,
    /// Sale start (Unix ms).
    pub begin_ms: i64,
    /// Sale end, exclusive (Unix ms).
    pub end_ms: i64,
    /// How long a buyer has to pay (ms from the purchase).
    pub pay_within_ms: i64,
    /// Whether a buyer whose order was given back may buy again.
    pub rebuy_after_cancel: bool,
    /// The shop it is spent at, if named.
    pub shop: Option<Shop>,
    /// Sub-title (may be empty).
    pub subtitle: String,
    /// Rules shown to buyers (may be empty).
    pub rules: String,
    /// What a buyer pays.
    pub price: Money,
    /// What it is worth at its shop.
    pub face_value: Money,
    /// Whether refunded units go back on sale.
    pub refund_restock: RefundRestock,
}

/// A voucher's stock and sale window as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoucherWindow {
    /// Stock left in the database.
    pub stock: i64,
    /// Sale start (Unix ms).
    pub begin_ms: i64,
    /// Sale end, exclusive (Unix ms).
    pub end_ms: i64,
}

impl Database {
    /// Stores a new free voucher ([`Offer::free`]) and returns its id.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn create_voucher(&self, title: &Title, terms: &SaleTerms) -> Result<i64> {
        self.publish_voucher(title, &Offer::free(), terms).await
    }

    /// Stores a new voucher offering `offer` on `terms` and returns its id.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn publish_voucher(
        &self,
        title: &Title,
        offer: &Offer,
        terms: &SaleTerms,
    ) -> Result<i64> {
        let row: AnyRow = sqlx::query(self.sql(
            "INSERT INTO seckill_voucher \
             (title, stock, begin_ms, end_ms, created_ms, pay_within_ms, rebuy_after_cancel, \
              shop_id, shop_name, subtitle, rules, price_minor, face_value_minor, currency, \
              refund_restock) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        ))
        .bind(title.as_str())
        .bind(terms.stock())
        .bind(terms.begin_ms())
        .bind(terms.end_ms())
        .bind(now_ms())
        .bind(terms.pay_within_ms())
        .bind(i64::from(terms.rebuy_after_cancel()))
        .bind(offer.shop().map(|shop| shop.id))
        .bind(offer.shop().map(|shop| shop.name.clone()))
        .bind(offer.subtitle())
        .bind(offer.rules())
        .bind(offer.price().minor())
        .bind(offer.face_value().minor())
        .bind(offer.price().currency().code())
        .bind(offer.refund_restock().as_stored())
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Stock left in the database for voucher `id`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_stock(&self, id: i64) -> Result<Option<i64>> {
        let row = sqlx::query(self.sql("SELECT stock FROM seckill_voucher WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?)
    }

    /// Ids of every voucher (the pipeline's worklist).
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_ids(&self) -> Result<Vec<i64>> {
        let rows = sqlx::query("SELECT id FROM seckill_voucher ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        first_column(&rows)
    }

    /// Ids of the vouchers whose sale has not ended at `now_ms` (Unix ms):
    /// those whose Redis state still matters.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn open_voucher_ids(&self, now_ms: i64) -> Result<Vec<i64>> {
        let rows =
            sqlx::query(self.sql("SELECT id FROM seckill_voucher WHERE end_ms > ? ORDER BY id"))
                .bind(now_ms)
                .fetch_all(&self.pool)
                .await?;
        first_column(&rows)
    }

    /// Every voucher, newest first, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn vouchers(&self, limit: i64) -> Result<Vec<VoucherRow>> {
        let rows = sqlx::query(self.sql(concat!(
            "SELECT ",
            voucher_columns!(),
            " FROM seckill_voucher ORDER BY id DESC LIMIT ?"
        )))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(voucher_row).collect()
    }

    /// Voucher `id` as stored.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher(&self, id: i64) -> Result<Option<VoucherRow>> {
        let row = sqlx::query(self.sql(concat!(
            "SELECT ",
            voucher_columns!(),
            " FROM seckill_voucher WHERE id = ?"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(voucher_row).transpose()
    }

    /// The stock and sale window of voucher `id` as stored.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn voucher_window(&self, id: i64) -> Result<Option<VoucherWindow>> {
        let row = sqlx::query(
            self.sql("SELECT stock, begin_ms, end_ms FROM seckill_voucher WHERE id = ?"),
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|r| -> Result<_, sqlx::Error> {
                Ok(VoucherWindow {
                    stock: r.try_get(0)?,
                    begin_ms: r.try_get(1)?,
                    end_ms: r.try_get(2)?,
                })
            })
            .transpose()?)
    }
}

/// The `VoucherRow` of a `SELECT` of [`voucher_columns`].
fn voucher_row(r: &AnyRow) -> Result<VoucherRow> {
    let currency: String = r.try_get(13)?;
    let money = |column| -> Result<Money> { Money::from_stored(r.try_get(column)?, &currency) };
    let shop = match (
        r.try_get::<Option<i64>, _>(7)?,
        r.try_get::<Option<String>, _>(8)?,
    ) {
        (Some(id), Some(name)) => Some(Shop { id, name }),
        (None, None) => None,
        _ => {
            return Err(Error::Protocol(
                "a shop id without a name, or the reverse".into(),
            ))
        }
    };
    Ok(VoucherRow {
        id: r.try_get(0)?,
        title: r.try_get(1)?,
        stock: r.try_get(2)?,
        begin_ms: r.try_get(3)?,
        end_ms: r.try_get(4)?,
        pay_within_ms: r.try_get(5)?,
        rebuy_after_cancel: r.try_get::<i64, _>(6)? == 1,
        shop,
        subtitle: r.try_get(9)?,
        rules: r.try_get(10)?,
        price: money(11)?,
        face_value: money(12)?,
        refund_restock: RefundRestock::from_stored(&r.try_get::<String, _>(14)?)?,
    })
}
