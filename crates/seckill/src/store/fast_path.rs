//! The atomic Redis purchase.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::store::reachability::{self, Admission, Reachability};
use crate::store::replica_ack::Acker;
use crate::store::verification::{self, History};
use crate::store::{Redis, RedisConn};
use redis::Script;

use crate::domain::purchase::{Purchase, Refusal};
use crate::domain::voucher::SaleTerms;
use crate::error::{Error, Result};
use crate::store::order_ids::OrderIdGenerator;

static PURCHASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/purchase.lua")));

static TAKE_BACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/take_back.lua")));

/// What [`FastPath::take_back`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeBack {
    /// The unit is on sale again.
    TakenBack,
    /// It was taken back before: nothing changed.
    Already,
    /// Redis has no state of this sale (lost, or never loaded): nothing
    /// changed; a repair restores it from the database, unit included.
    NoSale,
}

/// How long an instance answers "sold out" for a voucher from memory after
/// Redis last said so, without asking again. Sold out stays sold out in a
/// sale, except after a repair that gives back units of orders Redis lost
/// (`repair`): an instance that did not run it learns within this time.
pub const SOLD_OUT_MEMORY: Duration = Duration::from_secs(1);

/// A sale as the voucher's hash in Redis keeps it: what a purchase checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaleHash {
    /// Units left (written only where the hash has none yet).
    pub stock: i64,
    /// Sale start (Unix ms).
    pub begin_ms: i64,
    /// Sale end, exclusive (Unix ms).
    pub end_ms: i64,
    /// Whether a buyer whose order was given back may buy again.
    pub rebuy: bool,
    /// Whether a waiting room stands in front of the sale: a purchase then
    /// needs a pass.
    pub room: bool,
}

/// The purchase script's answer: its code, and for an accepted purchase
/// with a history key the history its server's sale state was verified for
/// (`None` if none is recorded there).
struct PurchaseReply {
    code: i64,
    history: Option<String>,
}

impl redis::FromRedisValue for PurchaseReply {
    fn from_redis_value(v: redis::Value) -> std::result::Result<Self, redis::ParsingError> {
        let redis::Value::Array(items) = v else {
            return Ok(Self {
                code: i64::from_redis_value(v)?,
                history: None,
            });
        };
        let mut items = items.into_iter();
        let code = items
            .next()
            .ok_or_else(|| redis::ParsingError::from("an empty purchase answer".to_owned()))?;
        Ok(Self {
            code: i64::from_redis_value(code)?,
            history: items
                .next()
                .map(Option::<String>::from_redis_value)
                .transpose()?
                .flatten(),
        })
    }
}

/// Purchases decided entirely in Redis, one script call each.
///
/// The purchase script is sent by hash (`EVALSHA`) and never loaded
/// implicitly: Redis forgets its scripts when it restarts, so a purchase
/// answered `NOSCRIPT` means Redis restarted (and may have lost or rolled
/// back the sale's state). It fails with [`Error::SaleUnverified`] until
/// someone has checked the state against the database and called
/// [`FastPath::arm`] (the service does both: `repair`). A server whose
/// data changed hands without a restart (a replica promoted, a failback)
/// is disarmed when a Sentinel connection moves to it, unless its data was
/// verified for its replication history (`store::verification`).
///
/// A voucher Redis called sold out is answered from memory for
/// [`SOLD_OUT_MEMORY`], at no Redis round trip (a buyer asking again then
/// hears `SoldOut`, not `AlreadyBought`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> seckill::Result<()> {
/// use std::time::{Duration, SystemTime};
/// use seckill::domain::voucher::SaleTerms;
/// use seckill::domain::purchase::{Purchase, Refusal};
/// use seckill::store::{connect, FastPath, OrderIdGenerator, Redis};
///
/// let server = testkit::RedisServer::start();
/// let redis = Redis::new(connect(&server.url()).await?, "shop");
/// let shop = FastPath::new(redis.clone(), OrderIdGenerator::new(redis, 100)?);
///
/// let now = SystemTime::now();
/// shop.load_voucher(1, &SaleTerms::new(1, now, now + Duration::from_secs(60))?).await?;
/// shop.arm(1).await?; // a fresh Redis: no state to verify first
/// assert!(matches!(shop.purchase(1, 42).await?, Purchase::Accepted(_)));
/// assert_eq!(shop.purchase(1, 42).await?, Purchase::Refused(Refusal::AlreadyBought));
/// assert_eq!(shop.purchase(1, 43).await?, Purchase::Refused(Refusal::SoldOut));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct FastPath {
    redis: Redis,
    ids: OrderIdGenerator,
    /// Vouchers Redis called sold out, and when.
    sold_out: Mutex<HashMap<i64, Instant>>,
    /// Confirms accepted purchases on replicas (`None`: the primary's word
    /// is enough).
    acker: Option<Acker>,
    /// Whether Redis was reachable for the last purchases.
    reachability: Reachability,
}

/// How many replicas must have an accepted purchase before it is answered
/// `accepted`, and how long to wait for them (Redis `WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAck {
    /// Replicas that must confirm (at least 1).
    pub replicas: u32,
    /// Longest wait for them (at least 1 ms).
    pub timeout: Duration,
}

impl FastPath {
    /// A fast path over `redis`, with order ids from `ids`. On a Sentinel
    /// connection, every master it moves to is checked before purchases go
    /// there (see the type's docs), and the master it leaves stops taking
    /// purchases.
    pub fn new(redis: Redis, ids: OrderIdGenerator) -> Self {
        if let RedisConn::Sentinel(conn) = redis.connection() {
            conn.on_switch(verification::on_switch(
                crate::store::keys::verified_history(redis.prefix()),
            ));
        }
        Self {
            redis,
            ids,
            sold_out: Mutex::new(HashMap::new()),
            acker: None,
            reachability: Reachability::default(),
        }
    }

    /// Answers a purchase `accepted` only once `ack.replicas` replicas have
    /// it; an order they did not confirm in `ack.timeout` fails with
    /// [`Error::NotReplicated`]. Confirmation is asked on `acks`, a
    /// connection of its own, for many purchases at once (`replica_ack`).
    /// What this buys: a failover to one of those replicas keeps every order
    /// answered `accepted`. Redis 7.0 has no `WAITAOF` (7.2): a replica's
    /// own disk is not waited for.
    ///
    /// A confirmation counts only if it comes from the master, in the
    /// replication history, that took the purchase: the one its sale state
    /// was verified for ([`FastPath::arm_all`] with the history read by
    /// [`FastPath::history`] before the verification, as the service's
    /// repair does). On a server armed without a recorded history, no
    /// purchase is confirmed.
    ///
    /// # Errors
    /// [`Error::Invalid`] for 0 replicas, a zero timeout, a Redis Cluster
    /// connection (`WAIT` names no key to route by), or no tokio runtime.
    pub fn with_replica_ack(mut self, ack: ReplicaAck, acks: RedisConn) -> Result<Self> {
        if ack.replicas == 0 {
            return Err(Error::invalid("replica_ack", "must be at least 1"));
        }
        if ack.timeout.as_millis() == 0 {
            return Err(Error::invalid(
                "replica_ack_timeout",
                "must be at least 1 ms",
            ));
        }
        if matches!(self.redis.connection(), RedisConn::Cluster(_))
            || matches!(acks, RedisConn::Cluster(_))
        {
            return Err(Error::invalid(
                "replica_ack",
                "not available on a Redis Cluster connection",
            ));
        }
        let marker = crate::store::keys::replica_ack_marker(self.redis.prefix());
        let history = crate::store::keys::verified_history(self.redis.prefix());
        self.acker = Some(Acker::start(acks, marker, history, ack)?);
        Ok(self)
    }

    /// Puts voucher `id` on sale with `terms`. Loading again updates the
    /// window but never resets the stock of a sale already loaded.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn load_voucher(&self, id: i64, terms: &SaleTerms) -> Result<()> {
        self.load_voucher_with_room(id, terms, false).await
    }

    /// [`FastPath::load_voucher`] for a sale with a waiting room in front
    /// of it when `room` (a purchase then needs a pass).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn load_voucher_with_room(
        &self,
        id: i64,
        terms: &SaleTerms,
        room: bool,
    ) -> Result<()> {
        let window = (terms.begin_ms(), terms.end_ms());
        let sale = SaleHash {
            stock: terms.stock(),
            begin_ms: window.0,
            end_ms: window.1,
            rebuy: terms.rebuy_after_cancel(),
            room,
        };
        self.put_terms(id, &sale).await.map(drop)
    }

    /// Sets whether voucher `id`'s sale has a waiting room (a purchase then
    /// needs a pass); `false` if Redis has no such sale (its first purchase
    /// restores it from the database, room included).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn set_room(&self, id: i64, room: bool) -> Result<bool> {
        let keys = self.redis.voucher(id);
        // Only on a sale Redis has: a hash with the flag alone would be
        // a sale without terms.
        let set: i64 = redis::Script::new(
            "if redis.call('exists', KEYS[1]) == 0 then return 0 end \
             redis.call('hset', KEYS[1], 'room', ARGV[1]) return 1",
        )
        .key(&keys.voucher)
        .arg(i64::from(room))
        .invoke_async(&mut self.redis.conn())
        .await?;
        Ok(set == 1)
    }

    /// Writes voucher `id`'s window, rebuy rule and room flag, and `stock`
    /// only if the voucher has none yet (one transaction); returns whether
    /// the stock was written.
    async fn put_terms(&self, id: i64, sale: &SaleHash) -> Result<bool> {
        let &SaleHash {
            stock,
            begin_ms,
            end_ms,
            rebuy,
            room,
        } = sale;
        let keys = self.redis.voucher(id);
        let (created,): (bool,) = redis::pipe()
            .atomic()
            .hset_nx(&keys.voucher, "stock", stock)
            .hset(&keys.voucher, "begin_ms", begin_ms)
            .ignore()
            .hset(&keys.voucher, "end_ms", end_ms)
            .ignore()
            .hset(&keys.voucher, "rebuy", i64::from(rebuy))
            .ignore()
            .hset(&keys.voucher, "room", i64::from(room))
            .ignore()
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(created)
    }

    /// Takes back the unit of order `order` of `user`, which the database
    /// gave back, exactly once per order (`take_back.lua`); this instance
    /// stops answering "sold out" for the voucher from memory at once
    /// (others within [`SOLD_OUT_MEMORY`]).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails (then ask again: it is idempotent).
    pub async fn take_back(&self, voucher: i64, user: i64, order: i64) -> Result<TakeBack> {
        let keys = self.redis.voucher(voucher);
        let code: i64 = TAKE_BACK
            .key(&keys.voucher)
            .key(&keys.buyers)
            .key(&keys.order_of)
            .key(&keys.returned)
            .arg(user)
            .arg(order)
            .invoke_async(&mut self.redis.conn())
            .await?;
        self.sold_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&voucher);
        Ok(match code {
            1 => TakeBack::TakenBack,
            0 => TakeBack::Already,
            2 => TakeBack::NoSale,
            other => {
                return Err(Error::Protocol(format!(
                    "take-back script returned {other}"
                )))
            }
        })
    }

    /// Puts back the sale state of voucher `id` that Redis lost: `buyers`
    /// (user, order id) first, then the terms `sale`, its stock the stock only
    /// if the voucher's hash is still missing (a purchase needs the hash, so
    /// none can slip between the two). Returns whether the hash was written.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable (then retry: it is
    /// idempotent).
    #[tracing::instrument(level = "debug", skip(self, buyers), fields(buyers = buyers.len()))]
    pub async fn restore_sale(
        &self,
        id: i64,
        sale: &SaleHash,
        buyers: &[(i64, i64)],
        returned: &[i64],
    ) -> Result<bool> {
        let keys = self.redis.voucher(id);
        let mut conn = self.redis.conn();
        // Units the database took back are in its stock already: marked
        // taken back here, so that none is taken back twice.
        for chunk in returned.chunks(1_000) {
            let () = redis::cmd("SADD")
                .arg(&keys.returned)
                .arg(chunk)
                .query_async(&mut conn)
                .await?;
        }
        for chunk in buyers.chunks(1_000) {
            let users: Vec<i64> = chunk.iter().map(|(user, _)| *user).collect();
            let () = redis::pipe()
                .atomic()
                .sadd(&keys.buyers, users)
                .ignore()
                .hset_multiple(&keys.order_of, chunk)
                .ignore()
                .query_async(&mut conn)
                .await?;
        }
        self.put_terms(id, sale).await
    }

    /// Whether the purchase script is loaded: on a cluster, on every node.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn is_armed(&self) -> Result<bool> {
        let exists: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(PURCHASE.get_hash())
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(exists.first().copied().unwrap_or(false))
    }

    /// Looks at Redis once, as the service does in the background
    /// (`repair`): whether it answers (recorded as a purchase's answer
    /// is, so purchases refused while it was unreachable go on as soon as
    /// it is back, without a buyer having to try it), and whether
    /// purchases may run there: the purchase script is loaded and, on one
    /// server or a Sentinel master, the data is what the sale state was
    /// verified for (a server whose replication history changed without a
    /// restart is disarmed here). `Ok(false)`: the sale state needs a
    /// verification.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn check(&self) -> Result<bool> {
        let mut conn = self.redis.conn();
        let exists: redis::RedisResult<Vec<bool>> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(PURCHASE.get_hash())
            .query_async(&mut conn)
            .await;
        self.reachability.record(&exists);
        if !exists?.first().copied().unwrap_or(false) {
            return Ok(false);
        }
        if matches!(conn, RedisConn::Cluster(_)) {
            return Ok(true);
        }
        let mark = crate::store::keys::verified_history(self.redis.prefix());
        Ok(!verification::disarm_unless_verified(&mut conn, &mark).await?)
    }

    /// Tries to buy voucher `voucher_id` for `user_id`.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable (if the connection broke
    /// after sending, the purchase may have been made: the outcome is
    /// unknown); [`Error::SaleUnverified`] if Redis restarted and the sale
    /// state has not been verified since (nothing was bought);
    /// [`Error::NotReplicated`] if replica confirmation is on and too few
    /// replicas confirmed (the order stands on the primary, and is lost
    /// only if it fails before replicating: an unknown outcome).
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the purchase takes effect even if this
    /// future is dropped, and its order id is lost to the caller (the order
    /// is still in the stream).
    pub async fn purchase(&self, voucher_id: i64, user_id: i64) -> Result<Purchase> {
        self.purchase_with_pass(voucher_id, user_id, false).await
    }

    /// [`FastPath::purchase`] by a buyer who showed a valid waiting-room
    /// pass (`passed`; the caller checked it): a sale with a room refuses
    /// a purchase without one ([`Refusal::PassRequired`]).
    ///
    /// # Errors
    /// As [`FastPath::purchase`].
    ///
    /// # Cancel safety
    /// As [`FastPath::purchase`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn purchase_with_pass(
        &self,
        voucher_id: i64,
        user_id: i64,
        passed: bool,
    ) -> Result<Purchase> {
        if self.known_sold_out(voucher_id) {
            return Ok(Purchase::Refused(Refusal::SoldOut));
        }
        let _probe = match self.reachability.admit() {
            Admission::Go => None,
            Admission::Probe(probe) => Some(probe),
            Admission::Refuse => return Err(Error::Redis(reachability::unreachable())),
        };
        let order = match self.ids.next_id().await {
            Ok(order) => order,
            Err(e) => {
                if let Error::Redis(r) = &e {
                    self.reachability.record::<()>(&Err(r.clone()));
                }
                return Err(e);
            }
        };
        let [voucher_key, buyers, orders, order_of] =
            crate::store::keys::purchase_keys(self.redis.prefix(), voucher_id);
        // With replica confirmation, an accepted purchase also answers the
        // history its server's sale state was verified for: the
        // confirmation must come from that server in that history
        // (`replica_ack`).
        let history_key = self.acker.as_ref().map(Acker::history_key);
        let mut script = redis::cmd("EVALSHA");
        script
            .arg(PURCHASE.get_hash())
            .arg(4 + usize::from(history_key.is_some()))
            .arg(voucher_key)
            .arg(buyers)
            .arg(orders)
            .arg(order_of)
            .arg(history_key);
        script
            .arg(user_id)
            .arg(order.as_i64())
            .arg(voucher_id)
            .arg(if passed { "1" } else { "0" });
        let answer = script
            .query_async::<PurchaseReply>(&mut self.redis.conn())
            .await;
        self.reachability.record(&answer);
        let (code, history) = match answer {
            Ok(PurchaseReply { code, history }) => (code, history),
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                return Err(Error::SaleUnverified)
            }
            Err(e) => return Err(e.into()),
        };
        if let (0, Some(acker)) = (code, &self.acker) {
            // Boxed: see `Sales::purchase_with_pass`.
            Box::pin(acker.confirm(history)).await?;
        }
        Ok(match code {
            0 => Purchase::Accepted(order),
            1 => Purchase::Refused(Refusal::NotStarted),
            2 => Purchase::Refused(Refusal::Ended),
            3 => {
                self.remember_sold_out(voucher_id);
                Purchase::Refused(Refusal::SoldOut)
            }
            4 => Purchase::Refused(Refusal::AlreadyBought),
            5 => Purchase::Refused(Refusal::UnknownVoucher),
            6 => Purchase::Refused(Refusal::PassRequired),
            other => return Err(Error::Protocol(format!("purchase script returned {other}"))),
        })
    }

    /// Loads the purchase script on the server holding voucher
    /// `voucher_id` (on a cluster, each node needs it), so purchases go on
    /// after a restart. Call it only once the sale state on that server is
    /// verified (see the type's docs).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn arm(&self, voucher_id: i64) -> Result<()> {
        let [voucher_key, buyers, orders, order_of] =
            crate::store::keys::purchase_keys(self.redis.prefix(), voucher_id);
        // EVAL caches the script on the node the key routes to; with no
        // arguments the script changes nothing.
        let _: i64 = redis::cmd("EVAL")
            .arg(include_str!("../scripts/purchase.lua"))
            .arg(4)
            .arg(voucher_key)
            .arg(buyers)
            .arg(orders)
            .arg(order_of)
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(())
    }

    /// The replication history of the server purchases go to, read before
    /// a verification so that [`FastPath::arm_all`] can tell whether the
    /// data stayed the same meanwhile; `None` on a cluster (each node has
    /// its own).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn history(&self) -> Result<Option<History>> {
        if matches!(self.redis.connection(), RedisConn::Cluster(_)) {
            return Ok(None);
        }
        Ok(Some(verification::history(&mut self.redis.conn()).await?))
    }

    /// Loads the purchase script on every server (on a cluster, every
    /// master), so purchases go on after a restart, and records that the
    /// data was verified for `verified` ([`FastPath::history`] before the
    /// verification). Call it only once the state of every open sale is
    /// verified (see the type's docs); a sale whose state Redis lost
    /// answers "unknown voucher", which sends it to be repaired.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable, or if the server's history
    /// is no longer `verified` (nothing is loaded: verify again).
    pub async fn arm_all(&self, verified: Option<&History>) -> Result<()> {
        if let Some(verified) = verified {
            let mark = crate::store::keys::verified_history(self.redis.prefix());
            verification::record(&mut self.redis.conn(), &mark, verified).await?;
        }
        let _: redis::Value = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(include_str!("../scripts/purchase.lua"))
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(())
    }

    /// Forgets every sold-out voucher (after a repair that may have given
    /// units back).
    pub fn forget_sold_out(&self) {
        self.sold_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn known_sold_out(&self, voucher_id: i64) -> bool {
        let mut sold_out = self.sold_out.lock().unwrap_or_else(|p| p.into_inner());
        match sold_out.get(&voucher_id) {
            Some(at) if at.elapsed() < SOLD_OUT_MEMORY => true,
            Some(_) => {
                sold_out.remove(&voucher_id);
                false
            }
            None => false,
        }
    }

    fn remember_sold_out(&self, voucher_id: i64) {
        self.sold_out
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(voucher_id, Instant::now());
    }

    /// The service's Redis: the connection and key prefix this fast path
    /// uses.
    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    /// Whether Redis answers.
    ///
    /// # Errors
    /// [`Error::Redis`] if it does not.
    pub async fn ping(&self) -> Result<()> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.redis.conn())
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
            let mut conn = self.redis.conn();
            let key = self.redis.voucher(*id).voucher;
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
