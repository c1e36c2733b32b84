//! A sale's terms: creating vouchers and reading them back.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{first_column, Database};
use crate::domain::money::Money;
use crate::domain::now_ms;
use crate::domain::voucher::{Offer, RefundRestock, SaleTerms, Shop, Title};
use crate::domain::waiting_room::RoomSettings;
use crate::error::{Error, Result};

/// The columns [`voucher_row`] reads, in its order.
macro_rules! voucher_columns {
    () => {
        "id, title, stock, begin_ms, end_ms, pay_within_ms, rebuy_after_cancel, \
         shop_id, shop_name, subtitle, rules, price_minor, face_value_minor, currency, \
         refund_restock, room_admit_per_s, room_max_active, room_opens_before_ms, \
         room_pass_ttl_ms, room_paused"
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
    /// Its waiting room's settings (`None`: no room).
    pub room: Option<RoomSettings>,
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
    /// Whether a waiting room stands in front of the sale (a purchase then
    /// needs a pass).
    pub room: bool,
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
        self.publish_voucher_with_room(title, offer, terms, None)
            .await
    }

    /// Stores a new voucher offering `offer` on `terms`, with a waiting
    /// room in front of its sale if `room` is given, and returns its id.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn publish_voucher_with_room(
        &self,
        title: &Title,
        offer: &Offer,
        terms: &SaleTerms,
        room: Option<&RoomSettings>,
    ) -> Result<i64> {
        let room = RoomColumns::of(room);
        let row: AnyRow = sqlx::query(self.sql(
            "INSERT INTO seckill_voucher \
             (title, stock, begin_ms, end_ms, created_ms, pay_within_ms, rebuy_after_cancel, \
              shop_id, shop_name, subtitle, rules, price_minor, face_value_minor, currency, \
              refund_restock, room_admit_per_s, room_max_active, room_opens_before_ms, \
              room_pass_ttl_ms, room_paused) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
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
        .bind(room.admit_per_s)
        .bind(room.max_active)
        .bind(room.opens_before_ms)
        .bind(room.pass_ttl_ms)
        .bind(room.paused)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Sets (or with `None` removes) the waiting room of voucher `id`;
    /// `false` if there is no such voucher.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn set_room(&self, id: i64, room: Option<&RoomSettings>) -> Result<bool> {
        let room = RoomColumns::of(room);
        let done = sqlx::query(self.sql(
            "UPDATE seckill_voucher SET room_admit_per_s = ?, room_max_active = ?, \
             room_opens_before_ms = ?, room_pass_ttl_ms = ?, room_paused = ? WHERE id = ?",
        ))
        .bind(room.admit_per_s)
        .bind(room.max_active)
        .bind(room.opens_before_ms)
        .bind(room.pass_ttl_ms)
        .bind(room.paused)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
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

    /// The vouchers whose sale has not ended at `now_ms` and that have a
    /// waiting room.
    ///
    /// # Errors
    /// [`Error::Database`] on failure.
    pub async fn open_rooms(&self, now_ms: i64) -> Result<Vec<VoucherRow>> {
        let rows = sqlx::query(self.sql(concat!(
            "SELECT ",
            voucher_columns!(),
            " FROM seckill_voucher WHERE end_ms > ? AND room_admit_per_s IS NOT NULL"
        )))
        .bind(now_ms)
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
        let row = sqlx::query(self.sql(
            "SELECT stock, begin_ms, end_ms, room_admit_per_s IS NOT NULL \
                 FROM seckill_voucher WHERE id = ?",
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row
            .map(|r| -> Result<_, sqlx::Error> {
                Ok(VoucherWindow {
                    stock: r.try_get(0)?,
                    begin_ms: r.try_get(1)?,
                    end_ms: r.try_get(2)?,
                    room: truth(&r, 3)?,
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
        room: room_settings(r, 15)?,
    })
}

/// A boolean expression's value: databases answer it as an integer or a
/// boolean.
fn truth(r: &AnyRow, column: usize) -> Result<bool, sqlx::Error> {
    r.try_get::<bool, _>(column)
        .or_else(|_| r.try_get::<i64, _>(column).map(|n| n != 0))
}

/// The waiting room's columns as stored (`room_admit_per_s` NULL: none).
struct RoomColumns {
    admit_per_s: Option<i64>,
    max_active: Option<i64>,
    opens_before_ms: i64,
    pass_ttl_ms: i64,
    paused: i64,
}

impl RoomColumns {
    fn of(room: Option<&RoomSettings>) -> Self {
        let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        match room {
            Some(room) => Self {
                admit_per_s: Some(i64::from(room.admit_per_s)),
                max_active: room.max_active.map(i64::from),
                opens_before_ms: as_i64(room.opens_before_ms),
                pass_ttl_ms: as_i64(room.pass_ttl_ms),
                paused: i64::from(room.paused),
            },
            None => Self {
                admit_per_s: None,
                max_active: None,
                opens_before_ms: 0,
                pass_ttl_ms: 0,
                paused: 0,
            },
        }
    }
}

/// The waiting room of a `SELECT` of [`voucher_columns`] whose room columns
/// begin at `first`.
fn room_settings(r: &AnyRow, first: usize) -> Result<Option<RoomSettings>> {
    let Some(admit_per_s) = r.try_get::<Option<i64>, _>(first)? else {
        return Ok(None);
    };
    let out_of_range =
        |what: &str| Error::Protocol(format!("stored waiting room: {what} out of range"));
    let max_active = r
        .try_get::<Option<i64>, _>(first + 1)?
        .map(|n| u32::try_from(n).map_err(|_| out_of_range("max_active")))
        .transpose()?;
    Ok(Some(RoomSettings {
        admit_per_s: u32::try_from(admit_per_s).map_err(|_| out_of_range("admit_per_s"))?,
        max_active,
        opens_before_ms: u64::try_from(r.try_get::<i64, _>(first + 2)?)
            .map_err(|_| out_of_range("opens_before_ms"))?,
        pass_ttl_ms: u64::try_from(r.try_get::<i64, _>(first + 3)?)
            .map_err(|_| out_of_range("pass_ttl_ms"))?,
        paused: r.try_get::<i64, _>(first + 4)? == 1,
    }))
}
