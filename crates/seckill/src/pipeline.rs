//! The durable order pipeline: from each voucher's Redis stream into SQL.
//!
//! The fast path appends every accepted order to its voucher's stream. Each
//! service instance runs an [`OrderPipeline`] with its own consumer name in
//! one shared consumer group, so an order is handed to one instance at a
//! time, and:
//!
//! * writes it with [`Database::record_order`], which is idempotent (the
//!   order id is the primary key), so a re-delivery never doubles an order;
//! * acknowledges and deletes the entry only after the commit, so a crash
//!   between the two re-delivers rather than loses;
//! * takes over entries left pending by a consumer that died (idle longer
//!   than `reclaim_idle`), counting deliveries;
//! * moves an entry to the dead-letter stream (and counts it) when it can
//!   never succeed (malformed, voucher unknown to the database, stock or
//!   user conflict between Redis and the database) or was delivered more
//!   than `max_deliveries` times;
//! * leaves an entry pending when the database fails transiently: it is
//!   retried after `reclaim_idle`.
//!
//! [`OrderPipeline::step`] does one round for one voucher (tests, the final
//! drain, Redis Cluster); [`OrderPipeline::step_blocking`] reads new
//! entries of many vouchers in one blocking `XREADGROUP` (the service's
//! worker on one Redis server), and [`OrderPipeline::reclaim_step`] takes
//! over a dead consumer's entries on a slower timer. The service works only
//! on open sales and on sales whose streams still hold entries, so an idle
//! instance costs Redis a few commands a second however many sales exist.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::db::{Database, Recorded};
use crate::domain::order::OrderRecord;
use crate::error::{Error, Result};
use crate::store::{is_missing_group, Delivery, OrderStreams, Redis, RedisConn};

/// How a pipeline consumes.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    /// Consumer group shared by all instances.
    pub group: String,
    /// This instance's consumer name (unique per instance).
    pub consumer: String,
    /// Entries read per round.
    pub batch: usize,
    /// An entry pending this long on any consumer is taken over.
    pub reclaim_idle: Duration,
    /// Deliveries after which an entry is dead-lettered.
    pub max_deliveries: u64,
}

impl PipelineSettings {
    /// Defaults for consumer `consumer`: group `orders`, batches of 100,
    /// reclaim after 30 s, dead-letter after 5 deliveries.
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            group: "orders".into(),
            consumer: consumer.into(),
            batch: 100,
            reclaim_idle: Duration::from_secs(30),
            max_deliveries: 5,
        }
    }
}

/// What one [`OrderPipeline::step`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StepReport {
    /// Orders newly stored.
    pub created: u64,
    /// Re-deliveries of orders already stored (acknowledged, no change).
    pub already_stored: u64,
    /// Entries moved to the dead-letter stream.
    pub dead_lettered: u64,
    /// Entries taken over from other (dead) consumers.
    pub reclaimed: u64,
    /// Entries left pending after a transient database failure.
    pub left_pending: u64,
}

impl std::ops::AddAssign for StepReport {
    fn add_assign(&mut self, other: Self) {
        self.created += other.created;
        self.already_stored += other.already_stored;
        self.dead_lettered += other.dead_lettered;
        self.reclaimed += other.reclaimed;
        self.left_pending += other.left_pending;
    }
}

impl StepReport {
    /// Entries this step finished with (stored, re-delivered or dead).
    pub fn handled(&self) -> u64 {
        self.created + self.already_stored + self.dead_lettered
    }
}

/// Whether handled entries are acknowledged and deleted in their stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acknowledge {
    /// They were delivered by the group on the current master.
    Yes,
    /// They were read from a master left behind (see
    /// [`OrderPipeline::take_over_left_master`]).
    No,
}

/// Moves accepted orders from Redis into the database.
#[derive(Debug)]
pub struct OrderPipeline {
    streams: OrderStreams,
    db: Database,
    settings: PipelineSettings,
    dead_letters: AtomicU64,
    /// Vouchers whose group this instance already ensured.
    grouped: std::sync::Mutex<std::collections::HashSet<i64>>,
    /// Vouchers this pipeline handled entries of since the worker last
    /// asked ([`OrderPipeline::take_worked`]).
    worked: std::sync::Mutex<std::collections::HashSet<i64>>,
}

impl OrderPipeline {
    /// A pipeline for the streams under `redis`' prefix.
    ///
    /// # Errors
    /// [`Error::Invalid`] for an empty group or consumer, a zero batch or
    /// a zero delivery limit.
    pub fn new(redis: Redis, db: Database, settings: PipelineSettings) -> Result<Self> {
        if settings.group.is_empty() {
            return Err(Error::invalid("group", "must not be empty"));
        }
        if settings.consumer.is_empty() {
            return Err(Error::invalid("consumer", "must not be empty"));
        }
        if settings.batch == 0 {
            return Err(Error::invalid("batch", "must be at least 1"));
        }
        if settings.max_deliveries == 0 {
            return Err(Error::invalid("max_deliveries", "must be at least 1"));
        }
        Ok(Self {
            streams: OrderStreams::new(
                redis,
                settings.group.clone(),
                settings.consumer.clone(),
                settings.batch,
            ),
            db,
            settings,
            dead_letters: AtomicU64::new(0),
            grouped: Default::default(),
            worked: Default::default(),
        })
    }

    /// The stream dead letters go to.
    pub fn dead_letter_stream(&self) -> String {
        self.streams.dead_letter_stream()
    }

    /// Orders of voucher `voucher_id` accepted and not yet stored.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn backlog(&self, voucher_id: i64) -> Result<u64> {
        Ok(self.backlogs(&[voucher_id]).await?.iter().sum())
    }

    /// [`OrderPipeline::backlog`] of each of `vouchers`, in one round trip.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn backlogs(&self, vouchers: &[i64]) -> Result<Vec<u64>> {
        self.streams.lengths(vouchers).await
    }

    /// The vouchers whose entries this pipeline handled since the last
    /// call: the streams worth measuring (see the worker).
    pub fn take_worked(&self) -> std::collections::HashSet<i64> {
        std::mem::take(&mut *self.worked.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Says this instance's consumer is alive now and names the consumers
    /// silent since `silent_since_ms`, with when each was last heard of
    /// (one sorted set for every sale).
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn alive(&self, now_ms: i64, silent_since_ms: i64) -> Result<Vec<(String, i64)>> {
        self.streams.alive(now_ms, silent_since_ms).await
    }

    /// Forgets the consumers last heard of at `before_ms` or earlier.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn forget_consumers(&self, before_ms: i64) -> Result<()> {
        self.streams.forget_consumers(before_ms).await
    }

    /// This instance's consumer name.
    pub fn consumer(&self) -> &str {
        &self.settings.consumer
    }

    /// How long an entry stays pending on a consumer before others take
    /// it over.
    pub fn reclaim_idle(&self) -> Duration {
        self.settings.reclaim_idle
    }

    /// Entries this pipeline has dead-lettered since it started.
    pub fn dead_letters(&self) -> u64 {
        self.dead_letters.load(Ordering::Relaxed)
    }

    /// Creates the consumer group of voucher `voucher_id`'s stream (and the
    /// stream) if missing. Idempotent, safe from several instances at once.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable.
    pub async fn ensure_group(&self, voucher_id: i64) -> Result<()> {
        if self.is_grouped(voucher_id) {
            return Ok(());
        }
        self.streams.create_group(voucher_id).await?;
        self.grouped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(voucher_id);
        Ok(())
    }

    fn is_grouped(&self, voucher_id: i64) -> bool {
        self.grouped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&voucher_id)
    }

    /// One round for voucher `voucher_id`: take over entries idle on dead
    /// consumers, read new ones, store, acknowledge, dead-letter.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis is unreachable. Database failures do not
    /// end the step: the entry stays pending and is counted in
    /// [`StepReport::left_pending`].
    ///
    /// # Cancel safety
    /// Cancel safe in effect: an entry is acknowledged only after its order
    /// is committed, so dropping the step at any point leaves entries
    /// pending (to be reclaimed), never lost; stored orders are not
    /// doubled on re-delivery.
    pub async fn step(&self, voucher_id: i64) -> Result<StepReport> {
        let outcome = async {
            let mut work = self
                .streams
                .reclaim(voucher_id, self.settings.reclaim_idle)
                .await?;
            let reclaimed = work.len() as u64;
            work.extend(self.streams.read_new(voucher_id).await?);
            let mut report = self.handle(voucher_id, work, Acknowledge::Yes).await?;
            report.reclaimed = reclaimed;
            Ok(report)
        }
        .await;
        self.forget_group_if_lost(&outcome, &[voucher_id]);
        outcome
    }

    /// Takes over and handles the entries of voucher `voucher_id` idle past
    /// `reclaim_idle` on any consumer (a dead instance's), and nothing else.
    ///
    /// # Errors
    /// As [`OrderPipeline::step`].
    pub async fn reclaim_step(&self, voucher_id: i64) -> Result<StepReport> {
        let outcome = async {
            let work = self
                .streams
                .reclaim(voucher_id, self.settings.reclaim_idle)
                .await?;
            let reclaimed = work.len() as u64;
            let mut report = self.handle(voucher_id, work, Acknowledge::Yes).await?;
            report.reclaimed = reclaimed;
            Ok(report)
        }
        .await;
        self.forget_group_if_lost(&outcome, &[voucher_id]);
        outcome
    }

    /// Reads new entries of all of `vouchers`' streams in one
    /// `XREADGROUP ... BLOCK`, waiting up to `block` for the first, and
    /// handles them. `reader` must be a connection of its own: a blocked
    /// read holds it. For one Redis server (the streams of a cluster live
    /// on different slots, which one read cannot span: use
    /// [`OrderPipeline::step`] there).
    ///
    /// # Errors
    /// As [`OrderPipeline::step`].
    ///
    /// # Cancel safety
    /// As [`OrderPipeline::step`]: entries read and not yet acknowledged
    /// stay pending, to be reclaimed.
    #[tracing::instrument(level = "debug", skip(self, reader, vouchers), fields(sales = vouchers.len()))]
    pub async fn step_blocking(
        &self,
        reader: &mut RedisConn,
        vouchers: &[i64],
        block: Duration,
    ) -> Result<StepReport> {
        if vouchers.is_empty() {
            tokio::time::sleep(block).await;
            return Ok(StepReport::default());
        }
        for &voucher in vouchers {
            self.ensure_group(voucher).await?;
        }
        let outcome = async {
            let mut report = StepReport::default();
            for (voucher, work) in self
                .streams
                .read_new_blocking(reader, vouchers, block)
                .await?
            {
                report += self.handle(voucher, work, Acknowledge::Yes).await?;
            }
            Ok(report)
        }
        .await;
        self.forget_group_if_lost(&outcome, vouchers);
        outcome
    }

    /// Stores the orders still in `vouchers`' streams on `left`, a master
    /// the service's Redis connection moved away from (a Sentinel switch):
    /// orders it accepted that neither reached the new master nor the
    /// database yet, which leave with its data when it is demoted. Read
    /// whole (`XRANGE`), never acknowledged or deleted on the new master: a
    /// stream id there may name another order (both servers number their
    /// entries by their own clock from the same last id). An order the
    /// database refuses is dead-lettered, as the pipeline does.
    ///
    /// # Errors
    /// [`Error::Redis`] if the new master fails while dead-lettering;
    /// `left` failing ends the take-over with what it stored so far
    /// (logged: it is gone, and so are its orders).
    pub async fn take_over_left_master(
        &self,
        left: RedisConn,
        vouchers: &[i64],
    ) -> Result<StepReport> {
        let streams = OrderStreams::new(
            Redis::new(left, self.streams.prefix()),
            self.settings.group.clone(),
            self.settings.consumer.clone(),
            self.settings.batch,
        );
        let mut report = StepReport::default();
        for &voucher in vouchers {
            match streams.entries(voucher).await {
                Ok(work) if work.is_empty() => {}
                Ok(work) => report += self.handle(voucher, work, Acknowledge::No).await?,
                Err(e) => {
                    tracing::warn!(error = %e, "the Redis master left behind could not be read: its orders not yet stored are lost");
                    break;
                }
            }
        }
        Ok(report)
    }

    /// Redis lost a consumer group (restarted without persistence): the
    /// next `ensure_group` of these vouchers recreates it.
    fn forget_group_if_lost<T>(&self, outcome: &Result<T>, vouchers: &[i64]) {
        if let Err(e) = outcome {
            if is_missing_group(e) {
                let mut grouped = self.grouped.lock().unwrap_or_else(|p| p.into_inner());
                for voucher in vouchers {
                    grouped.remove(voucher);
                }
            }
        }
    }

    /// Stores `work` (entries of `voucher`'s stream), dead-letters what can
    /// never be stored, acknowledges what was (if `ack` says so).
    async fn handle(
        &self,
        voucher: i64,
        work: Vec<Delivery>,
        ack: Acknowledge,
    ) -> Result<StepReport> {
        let mut report = StepReport::default();
        if work.is_empty() {
            return Ok(report);
        }
        self.worked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(voucher);
        // Entries that cannot be stored leave first; the rest are written
        // together (one commit) and acknowledged together.
        let mut orders: Vec<(Delivery, OrderRecord)> = Vec::with_capacity(work.len());
        for delivery in work {
            let order = delivery.order();
            match order {
                _ if delivery.deliveries() > self.settings.max_deliveries => {
                    let reason = format!("delivered {} times", delivery.deliveries());
                    self.dead_letter(voucher, &delivery, &reason, ack, &mut report)
                        .await?;
                }
                Some(order) => orders.push((delivery, order)),
                None => {
                    self.dead_letter(voucher, &delivery, "malformed entry", ack, &mut report)
                        .await?;
                }
            }
        }
        let records: Vec<OrderRecord> = orders.iter().map(|(_, order)| *order).collect();
        let outcomes = self.db.record_orders(&records).await;
        let mut stored = Vec::with_capacity(orders.len());
        for ((delivery, _), outcome) in orders.iter().zip(outcomes) {
            let refusal = match outcome {
                Ok(Recorded::Created) => {
                    report.created += 1;
                    stored.push(delivery);
                    continue;
                }
                Ok(Recorded::AlreadyStored) => {
                    report.already_stored += 1;
                    stored.push(delivery);
                    continue;
                }
                // Redis accepted what the database refuses: no retry can
                // fix it; `reconcile` reports it.
                Ok(Recorded::UserAlreadyOrdered) => "user already has an order",
                Ok(Recorded::OutOfStock) => "no stock left in the database",
                Ok(Recorded::UnknownVoucher) => "voucher unknown to the database",
                Err(e) => {
                    tracing::warn!(error = %e, entry = delivery.id(), "storing an order failed; it stays pending");
                    report.left_pending += 1;
                    continue;
                }
            };
            self.dead_letter(voucher, delivery, refusal, ack, &mut report)
                .await?;
        }
        if ack == Acknowledge::Yes {
            self.streams.acknowledge(voucher, &stored).await?;
        }
        Ok(report)
    }

    async fn dead_letter(
        &self,
        voucher: i64,
        delivery: &Delivery,
        reason: &str,
        ack: Acknowledge,
        report: &mut StepReport,
    ) -> Result<()> {
        self.streams
            .dead_letter(voucher, delivery, reason, ack == Acknowledge::Yes)
            .await?;
        tracing::warn!(
            entry = delivery.id(),
            voucher,
            reason,
            "order dead-lettered"
        );
        self.dead_letters.fetch_add(1, Ordering::Relaxed);
        report.dead_lettered += 1;
        Ok(())
    }
}
