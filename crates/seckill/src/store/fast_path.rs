//! The atomic Redis purchase (seed 002's fast path).

use std::sync::LazyLock;

use crate::store::RedisConn;
use redis::Script;

use crate::domain::voucher::SaleTerms;
use crate::error::{Error, Result};
use crate::store::keys::VoucherKeys;
use crate::store::order_ids::OrderIdGenerator;
use crate::OrderId;

static PURCHASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/purchase.lua")));

/// Why a purchase was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The sale has not begun.
    NotStarted,
    /// The sale is over.
    Ended,
    /// No stock left.
    SoldOut,
    /// This user already has an order for this voucher.
    AlreadyBought,
    /// No such voucher is on sale.
    UnknownVoucher,
}

/// The outcome of a purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purchase {
    /// Accepted: the order is in the voucher's stream under this id.
    Accepted(OrderId),
    /// Refused; nothing changed.
    Refused(Refusal),
}

/// Purchases decided entirely in Redis, one script call each.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> seckill::Result<()> {
/// use std::time::{Duration, SystemTime};
/// use seckill::domain::voucher::SaleTerms;
/// use seckill::store::{connect, FastPath, OrderIdGenerator, Purchase, Refusal};
///
/// let redis = testkit::RedisServer::start();
/// let conn = connect(&redis.url()).await?;
/// let shop = FastPath::new(conn.clone(), "shop", OrderIdGenerator::new(conn, "shop", 100)?);
///
/// let now = SystemTime::now();
/// shop.load_voucher(1, &SaleTerms::new(1, now, now + Duration::from_secs(60))?).await?;
/// assert!(matches!(shop.purchase(1, 42).await?, Purchase::Accepted(_)));
/// assert_eq!(shop.purchase(1, 42).await?, Purchase::Refused(Refusal::AlreadyBought));
/// assert_eq!(shop.purchase(1, 43).await?, Purchase::Refused(Refusal::SoldOut));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FastPath {
    conn: RedisConn,
    prefix: String,
    ids: OrderIdGenerator,
}

impl FastPath {
    /// A fast path over `conn`, with keys under `prefix` and order ids from
    /// `ids`.
    pub fn new(conn: RedisConn, prefix: impl Into<String>, ids: OrderIdGenerator) -> Self {
        Self {
            conn,
            prefix: prefix.into(),
            ids,
        }
    }

    /// Puts voucher `id` on sale with `terms`. Loading again updates the
    /// window but never resets the stock of a sale already loaded.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn load_voucher(&self, id: i64, terms: &SaleTerms) -> Result<()> {
        let keys = VoucherKeys::new(&self.prefix, id);
        let () = redis::pipe()
            .atomic()
            .hset_nx(&keys.voucher, "stock", terms.stock())
            .ignore()
            .hset(&keys.voucher, "begin_ms", terms.begin_ms())
            .ignore()
            .hset(&keys.voucher, "end_ms", terms.end_ms())
            .ignore()
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Tries to buy voucher `voucher_id` for `user_id`.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable (then nothing was bought:
    /// the script either ran whole or not at all).
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the purchase takes effect even if this
    /// future is dropped, and its order id is lost to the caller (the order
    /// is still in the stream).
    pub async fn purchase(&self, voucher_id: i64, user_id: i64) -> Result<Purchase> {
        let order = self.ids.next_id().await?;
        let keys = VoucherKeys::new(&self.prefix, voucher_id);
        let code: i64 = PURCHASE
            .key(&keys.voucher)
            .key(&keys.buyers)
            .key(&keys.orders)
            .arg(user_id)
            .arg(order.as_i64())
            .arg(voucher_id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match code {
            0 => Purchase::Accepted(order),
            1 => Purchase::Refused(Refusal::NotStarted),
            2 => Purchase::Refused(Refusal::Ended),
            3 => Purchase::Refused(Refusal::SoldOut),
            4 => Purchase::Refused(Refusal::AlreadyBought),
            5 => Purchase::Refused(Refusal::UnknownVoucher),
            other => return Err(Error::Protocol(format!("purchase script returned {other}"))),
        })
    }

    /// The Redis connection (shared, cheap to clone).
    pub fn connection(&self) -> &RedisConn {
        &self.conn
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether Redis answers.
    ///
    /// # Errors
    /// [`Error::Redis`] if it does not.
    pub async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Stock left in Redis for voucher `id`, if it is loaded.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn remaining_stock(&self, id: i64) -> Result<Option<i64>> {
        Ok(self.remaining_stocks(&[id]).await?.pop().flatten())
    }

    /// Stock left in Redis for each of `ids` (in order), sent at once (one
    /// command per voucher: on a cluster the vouchers live on different
    /// slots, which one pipeline cannot span).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn remaining_stocks(&self, ids: &[i64]) -> Result<Vec<Option<i64>>> {
        if ids.is_empty() {
            return Ok(Vec::new()); // an empty pipeline is an error to redis-rs
        }
        let reads = ids.iter().map(|id| {
            let mut conn = self.conn.clone();
            let key = VoucherKeys::new(&self.prefix, *id).voucher;
            async move {
                redis::cmd("HGET")
                    .arg(key)
                    .arg("stock")
                    .query_async::<Option<i64>>(&mut conn)
                    .await
            }
        });
        Ok(futures_util::future::try_join_all(reads).await?)
    }
}
