//! The running service: the HTTP API plus the order pipeline's worker, on
//! one Redis and one database, with a graceful shutdown that drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::ExposeSecret;
use tokio::sync::watch;

use crate::auth::Tokens;
use crate::db::Database;
use crate::error::Result;
use crate::http::{router, AppState, RateLimits};
use crate::pipeline::{OrderPipeline, PipelineSettings, StepReport};
use crate::repair::SaleRepair;
use crate::sale::{PurchasePath, Sales};
use crate::settings::{Mode, Settings, UserLocks};
use crate::store::{FastPath, OrderIdGenerator};
use crate::sync_path::SyncPath;

/// A started service.
#[derive(Debug)]
pub struct Service {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    worker: tokio::task::JoinHandle<()>,
    pipeline: Arc<OrderPipeline>,
}

impl Service {
    /// Connects, migrates, binds and starts serving and consuming.
    ///
    /// # Errors
    /// If Redis or the database is unreachable, a migration fails, or the
    /// address cannot be bound.
    pub async fn start(config: Settings) -> anyhow::Result<Self> {
        let db = Database::connect(&config.database_url).await?;
        db.migrate().await?;
        let conn = crate::store::connect(&config.redis_url).await?;
        let mut fast = FastPath::new(
            conn.clone(),
            config.prefix.clone(),
            OrderIdGenerator::new(conn.clone(), config.prefix.clone(), 1000)?,
        );
        if let Some(ack) = config.replica_ack {
            // WAIT blocks its connection: confirmation gets its own.
            fast = fast.with_replica_ack(ack, crate::store::connect(&config.redis_url).await?)?;
        }
        let fast = Arc::new(fast);
        let locks = crate::store::lock_client(&config.redis_url, hasp::Settings::default()).await?;
        let purchases = match config.mode {
            Mode::Async => PurchasePath::Async,
            Mode::Sync => {
                let mut sync = SyncPath::new(
                    db.clone(),
                    locks.clone(),
                    OrderIdGenerator::new(conn.clone(), config.prefix.clone(), 1000)?,
                    // A double click waits this long for the first click's
                    // purchase (milliseconds), then is a 409.
                    Duration::from_secs(1),
                )
                .with_prefix(config.prefix.clone());
                if config.user_locks == UserLocks::Database {
                    let table = hasp_sql::SqlClient::open(
                        &config.database_url,
                        hasp_sql::SqlSettings::default(),
                    )
                    .await?;
                    table.migrate().await?;
                    sync = sync.with_table_locks(table);
                }
                PurchasePath::Sync(Arc::new(sync))
            }
        };
        let metrics =
            crate::metrics::Metrics::new().map_err(|e| anyhow::anyhow!("metrics registry: {e}"))?;
        let repair = Arc::new(SaleRepair::new(
            fast.clone(),
            db.clone(),
            locks,
            Some(metrics.sale_repairs.clone()),
        ));
        if config.mode == Mode::Async {
            // Redis may have restarted while no instance was running.
            if let Some(report) = repair.ensure_verified(None).await? {
                tracing::info!(?report, "sale state verified at start");
            }
        }
        let state = AppState {
            db: db.clone(),
            sales: Arc::new(Sales::new(purchases, fast, db.clone(), repair)),
            tokens: Tokens::new(config.token_secret.expose_secret().as_bytes())?,
            limits: RateLimits::new(config.user_limit, config.ip_limit),
            metrics: metrics.clone(),
        };
        let conn_for_reads = conn.clone();
        let pipeline = Arc::new(OrderPipeline::new(
            conn,
            db.clone(),
            config.prefix.clone(),
            PipelineSettings {
                reclaim_idle: config.reclaim_idle,
                ..PipelineSettings::new(config.consumer.clone())
            },
        )?);
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let (shutdown, stop) = watch::channel(false);
        let server = tokio::spawn(crate::http::server::serve(
            listener,
            router(state),
            config.connections,
            stop,
        ));
        // Blocking reads need a connection of their own; a cluster's
        // streams cannot share one read (polled instead).
        let reader = match &conn_for_reads {
            crate::store::RedisConn::Server(_) | crate::store::RedisConn::Sentinel(_) => {
                Some(crate::store::connect(&config.redis_url).await?)
            }
            crate::store::RedisConn::Cluster(_) => None,
        };
        let worker = tokio::spawn(work(
            pipeline.clone(),
            db.clone(),
            metrics,
            reader,
            (config.reclaim_idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(10)),
            shutdown.subscribe(),
        ));
        tracing::info!(%addr, mode = ?config.mode, "seckill serving");
        Ok(Self {
            addr,
            shutdown,
            server,
            worker,
            pipeline,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Entries the pipeline dead-lettered.
    pub fn dead_letters(&self) -> u64 {
        self.pipeline.dead_letters()
    }

    /// Stops accepting requests, finishes those in flight, drains the
    /// pipeline, and returns.
    ///
    /// # Errors
    /// If the server failed.
    pub async fn stop(self) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        let _ = self.shutdown.send(true);
        self.server.await??;
        let served = started.elapsed();
        self.worker.await?;
        tracing::info!(
            requests_finished_in = ?served,
            pipeline_drained_in = ?(started.elapsed() - served),
            "seckill stopped"
        );
        Ok(())
    }
}

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

/// How often the backlog gauge is measured (an `XLEN` per sale worked, pipelined).
const MEASURE: Duration = Duration::from_secs(5);

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
async fn work(
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
