//! Start-up and shutdown: the service's parts wired from its settings (the
//! HTTP API, the purchase path, the order pipeline's worker, the expiry
//! sweep, the background check of Redis), on one Redis
//! and one database, and a graceful shutdown that drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret;
use tokio::sync::watch;

use crate::auth::Tokens;
use crate::db::Database;
use crate::http::Webhook;
use crate::http::{router, AppState, RateLimits, Shared};
use crate::live::Live;
use crate::order_life::OrderLife;
use crate::payments::provider::HttpProvider;
use crate::payments::{Payments, StandIn};
use crate::pipeline::{OrderPipeline, PipelineSettings};
use crate::repair::SaleRepair;
use crate::sale::{PurchasePath, Sales};
use crate::settings::PaymentSettings;
use crate::settings::{Mode, Settings, UserLocks};
use crate::store::{FastPath, OrderIdGenerator, Redis};
use crate::sync_path::SyncPath;

/// A started service.
#[derive(Debug)]
pub struct Service {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    worker: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    ticker: tokio::task::JoinHandle<()>,
    admitter: tokio::task::JoinHandle<()>,
    keeper: Option<tokio::task::JoinHandle<()>>,
    pipeline: Arc<OrderPipeline>,
}

impl Service {
    /// Connects, migrates, binds and starts serving and consuming.
    ///
    /// # Errors
    /// If Redis or the database is unreachable, a migration fails, or the
    /// address cannot be bound.
    pub async fn start(config: Settings) -> anyhow::Result<Self> {
        if config.demo_sign_in && !config.listen.ip().is_loopback() {
            anyhow::bail!(
                "demo_sign_in hands anyone any token: only with a loopback listen address"
            );
        }
        let db = Database::connect(&config.database_url).await?;
        db.migrate().await?;
        let redis = Redis::new(
            crate::store::connect_with(&config.redis_url, &config.redis_tls).await?,
            &config.prefix,
        );
        let fast = Arc::new(fast_path(&config, &redis).await?);
        let locks = crate::store::lock_client(
            &config.redis_url,
            &config.redis_tls,
            hasp::Settings::default(),
        )
        .await?;
        let purchases = purchase_path(&config, &db, &redis, &locks).await?;
        let metrics =
            crate::metrics::Metrics::new().map_err(|e| anyhow::anyhow!("metrics registry: {e}"))?;
        let pipeline = Arc::new(OrderPipeline::new(
            redis.clone(),
            db.clone(),
            PipelineSettings {
                reclaim_idle: config.reclaim_idle,
                ..PipelineSettings::new(config.consumer.clone())
            },
        )?);
        let repair = Arc::new(
            SaleRepair::new(
                fast.clone(),
                db.clone(),
                locks.clone(),
                Some(metrics.sale_repairs.clone()),
            )
            .with_pipeline(pipeline.clone()),
        );
        if config.mode == Mode::Async {
            // Redis may have restarted while no instance was running.
            if let Some(report) = repair.ensure_verified(None).await? {
                tracing::info!(?report, "sale state verified at start");
            }
        }
        let (shutdown, stop) = watch::channel(false);
        let keeper = (config.mode == Mode::Async).then(|| {
            tokio::spawn(crate::repair::keep_verified_until_stopped(
                repair.clone(),
                shutdown.subscribe(),
            ))
        });
        let sales = Arc::new(Sales::new(purchases, fast, db.clone(), repair));
        let (payments, webhook): (Arc<dyn Payments>, _) = match &config.payments {
            PaymentSettings::StandIn => (Arc::new(StandIn::default()), None),
            PaymentSettings::Provider {
                url,
                api_key,
                webhook_secret,
                tolerance,
            } => (
                Arc::new(HttpProvider::new(url, api_key.clone())?),
                Some(Webhook {
                    secret: webhook_secret.clone(),
                    tolerance: *tolerance,
                }),
            ),
        };
        let orders = Arc::new(OrderLife::new(
            db.clone(),
            sales.fast_path().cloned(),
            payments,
            metrics.clone(),
        ));
        let rooms = Arc::new(crate::waiting_room::WaitingRooms::new(
            crate::store::RoomLines::new(redis.clone()),
            db.clone(),
            sales.fast_path().cloned(),
        ));
        let live = Live::new(stop.clone());
        let secret = config
            .token_secret
            .as_ref()
            .map(|s| s.expose_secret().as_bytes());
        let tokens = Tokens::open(secret, config.tokens.clone()).await?;
        tokens.refresh_until_stopped(stop.clone());
        let state = AppState::new(Shared {
            db: db.clone(),
            sales,
            orders: orders.clone(),
            pay_within: config.pay_within,
            tokens: tokens.clone(),
            limits: RateLimits::new(config.user_limit, config.ip_limit),
            metrics: metrics.clone(),
            live: live.clone(),
            demo_sign_in: config.demo_sign_in,
            webhook,
            rooms: rooms.clone(),
        });
        let ticker = tokio::spawn(crate::live::tick_until_stopped(
            live,
            db.clone(),
            state.sales.clone(),
            rooms.lines().clone(),
            metrics.clone(),
        ));
        let admitter = tokio::spawn(crate::waiting_room::admit_until_stopped(
            rooms,
            shutdown.subscribe(),
        ));
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(crate::http::server::serve(
            listener,
            router(state),
            config.connections,
            stop,
        ));
        // Blocking reads need a connection of their own; a cluster's
        // streams cannot share one read (polled instead).
        let reader = match redis.connection() {
            crate::store::RedisConn::Server(_) | crate::store::RedisConn::Sentinel(_) => {
                Some(crate::store::connect_with(&config.redis_url, &config.redis_tls).await?)
            }
            crate::store::RedisConn::Cluster(_) => None,
        };
        let worker = tokio::spawn(crate::worker::work(
            pipeline.clone(),
            db.clone(),
            metrics,
            reader,
            (config.reclaim_idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(10)),
            shutdown.subscribe(),
        ));
        let sweeper = tokio::spawn(crate::order_life::sweep_until_stopped(
            orders,
            locks,
            config.prefix.clone(),
            config.sweep_every,
            shutdown.subscribe(),
        ));
        tracing::info!(%addr, mode = ?config.mode, "seckill serving");
        Ok(Self {
            addr,
            shutdown,
            server,
            worker,
            sweeper,
            ticker,
            admitter,
            keeper,
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
        self.sweeper.await?;
        self.ticker.await?;
        self.admitter.await?;
        if let Some(keeper) = self.keeper {
            keeper.await?;
        }
        tracing::info!(
            requests_finished_in = ?served,
            pipeline_drained_in = ?(started.elapsed() - served),
            "seckill stopped"
        );
        Ok(())
    }
}

/// The fast path on `redis`, with replica confirmation if the settings ask
/// for it.
async fn fast_path(config: &Settings, redis: &Redis) -> anyhow::Result<FastPath> {
    let fast = FastPath::new(redis.clone(), OrderIdGenerator::new(redis.clone(), 1000)?);
    Ok(match config.replica_ack {
        // WAIT blocks its connection: confirmation gets its own.
        Some(ack) => fast.with_replica_ack(
            ack,
            crate::store::connect_with(&config.redis_url, &config.redis_tls).await?,
        )?,
        None => fast,
    })
}

/// The purchase path the settings choose: the fast path, or the locked
/// path with per-user locks in Redis (`locks`) or in a database table.
async fn purchase_path(
    config: &Settings,
    db: &Database,
    redis: &Redis,
    locks: &hasp::Client,
) -> anyhow::Result<PurchasePath> {
    if config.mode == Mode::Async {
        return Ok(PurchasePath::Async);
    }
    let user_locks = match config.user_locks {
        UserLocks::Redis => crate::sync_path::UserLocks::Redis(locks.clone()),
        UserLocks::Database => {
            let table =
                hasp_sql::SqlClient::open(&config.database_url, hasp_sql::SqlSettings::default())
                    .await?;
            table.migrate().await?;
            crate::sync_path::UserLocks::Table(table)
        }
    };
    let sync = SyncPath::new(
        db.clone(),
        user_locks,
        OrderIdGenerator::new(redis.clone(), 1000)?,
        // A double click waits this long for the first click's purchase,
        // then is a 409.
        Duration::from_secs(1),
    )
    .with_prefix(config.prefix.clone());
    Ok(PurchasePath::Sync(Arc::new(sync)))
}
