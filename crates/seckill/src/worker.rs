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

/// How often the backlog gauge is measured (an `XLEN` per sale worked,
/// pipelined: one round trip): the console's backlog figure is at most this
/// old, plus a tick.
const MEASURE: Duration = Duration::from_secs(1);

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
    let mut reclaimed = Instant::now();
    let mut measured: Option<Instant> = None;
    let count = |outcome: Result<StepReport>| match outcome {
        Ok(report) => {
            metrics.orders_stored.inc_by(report.created);
            metrics.dead_letters.inc_by(report.dead_lettered);
        }
        Err(e) => tracing::warn!(error = %e, "pipeline round failed; retrying"),
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
                count(round);
                if failed {
                    // Redis down answers at once: do not spin on it.
                    tokio::time::sleep(FAILED_ROUND_PAUSE).await;
                }
            }
            None => {
                count(drain(&pipeline, &sales.vouchers).await);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if reclaimed.elapsed() >= reclaim_every {
            reclaimed = Instant::now();
            for &v in &sales.vouchers {
                count(pipeline.reclaim_step(v).await);
            }
        }
        if measured.is_none_or(|at| at.elapsed() >= MEASURE) {
            measured = Some(Instant::now());
            measure(&pipeline, &metrics, &sales.vouchers).await;
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

/// Sets the backlog gauge; left as it was if a length cannot be read.
async fn measure(pipeline: &OrderPipeline, metrics: &crate::metrics::Metrics, vouchers: &[i64]) {
    match pipeline.backlogs(vouchers).await {
        Ok(lengths) => metrics.pipeline_lag.set(lengths.iter().sum::<u64>() as i64),
        Err(e) => tracing::warn!(error = %e, "measuring the backlog failed"),
    }
}
