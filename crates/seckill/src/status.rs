//! Where an order is: stored, on its way, or failed.
//!
//! An accepted order is first an entry in its voucher's stream (pending),
//! then a database row (created), or, if the pipeline gave up on it, an
//! entry in the dead-letter stream (failed). A lookup is one indexed query
//! and one Redis round trip: the database first (the common case), then the
//! voucher's `order-of` hash (written by the purchase) and `failed` hash
//! (written by the dead-lettering). Only a buyer from before those hashes
//! existed is looked for in the streams, as before (bounded scans).

use crate::store::RedisConn;
use redis::streams::StreamRangeReply;
use serde::Serialize;

use crate::db::Database;
use crate::error::Result;
use crate::store::VoucherKeys;
use crate::OrderId;

/// Most stream entries one lookup reads per stream.
const SCAN_LIMIT: usize = 10_000;

/// The state of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    /// Accepted, on its way to the database.
    Pending,
    /// Stored in the database.
    Created,
    /// The pipeline gave up on it (see the dead-letter stream).
    Failed,
}

/// `user_id`'s order for voucher `voucher_id`, if any, and its state.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) or
/// [`Error::Database`](crate::Error::Database).
pub async fn order_status(
    conn: &RedisConn,
    db: &Database,
    prefix: &str,
    dead_letters: &str,
    voucher_id: i64,
    user_id: i64,
) -> Result<Option<(OrderId, OrderState)>> {
    if let Some(id) = db.order_of(user_id, voucher_id).await? {
        return Ok(Some((OrderId::from_i64(id)?, OrderState::Created)));
    }
    let keys = VoucherKeys::new(prefix, voucher_id);
    let mut conn = conn.clone();
    let (order, failed, buyer): (Option<i64>, Option<i64>, bool) = redis::pipe()
        .hget(&keys.order_of, user_id)
        .hget(&keys.failed, user_id)
        .sismember(&keys.buyers, user_id)
        .query_async(&mut conn)
        .await?;
    match (order, failed, buyer) {
        (_, Some(id), _) => Ok(Some((OrderId::from_i64(id)?, OrderState::Failed))),
        (Some(id), None, _) => Ok(Some((OrderId::from_i64(id)?, OrderState::Pending))),
        (None, None, false) => Ok(None),
        // A buyer without an order-of entry bought before this layout:
        // look in the streams, as it was done then.
        (None, None, true) => scan(&mut conn, &keys, dead_letters, user_id).await,
    }
}

/// The order of `user_id` found by scanning the voucher's stream and the
/// dead-letter stream (bounded): for sales older than the order-of hash.
async fn scan(
    conn: &mut RedisConn,
    keys: &VoucherKeys,
    dead_letters: &str,
    user_id: i64,
) -> Result<Option<(OrderId, OrderState)>> {
    let user = user_id.to_string();
    let pending: StreamRangeReply = redis::cmd("XRANGE")
        .arg(&keys.orders)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(SCAN_LIMIT)
        .query_async(conn)
        .await?;
    if let Some(id) = find(&pending, &user, None) {
        return Ok(Some((id, OrderState::Pending)));
    }
    let dead: StreamRangeReply = redis::cmd("XREVRANGE")
        .arg(dead_letters)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(SCAN_LIMIT)
        .query_async(conn)
        .await?;
    Ok(find(&dead, &user, Some(&keys.orders)).map(|id| (id, OrderState::Failed)))
}

/// The order id of `user`'s entry (in `stream`, for dead letters).
fn find(entries: &StreamRangeReply, user: &str, stream: Option<&str>) -> Option<OrderId> {
    entries
        .ids
        .iter()
        .filter(|e| e.get::<String>("user").as_deref() == Some(user))
        .filter(|e| stream.is_none_or(|s| e.get::<String>("stream").as_deref() == Some(s)))
        .find_map(|e| OrderId::from_i64(e.get("order")?).ok())
}
