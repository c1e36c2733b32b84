//! The order pipeline's worker: one task per instance that moves accepted
//! orders from the open sales' Redis streams into the database, takes over
//! what dead instances left, measures the backlog, and drains on shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::db::Database;
use crate::error::Result;
use crate::pipeline::{OrderPipeline, StepReport};

/// Pipeline rounds over `vouchers` until a round finds nothing to do (no
/// blocking: for the final drain and for Redis Cluster).
async fn drain(pipeline: &OrderPipeline, vouchers: &[i64]) -> Result<StepReport> {
    let mut total = StepReport::default();
    loop {
        let mut round = StepReport::default();
        for &voucher in vouchers {
            pipeline.ensure_group(voucher).await?;
            round += pipeline.step(voucher).await?;
        }
        if round.handled() == 0 {
            return Ok(total);
        }
        total += round;
    }
}

/// How often the worker re-reads which sales are open (one query).
const REFRESH: Duration = Duration::from_secs(1);

/// How long one blocking read waits for new orders; also how soon the
/// worker sees a new sale or a stop.
const BLOCK: Duration = Duration::from_millis(500);

/// How long the worker rests after a failed round (Redis or the database
/// down) before the next.
const FAILED_ROUND_PAUSE: Duration = Duration::from_millis(200);

/// How often the backlog gauge is measured and this consumer says it is
/// alive: the console's backlog figure is at most this old, plus a tick.
const MEASURE: Duration = Duration::from_secs(1);

/// A consumer silent this long is taken for dead (or stuck): its pending
/// entries are taken over once idle past `reclaim_idle`.
const SILENT_AFTER: Duration = Duration::from_secs(5);

/// How long a stream this instance handled entries of stays measured after
/// the last of them: a sale in full flow is measured every second, one
/// that went quiet is left once its stream was seen empty.
const MEASURED_AFTER_WORK: Duration = Duration::from_secs(10);

/// What an idle instance asks Redis, and why it does not grow with the
/// sales: the backlog gauge reads only the streams that had work lately or
/// were not empty when last read; the takeover of a dead consumer's
/// entries (`XPENDING` on every stream) runs only while a takeover may be
/// due: after this instance started, after a round of its own left entries
/// pending, and after another consumer fell silent (one sorted set of the
/// consumers' signs of life tells, whatever the number of sales).
#[derive(Debug)]
struct Upkeep {
    /// Every stream's length when last read (a stream never read: absent).
    lengths: std::collections::HashMap<i64, u64>,
    /// When this instance last handled entries of each stream.
    worked_at: std::collections::HashMap<i64, Instant>,
    /// Takeover rounds run until then.
    reclaim_until: Instant,
    /// The last takeover round.
    reclaimed: Instant,
}

impl Upkeep {
    fn new(reclaim_idle: Duration) -> Self {
        let now = Instant::now();
        let mut upkeep = Self {
            lengths: Default::default(),
            worked_at: Default::default(),
            reclaim_until: now,
            reclaimed: now,
        };
        // Entries this consumer left pending in an earlier life, and those
        // of consumers that died before this one started.
        upkeep.reclaim_for(reclaim_idle);
        upkeep
    }

    /// Keeps the takeover rounds going until entries pending now are past
    /// `reclaim_idle` and one more round found them.
    fn reclaim_for(&mut self, reclaim_idle: Duration) {
        let until = Instant::now() + reclaim_idle * 2 + SILENT_AFTER;
        self.reclaim_until = self.reclaim_until.max(until);
    }

    /// Whether a takeover round is due now.
    fn reclaim_due(&self, every: Duration) -> bool {
        Instant::now() < self.reclaim_until && self.reclaimed.elapsed() >= every
    }

    /// The streams of `vouchers` to measure now: every one at first, then
    /// those worked lately or not empty when last read.
    fn streams_to_measure(&mut self, pipeline: &OrderPipeline, vouchers: &[i64]) -> Vec<i64> {
        let now = Instant::now();
        for voucher in pipeline.take_worked() {
            self.worked_at.insert(voucher, now);
        }
        self.worked_at
            .retain(|_, at| now.duration_since(*at) < MEASURED_AFTER_WORK);
        vouchers
            .iter()
            .copied()
            .filter(|v| {
                self.worked_at.contains_key(v) || self.lengths.get(v).is_none_or(|&n| n > 0)
            })
            .collect()
    }

    /// The backlog of `vouchers`: the lengths last read.
    fn backlog(&mut self, vouchers: &[i64]) -> u64 {
        let worked: std::collections::HashSet<i64> = vouchers.iter().copied().collect();
        self.lengths.retain(|v, _| worked.contains(v));
        self.lengths.values().sum()
    }
}

/// The sales the pipeline works on: those open now, and those that still
/// have entries in their stream (ended with orders on their way, or left
/// by a dead instance). A sale ended and drained costs nothing.
#[derive(Debug, Default)]
struct Worklist {
    vouchers: Vec<i64>,
}

impl Worklist {
    /// Every voucher with entries left in its stream: once, at start.
    async fn with_leftovers(pipeline: &OrderPipeline, db: &Database) -> Self {
        let mut list = Self::default();
        match db.voucher_ids().await {
            Ok(all) => list.vouchers = with_entries(pipeline, &all).await,
            Err(e) => {
                tracing::warn!(error = %e, "listing vouchers failed; leftovers wait for the next start")
            }
        }
        list
    }

    /// Open sales, plus those of the last list that still have entries.
    async fn refresh(&mut self, pipeline: &OrderPipeline, db: &Database) {
        let open = match db.open_voucher_ids(crate::domain::now_ms()).await {
            Ok(open) => open,
            Err(e) => {
                tracing::warn!(error = %e, "listing open sales failed; keeping the last list");
                return;
            }
        };
        let closed: Vec<i64> = self
            .vouchers
            .iter()
            .copied()
            .filter(|v| !open.contains(v))
            .collect();
        let mut next = open;
        next.extend(with_entries(pipeline, &closed).await);
        next.sort_unstable();
        next.dedup();
        self.vouchers = next;
    }
}

/// Those of `vouchers` whose stream has entries (or could not be asked:
/// kept, rather than read as empty).
async fn with_entries(pipeline: &OrderPipeline, vouchers: &[i64]) -> Vec<i64> {
    match pipeline.backlogs(vouchers).await {
        Ok(lengths) => vouchers
            .iter()
            .zip(lengths)
            .filter(|&(_, n)| n > 0)
            .map(|(&v, _)| v)
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "reading the streams' lengths failed");
            vouchers.to_vec()
        }
    }
}

/// The pipeline worker: new orders read as they come (one blocking read
/// over every worked sale's stream when `reader` is given, else a polling
/// round every 20 ms), dead instances' entries taken over every
/// `reclaim_every`, a final drain on shutdown.
pub(crate) async fn work(
    pipeline: Arc<OrderPipeline>,
    db: Database,
    metrics: crate::metrics::Metrics,
    mut reader: Option<crate::store::RedisConn>,
    reclaim_every: Duration,
    stop: watch::Receiver<bool>,
) {
    let mut sales = Worklist::with_leftovers(&pipeline, &db).await;
    let mut refreshed: Option<Instant> = None;
    let mut measured: Option<Instant> = None;
    let reclaim_idle = pipeline.reclaim_idle();
    let mut upkeep = Upkeep::new(reclaim_idle);
    // A round that failed or left entries pending: they are this
    // consumer's to take over again once idle.
    let count = |outcome: Result<StepReport>, upkeep: &mut Upkeep| match outcome {
        Ok(report) => {
            metrics.orders_stored.inc_by(report.created);
            metrics.dead_letters.inc_by(report.dead_lettered);
            if report.left_pending > 0 {
                upkeep.reclaim_for(reclaim_idle);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "pipeline round failed; retrying");
            upkeep.reclaim_for(reclaim_idle);
        }
    };
    while !*stop.borrow() {
        if refreshed.is_none_or(|at| at.elapsed() >= REFRESH) {
            refreshed = Some(Instant::now());
            sales.refresh(&pipeline, &db).await;
        }
        match &mut reader {
            // Not raced against the stop: a read cut short would leave its
            // entries pending on this consumer until reclaimed.
            Some(reader) => {
                let round = pipeline.step_blocking(reader, &sales.vouchers, BLOCK).await;
                let failed = round.is_err();
                count(round, &mut upkeep);
                if failed {
                    // Redis down answers at once: do not spin on it.
                    tokio::time::sleep(FAILED_ROUND_PAUSE).await;
                }
            }
            None => {
                count(drain(&pipeline, &sales.vouchers).await, &mut upkeep);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if upkeep.reclaim_due(reclaim_every) {
            upkeep.reclaimed = Instant::now();
            for &v in &sales.vouchers {
                count(pipeline.reclaim_step(v).await, &mut upkeep);
            }
        }
        if measured.is_none_or(|at| at.elapsed() >= MEASURE) {
            measured = Some(Instant::now());
            measure(&pipeline, &metrics, &sales.vouchers, &mut upkeep).await;
            watch_consumers(&pipeline, &mut upkeep).await;
        }
    }
    // A sale opened since the last refresh must be drained too.
    sales.refresh(&pipeline, &db).await;
    match drain(&pipeline, &sales.vouchers).await {
        Ok(report) => tracing::info!(
            stored = report.created,
            handled = report.handled(),
            "final pipeline drain done"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "final pipeline drain failed; entries stay pending for the next start")
        }
    }
}

/// Sets the backlog gauge from the streams worth reading (see [`Upkeep`]);
/// a stream whose length cannot be read keeps its last.
async fn measure(
    pipeline: &OrderPipeline,
    metrics: &crate::metrics::Metrics,
    vouchers: &[i64],
    upkeep: &mut Upkeep,
) {
    let measured = upkeep.streams_to_measure(pipeline, vouchers);
    if !measured.is_empty() {
        match pipeline.backlogs(&measured).await {
            Ok(lengths) => upkeep.lengths.extend(measured.into_iter().zip(lengths)),
            Err(e) => tracing::warn!(error = %e, "measuring the backlog failed"),
        }
    }
    metrics.pipeline_lag.set(upkeep.backlog(vouchers) as i64);
}

/// Says this consumer is alive; a consumer that fell silent lately keeps
/// the takeover rounds going (its entries may be pending anywhere), and
/// one silent for longer than those rounds last is forgotten.
async fn watch_consumers(pipeline: &OrderPipeline, upkeep: &mut Upkeep) {
    let now = crate::domain::now_ms();
    let silent_since = now - SILENT_AFTER.as_millis() as i64;
    let silent = match pipeline.alive(now, silent_since).await {
        Ok(silent) => silent,
        Err(e) => {
            tracing::warn!(error = %e, "saying the consumer is alive failed");
            return;
        }
    };
    let rounds = pipeline.reclaim_idle() * 2 + SILENT_AFTER;
    let forget_before = silent_since - rounds.as_millis() as i64;
    let mut forget = false;
    for (consumer, last_ms) in silent {
        if consumer == pipeline.consumer() {
            continue;
        }
        if last_ms > forget_before {
            tracing::debug!(
                consumer,
                last_ms,
                "a pipeline consumer fell silent: its entries are taken over once idle"
            );
            upkeep.reclaim_for(pipeline.reclaim_idle());
        } else {
            forget = true;
        }
    }
    if forget {
        if let Err(e) = pipeline.forget_consumers(forget_before).await {
            tracing::warn!(error = %e, "forgetting silent consumers failed");
        }
    }
}
