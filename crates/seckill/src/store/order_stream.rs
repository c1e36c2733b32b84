//! The vouchers' order streams as the pipeline consumes them: one consumer
//! group shared by every instance, entries read, taken over, acknowledged
//! and dead-lettered. What to do with an entry is the pipeline's business
//! (`pipeline.rs`); how that is said to Redis is this module's.

use std::collections::HashMap;
use std::time::Duration;

use redis::streams::{StreamClaimReply, StreamId, StreamReadReply};
use redis::AsyncCommands;

use crate::domain::order::OrderRecord;
use crate::error::{Error, Result};
use crate::store::keys::{consumers, dead_letter_stream};
use crate::store::{Redis, RedisConn};
use crate::OrderId;

static ACKNOWLEDGE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../scripts/acknowledge.lua")));

/// One stream entry handed to this consumer, with how often it has been
/// delivered (1 for a first read).
#[derive(Debug, Clone)]
pub struct Delivery {
    entry: StreamId,
    deliveries: u64,
}

impl Delivery {
    /// The entry's stream id.
    pub fn id(&self) -> &str {
        &self.entry.id
    }

    /// How many times the group has handed this entry out.
    pub fn deliveries(&self) -> u64 {
        self.deliveries
    }

    /// The order the entry carries; `None` if a field is missing or bad.
    pub fn order(&self) -> Option<OrderRecord> {
        let e = &self.entry;
        let id = OrderId::from_i64(e.get::<i64>("order")?).ok()?;
        // Redis' time of the XADD: the entry id's millisecond part.
        let created_ms = e.id.split('-').next()?.parse().ok()?;
        Some(OrderRecord {
            id,
            user_id: e.get("user")?,
            voucher_id: e.get("voucher")?,
            created_ms,
        })
    }

    /// The order id the entry carries as written (`""` if none): what
    /// [`OrderStreams::acknowledge`] checks before deleting it.
    fn carried_order(&self) -> String {
        self.entry.get("order").unwrap_or_default()
    }

    fn first(entry: StreamId) -> Self {
        Self {
            entry,
            deliveries: 1,
        }
    }
}

/// Whether `error` says a consumer group is missing (Redis restarted
/// without persistence, or the stream was deleted): create it again.
pub fn is_missing_group(error: &Error) -> bool {
    matches!(error, Error::Redis(e) if e.code() == Some("NOGROUP"))
}

/// The order streams under one key prefix, seen by one consumer of one
/// group.
#[derive(Debug, Clone)]
pub struct OrderStreams {
    redis: Redis,
    group: String,
    consumer: String,
    batch: usize,
}

impl OrderStreams {
    /// The streams under `redis`' prefix, read as `consumer` of `group`, at most
    /// `batch` entries per read.
    pub fn new(
        redis: Redis,
        group: impl Into<String>,
        consumer: impl Into<String>,
        batch: usize,
    ) -> Self {
        Self {
            redis,
            group: group.into(),
            consumer: consumer.into(),
            batch,
        }
    }

    fn stream(&self, voucher: i64) -> String {
        self.redis.voucher(voucher).orders
    }

    /// The key prefix of the streams.
    pub fn prefix(&self) -> &str {
        self.redis.prefix()
    }

    /// Every entry of `voucher`'s stream, whoever it was delivered to
    /// (`XRANGE`, a read only: nothing changes), in pages of the batch
    /// size.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn entries(&self, voucher: i64) -> Result<Vec<Delivery>> {
        let stream = self.stream(voucher);
        let mut conn = self.redis.conn();
        let mut out = Vec::new();
        let mut from = "-".to_owned();
        loop {
            let page: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(&stream)
                .arg(&from)
                .arg("+")
                .arg("COUNT")
                .arg(self.batch)
                .query_async(&mut conn)
                .await?;
            let full = page.ids.len() >= self.batch;
            if let Some(last) = page.ids.last() {
                from = format!("({}", last.id);
            }
            out.extend(page.ids.into_iter().map(Delivery::first));
            if !full {
                return Ok(out);
            }
        }
    }

    /// The stream dead letters go to.
    pub fn dead_letter_stream(&self) -> String {
        dead_letter_stream(self.redis.prefix())
    }

    /// Entries in each voucher's stream (accepted, not yet stored), in the
    /// order given: one round trip per thousand on one server.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn lengths(&self, vouchers: &[i64]) -> Result<Vec<u64>> {
        let mut conn = self.redis.conn();
        let mut out = Vec::with_capacity(vouchers.len());
        if matches!(conn, RedisConn::Cluster(_)) {
            // A pipeline goes to one node; the streams are spread over all.
            for &voucher in vouchers {
                out.push(conn.xlen(self.stream(voucher)).await?);
            }
            return Ok(out);
        }
        for chunk in vouchers.chunks(1_000) {
            let mut pipe = redis::pipe();
            for &voucher in chunk {
                pipe.xlen(self.stream(voucher));
            }
            let lengths: Vec<u64> = pipe.query_async(&mut conn).await?;
            out.extend(lengths);
        }
        Ok(out)
    }

    /// Records that this consumer is alive at `now_ms` and names the
    /// consumers silent since `silent_since_ms` or longer, with when each
    /// was last heard of (Unix ms): dead or stuck, so that their pending
    /// entries are for others to take over. One key for every sale: what
    /// it costs does not grow with the sales.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn alive(&self, now_ms: i64, silent_since_ms: i64) -> Result<Vec<(String, i64)>> {
        let key = consumers(self.redis.prefix());
        let (silent,): (Vec<(String, f64)>,) = redis::pipe()
            .zadd(&key, &self.consumer, now_ms)
            .ignore()
            .zrangebyscore_withscores(&key, "-inf", silent_since_ms)
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(silent
            .into_iter()
            .map(|(consumer, ms)| (consumer, ms as i64))
            .collect())
    }

    /// Forgets the consumers last heard of at `before_ms` or earlier.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn forget_consumers(&self, before_ms: i64) -> Result<()> {
        let key = consumers(self.redis.prefix());
        let _: i64 = self
            .redis
            .conn()
            .zrembyscore(&key, "-inf", before_ms)
            .await?;
        Ok(())
    }

    /// Creates the group on `voucher`'s stream (and the stream) if missing;
    /// idempotent, safe from several instances at once.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn create_group(&self, voucher: i64) -> Result<()> {
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(self.stream(voucher))
            .arg(&self.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.redis.conn())
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// New entries of `voucher`'s stream, without waiting.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails (`NOGROUP`: see [`is_missing_group`]).
    pub async fn read_new(&self, voucher: i64) -> Result<Vec<Delivery>> {
        let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.batch)
            .arg("STREAMS")
            .arg(self.stream(voucher))
            .arg(">")
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .map(Delivery::first)
            .collect())
    }

    /// New entries of all of `vouchers`' streams in one `XREADGROUP ...
    /// BLOCK`, waiting up to `block` for the first; per voucher. `reader`
    /// must be a connection of its own (a blocked read holds it), and all
    /// streams on one server (one read cannot span a cluster's slots).
    ///
    /// # Errors
    /// As [`OrderStreams::read_new`].
    pub async fn read_new_blocking(
        &self,
        reader: &mut RedisConn,
        vouchers: &[i64],
        block: Duration,
    ) -> Result<Vec<(i64, Vec<Delivery>)>> {
        let streams: HashMap<String, i64> = vouchers.iter().map(|&v| (self.stream(v), v)).collect();
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.batch)
            .arg("BLOCK")
            .arg(block.as_millis() as u64)
            .arg("STREAMS");
        for &voucher in vouchers {
            read.arg(self.stream(voucher));
        }
        read.arg(vec![">"; vouchers.len()]);
        let reply: Option<StreamReadReply> = read.query_async(reader).await?;
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .filter_map(|stream| {
                let voucher = *streams.get(&stream.key)?;
                Some((
                    voucher,
                    stream.ids.into_iter().map(Delivery::first).collect(),
                ))
            })
            .collect())
    }

    /// Takes over entries of `voucher`'s stream idle longer than `idle` on
    /// any consumer (a dead instance's): they are this consumer's now.
    ///
    /// # Errors
    /// As [`OrderStreams::read_new`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn reclaim(&self, voucher: i64, idle: Duration) -> Result<Vec<Delivery>> {
        let stream = self.stream(voucher);
        let idle_ms = idle.as_millis() as u64;
        // XPENDING stream group IDLE ms - + count: [[id, consumer, idle, deliveries], …]
        let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(&self.group)
            .arg("IDLE")
            .arg(idle_ms)
            .arg("-")
            .arg("+")
            .arg(self.batch)
            .query_async(&mut self.redis.conn())
            .await?;
        if pending.is_empty() {
            return Ok(Vec::new());
        }
        let mut claim = redis::cmd("XCLAIM");
        claim
            .arg(&stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(idle_ms);
        for (id, ..) in &pending {
            claim.arg(id);
        }
        let claimed: StreamClaimReply = claim.query_async(&mut self.redis.conn()).await?;
        Ok(claimed
            .ids
            .into_iter()
            .map(|entry| {
                // XCLAIM counted one more delivery.
                let deliveries = pending
                    .iter()
                    .find(|(id, ..)| *id == entry.id)
                    .map_or(1, |(.., n)| n + 1);
                Delivery { entry, deliveries }
            })
            .collect())
    }

    /// Acknowledges and deletes the entries `done` of `voucher`'s stream
    /// (their orders are stored), in one script call (`acknowledge.lua`),
    /// each only if the entry under its id still carries its order: an id
    /// read on a master left behind may name another order on the new one.
    /// None: no call.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    #[tracing::instrument(level = "debug", skip(self, done), fields(entries = done.len()))]
    pub async fn acknowledge(&self, voucher: i64, done: &[&Delivery]) -> Result<()> {
        if done.is_empty() {
            return Ok(());
        }
        let mut call = ACKNOWLEDGE.key(self.stream(voucher));
        call.arg(&self.group);
        for delivery in done {
            call.arg(delivery.id()).arg(delivery.carried_order());
        }
        let _: u64 = call.invoke_async(&mut self.redis.conn()).await?;
        Ok(())
    }

    /// Moves `delivery` of `voucher`'s stream to the dead-letter stream
    /// with `reason`, and records the buyer's failed order (order status
    /// reads it in one lookup); the entry is acknowledged and deleted in
    /// its stream if `acknowledge` (not for an entry read from another
    /// server).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails; the entry then stays pending, to be
    /// dead-lettered again (at least once, never lost).
    #[tracing::instrument(level = "debug", skip(self, delivery), fields(entry = delivery.id()))]
    pub async fn dead_letter(
        &self,
        voucher: i64,
        delivery: &Delivery,
        reason: &str,
        acknowledge: bool,
    ) -> Result<()> {
        let keys = self.redis.voucher(voucher);
        let entry = &delivery.entry;
        let mut add = redis::cmd("XADD");
        add.arg(self.dead_letter_stream())
            .arg("*")
            .arg("stream")
            .arg(&keys.orders)
            .arg("entry")
            .arg(&entry.id)
            .arg("reason")
            .arg(reason);
        for (field, value) in &entry.map {
            if let Ok(v) = redis::from_redis_value_ref::<String>(value) {
                add.arg(field).arg(v);
            }
        }
        // The dead-letter stream is on another slot than the voucher's
        // stream (a cluster cannot make both one transaction): the dead
        // letter first, then the buyer's failed order, then the entry
        // leaves its stream, so a crash in between leaves the entry
        // pending, to be dead-lettered again.
        let _: String = add.query_async(&mut self.redis.conn()).await?;
        let user: Option<String> = entry.get("user");
        let order: Option<String> = entry.get("order");
        if let (Some(user), Some(order)) = (user, order) {
            let _: i64 = self.redis.conn().hset(&keys.failed, user, order).await?;
        }
        if acknowledge {
            self.acknowledge(voucher, &[delivery]).await?;
        }
        Ok(())
    }
}
