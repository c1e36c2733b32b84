//! The service's Redis as every view of the store takes it: one connection
//! and the prefix that every key of the service starts with.

use std::sync::Arc;

use super::connect::RedisConn;
use super::keys::VoucherKeys;

/// A connection (a server, a Sentinel service or a cluster) and the
/// service's key prefix. Cheap to clone; the fast path, the order id
/// blocks, the order streams, order lookups and the sale audit all take
/// one, so a key is always spelt under the same prefix.
///
/// ```no_run
/// # async fn run() -> Result<(), seckill::Error> {
/// let conn = seckill::store::connect("redis://127.0.0.1/").await?;
/// let redis = seckill::store::Redis::new(conn, "shop");
/// let sale = seckill::store::read_sale(&redis, 1).await?;
/// println!("stock left: {:?}", sale.stock);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redis {
    conn: RedisConn,
    prefix: Arc<str>,
}

impl Redis {
    /// `conn` with every key under `prefix`.
    pub fn new(conn: RedisConn, prefix: &str) -> Self {
        Self {
            conn,
            prefix: Arc::from(prefix),
        }
    }

    /// The connection (shared, cheap to clone).
    pub fn connection(&self) -> &RedisConn {
        &self.conn
    }

    /// A clone of the connection, to send commands on.
    pub(crate) fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The keys of voucher `voucher`'s sale.
    pub(crate) fn voucher(&self, voucher: i64) -> VoucherKeys {
        VoucherKeys::new(&self.prefix, voucher)
    }
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redis")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
