//! The Redis side of a sale as `reconcile` compares it with the database,
//! and the two changes it may make: buyers added, stock lowered.

use redis::streams::StreamRangeReply;

use crate::error::Result;
use crate::store::Redis;

static LOWER_STOCK: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../scripts/lower_stock.lua")));

/// One voucher's sale as Redis holds it, read in one round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSale {
    /// Live stock (`None`: the sale is not loaded).
    pub stock: Option<i64>,
    /// Users recorded as buyers.
    pub buyers: Vec<i64>,
    /// Orders accepted and still in the stream: (user id, order id); an
    /// entry missing either is left out.
    pub in_stream: Vec<(i64, i64)>,
    /// Entries in the stream, malformed ones included.
    pub stream_len: usize,
    /// Orders whose unit Redis took back.
    pub returned: Vec<i64>,
}

/// Reads voucher `voucher`'s sale under `prefix`.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) if Redis fails.
#[tracing::instrument(level = "debug", skip(redis))]
pub async fn read_sale(redis: &Redis, voucher: i64) -> Result<RedisSale> {
    let keys = redis.voucher(voucher);
    let (stock, buyers, stream, returned): (Option<i64>, Vec<i64>, StreamRangeReply, Vec<i64>) =
        redis::pipe()
            .hget(&keys.voucher, "stock")
            .smembers(&keys.buyers)
            .cmd("XRANGE")
            .arg(&keys.orders)
            .arg("-")
            .arg("+")
            .smembers(&keys.returned)
            .query_async(&mut redis.conn())
            .await?;
    Ok(RedisSale {
        stock,
        buyers,
        returned,
        stream_len: stream.ids.len(),
        in_stream: stream
            .ids
            .iter()
            .filter_map(|e| Some((e.get("user")?, e.get("order")?)))
            .collect(),
    })
}

/// Adds `users` to voucher `voucher`'s buyers; how many were new.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) if Redis fails.
#[tracing::instrument(level = "debug", skip(redis, users), fields(users = users.len()))]
pub async fn add_buyers(redis: &Redis, voucher: i64, users: &[i64]) -> Result<usize> {
    if users.is_empty() {
        return Ok(0);
    }
    let keys = redis.voucher(voucher);
    Ok(redis::cmd("SADD")
        .arg(&keys.buyers)
        .arg(users)
        .query_async(&mut redis.conn())
        .await?)
}

/// Lowers voucher `voucher`'s stock from `from` to `to`, only if it is
/// still `from` (nobody bought meanwhile); whether it did.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) if Redis fails.
#[tracing::instrument(level = "debug", skip(redis))]
pub async fn lower_stock(redis: &Redis, voucher: i64, from: i64, to: i64) -> Result<bool> {
    let keys = redis.voucher(voucher);
    let lowered: i64 = LOWER_STOCK
        .key(&keys.voucher)
        .arg(from)
        .arg(to)
        .invoke_async(&mut redis.conn())
        .await?;
    Ok(lowered > 0)
}
