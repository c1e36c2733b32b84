//! `seckill-tools demo`: a whole flash sale on one machine, verified.
//!
//! Starts a private redis-server (a private 3-master Redis Cluster with
//! `--cluster`; neither with `--redis-url`) and uses a SQLite
//! file in a temporary directory (unless `--database-url`), starts the
//! service, creates a voucher, sends purchases from many simulated users
//! over HTTP with high concurrency (the bench's closed loop), checks the
//! sale's invariants once the order pipeline has stored every order, then
//! runs the buyer model on the orders (`bench::after_sale`: some pay, some
//! cancel, some never pay; the units that come back are sold again until
//! every unit is paid), stops the service (which drains), checks the
//! invariants of the orders' whole life and prints a report. Returns
//! `false` if any invariant fails. The storefront and the operator console
//! are open throughout (their addresses are printed; the demo sign-in is on,
//! on loopback); `--watch` keeps them up after the run.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use seckill::auth::{Principal, Tokens};
use seckill::service::Service;
use seckill::settings::{Mode, PaymentSettings, Settings};

use crate::bench::after_sale::{AfterSalePlan, BuyerModel};
use crate::bench::checks::{self, Check, Sale, Stores};
use crate::bench::load::{self, Arrival, Plan, Progress, Until};
use crate::bench::{create_voucher, report, ProgressDisplay};
use crate::payments::Simulator;

/// Options of `seckill-tools demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Use this Redis instead of starting a private one
    /// (`redis+cluster://host:port,...` for a cluster).
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Start a private 3-master Redis Cluster instead of one redis-server.
    #[arg(long, conflicts_with = "redis_url")]
    pub cluster: bool,
    /// Use this database instead of a temporary SQLite file.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Purchase path.
    #[arg(long, value_enum, default_value_t = Mode::Async)]
    pub mode: Mode,
    /// Units for sale.
    #[arg(long, default_value_t = 1_000)]
    pub stock: i64,
    /// Simulated users.
    #[arg(long, default_value_t = 20_000)]
    pub users: i64,
    /// Purchase requests per user.
    #[arg(long, default_value_t = 3)]
    pub requests_per_user: u32,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Share of buyers who pay at once.
    #[arg(long, default_value_t = 0.7)]
    pub pay_share: f64,
    /// Share of buyers who cancel (the rest never pay).
    #[arg(long, default_value_t = 0.1)]
    pub cancel_share: f64,
    /// Share of the paying buyers who have the order refunded.
    #[arg(long, default_value_t = 0.1)]
    pub refund_share: f64,
    /// Share of the paying buyers who redeem the order at the shop.
    #[arg(long, default_value_t = 0.2)]
    pub redeem_share: f64,
    /// How long buyers have to pay.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub pay_within: Duration,
    /// Rounds of the buyer model at most (the last one's buyers all pay).
    #[arg(long, default_value_t = 4)]
    pub rounds: u32,
    /// After the run, keep the service up (until Ctrl-C) with a new sale
    /// opening in 30 s, for a person to watch and buy in the storefront.
    #[arg(long)]
    pub watch: bool,
}

const PREFIX: &str = "seckill";

/// Runs the demo; `Ok(false)` if an invariant failed.
///
/// # Errors
/// If a part cannot be started (Redis, database, listener).
pub async fn run(args: DemoArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(args.stock > 0, "--stock must be positive");
    anyhow::ensure!(
        (1..=load::MAX_USERS as i64).contains(&args.users),
        "--users must be between 1 and {}",
        load::MAX_USERS
    );
    anyhow::ensure!(
        args.requests_per_user > 0,
        "--requests-per-user must be positive"
    );
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be positive");
    let model = BuyerModel::new(args.pay_share, args.cancel_share)?
        .with_after_payment(args.refund_share, args.redeem_share)?;
    anyhow::ensure!(
        (1..=100).contains(&args.rounds),
        "--rounds must be between 1 and 100"
    );
    let (private_redis, private_cluster);
    let redis_url = match &args.redis_url {
        Some(url) => url.clone(),
        None if args.cluster => {
            private_cluster = launcher::RedisCluster::try_start(3)?;
            let nodes: Vec<String> = private_cluster
                .nodes
                .iter()
                .filter_map(|n| n.port())
                .map(|port| format!("127.0.0.1:{port}"))
                .collect();
            let url = format!("{}{}", seckill::store::CLUSTER_SCHEME, nodes.join(","));
            println!("redis: private 3-master Redis Cluster at {url}");
            url
        }
        None => {
            private_redis =
                launcher::RedisServer::try_start_with(launcher::ServerOptions::default())?;
            println!("redis: private redis-server at {}", private_redis.url());
            private_redis.url()
        }
    };
    let tmp = std::env::temp_dir().join(format!("seckill-demo-{}", std::process::id()));
    let database_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}/demo.db", tmp.display()));
    println!("database: {database_url}");
    // Never shorter than the 16 bytes tokens need, whatever the pid.
    let secret = format!("seckill-demo-secret-{:010}", std::process::id());
    // Payments confirmed by signed callback, as real providers do: some
    // late, some out of order, some twice, some beside a forged copy.
    let (api_key, webhook_secret) = ("sk_demo", format!("whsec-demo-{}", std::process::id()));
    let provider = Simulator::spawn(
        api_key,
        &webhook_secret,
        &[
            "--delay-ms",
            "100",
            "--reorder-ms",
            "200",
            "--duplicate",
            "0.2",
            "--forge",
            "0.05",
        ],
    )
    .await?;
    println!(
        "payments: provider simulator at {} (callbacks signed; 20% sent twice, 5% beside a forged copy, up to 0.3 s late and out of order)",
        provider.base
    );
    let service = Service::start(Settings {
        listen: "127.0.0.1:0".parse()?,
        mode: args.mode,
        prefix: PREFIX.into(),
        consumer: "demo".into(),
        user_limit: seckill::http::Limit::per_second(5),
        // Every simulated user comes from 127.0.0.1: no per-IP limit here,
        // on requests or connections.
        ip_limit: None,
        connections: seckill::http::ConnectionLimits {
            max_per_address: seckill::http::ConnectionLimits::default().max_connections,
            ..seckill::http::ConnectionLimits::default()
        },
        // Loopback only: a person watching may sign in as anyone.
        demo_sign_in: true,
        payments: PaymentSettings::Provider {
            url: provider.base.clone(),
            api_key: api_key.into(),
            webhook_secret: webhook_secret.clone().into(),
            tolerance: seckill::payments::events::DEFAULT_TOLERANCE,
        },
        ..Settings::new(&redis_url, &database_url, &secret)
    })
    .await?;
    let base = format!("http://{}", service.addr());
    provider.call_back(std::slice::from_ref(&base)).await?;
    println!("storefront: {base}/   operator console: {base}/admin   (demo sign-in on: pick a user id, or the operator)");
    let tokens = Tokens::new(secret.as_bytes())?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;
    let voucher = create_voucher(&http, &base, &tokens, args.stock, Some(args.pay_within)).await?;
    println!(
        "sale: voucher {voucher}, {} units, {} users x {} requests, {} in flight, {:?} path",
        args.stock, args.users, args.requests_per_user, args.concurrency, args.mode
    );

    // Every user asks several times, interleaved as real crowds do.
    let until = Until::Requests(args.users as u64 * u64::from(args.requests_per_user));
    let plan = Plan {
        targets: vec![format!("{base}/api/vouchers/{voucher}/seckill")],
        user_tokens: Arc::new(
            (1..=args.users)
                .map(|u| tokens.mint(Principal::User(u), Duration::from_secs(3600)))
                .collect(),
        ),
        arrival: Arrival::Closed {
            concurrency: args.concurrency,
        },
        until,
    };
    let progress = Arc::new(Progress::default());
    let display = ProgressDisplay::start(until, progress.clone())?;
    let record = load::run(http.clone(), plan, progress).await;
    display.finish();
    println!("\n== report ==");
    report::print_summary(&record);
    let sale = Sale {
        voucher,
        stock: args.stock,
        record: &record,
        returned: 0,
    };
    // The sale as the purchases left it, once the pipeline stored every
    // order (the service runs on: the orders' life goes on, and an order
    // not paid in time may already have given its unit back).
    let stores = Stores::connect(
        Some(&redis_url),
        &seckill::store::RedisTls::default(),
        Some(&database_url),
        PREFIX,
    )
    .await?;
    let stored_started = Instant::now();
    let verified = stores.verify(sale, Duration::from_secs(60), 0).await?;
    println!(
        "every order stored {:.2?} after the last response",
        stored_started.elapsed()
    );
    let sale = Sale {
        returned: verified.returned,
        ..sale
    };
    let mut all = checks::from_answers(sale);
    // Every user asked at least once, so the stock sells out (units given
    // back sell again) or every user buys.
    all.push(Check::new(
        "no undersell: all stock sold while buyers remained",
        record.orders.len() as i64 >= args.stock.min(args.users),
    ));
    all.extend(verified.checks);
    let mut differences = verified.differences;

    let plan = AfterSalePlan {
        bases: vec![base.clone()],
        voucher,
        model,
        rounds: args.rounds,
        pay_within: args.pay_within,
        concurrency: args.concurrency,
        first_new_user: args.users + 1,
    };
    let life =
        crate::bench::after_sale_run(&http, &tokens, &plan, &record, &stores, args.stock).await;
    all.extend(life.checks);
    differences.extend(life.differences);
    // The buyers are done: every charge the sale will see is made; the
    // provider's last callbacks may still be on their way.
    let ledger = provider.settled_ledger(Duration::from_secs(30)).await?;
    if let Some(orders) = stores.order_money(voucher).await? {
        let (money, lines) = checks::money_checks(&ledger, &orders);
        for line in lines {
            println!("{line}");
        }
        all.extend(money);
    }

    if args.watch {
        let ok = checks::print(&all, &differences);
        let begin = SystemTime::now() + Duration::from_secs(30);
        let next = crate::bench::create_voucher_at(
            &http,
            &base,
            &tokens,
            "Watch me: 100 vouchers",
            100,
            begin,
            None,
        )
        .await?;
        println!(
            "\nwatching: voucher {next} (100 units) opens in 30 s.\n  storefront: {base}/\n  console:    {base}/admin\nCtrl-C stops the service."
        );
        tokio::signal::ctrl_c().await?;
        service.stop().await?;
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(ok);
    }
    // A graceful stop finishes the requests in flight and drains the order
    // pipeline.
    let drain_started = Instant::now();
    service.stop().await?;
    println!("service stopped in {:.2?}", drain_started.elapsed());
    let ok = checks::print(&all, &differences);
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(ok)
}
