//! Where Redis says a buyer's order is: pending in the voucher's stream,
//! or failed (dead-lettered). One round trip: the voucher's `order-of`
//! hash (written by the purchase) and `failed` hash (written by the
//! dead-lettering). Only a buyer from before those hashes existed is looked
//! for in the streams, as before (bounded scans).

use redis::streams::StreamRangeReply;

use crate::domain::order::OrderState;
use crate::error::Result;
use crate::store::keys::{dead_letter_stream, VoucherKeys};
use crate::store::{Redis, RedisConn};
use crate::OrderId;

/// Most stream entries one lookup reads per stream.
const SCAN_LIMIT: usize = 10_000;

/// `user`'s order for `voucher` as Redis knows it: `Pending` (accepted, not
/// known stored) or `Failed`; `None` if Redis has no order of the user.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) if Redis fails.
#[tracing::instrument(level = "debug", skip(redis))]
pub async fn order_in_redis(
    redis: &Redis,
    voucher: i64,
    user: i64,
) -> Result<Option<(OrderId, OrderState)>> {
    let keys = redis.voucher(voucher);
    let mut conn = redis.conn();
    let (order, failed, buyer): (Option<i64>, Option<i64>, bool) = redis::pipe()
        .hget(&keys.order_of, user)
        .hget(&keys.failed, user)
        .sismember(&keys.buyers, user)
        .query_async(&mut conn)
        .await?;
    match (order, failed, buyer) {
        (_, Some(id), _) => Ok(Some((OrderId::from_i64(id)?, OrderState::Failed))),
        (Some(id), None, _) => Ok(Some((OrderId::from_i64(id)?, OrderState::Pending))),
        (None, None, false) => Ok(None),
        // A buyer without an order-of entry bought before this layout:
        // look in the streams, as it was done then.
        (None, None, true) => {
            scan(&mut conn, &keys, &dead_letter_stream(redis.prefix()), user).await
        }
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
