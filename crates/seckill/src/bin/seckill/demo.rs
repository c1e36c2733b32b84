//! `seckill demo`: a whole flash sale on one machine, verified.
//!
//! Starts a private redis-server (unless `--redis-url`) and uses a SQLite
//! file in a temporary directory (unless `--database-url`), starts the
//! service, creates a voucher, sends purchases from many simulated users
//! over HTTP with high concurrency, waits for the order pipeline to drain,
//! then checks the invariants and prints a report. Returns `false` if any
//! invariant fails.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use hdrhistogram::Histogram;
use redis::aio::ConnectionManager;
use serde_json::{json, Value};

use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use seckill::reconcile::reconcile;
use seckill::service::{Mode, Service, ServiceConfig};

/// Options of `seckill demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Use this Redis instead of starting a private one.
    #[arg(long)]
    pub redis_url: Option<String>,
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
}

const PREFIX: &str = "seckill";

/// Runs the demo; `Ok(false)` if an invariant failed.
///
/// # Errors
/// If a part cannot be started (Redis, database, listener).
pub async fn run(args: DemoArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(args.stock > 0, "--stock must be positive");
    anyhow::ensure!(args.users > 0, "--users must be positive");
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be positive");
    let private_redis;
    let redis_url = match &args.redis_url {
        Some(url) => url.clone(),
        None => {
            private_redis = testkit::RedisServer::start();
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
    let secret = format!("demo-secret-{}", std::process::id());
    let service = Service::start(ServiceConfig {
        redis_url: redis_url.clone(),
        database_url: database_url.clone(),
        listen: "127.0.0.1:0".parse()?,
        token_secret: secret.clone(),
        mode: args.mode,
        prefix: PREFIX.into(),
        consumer: "demo".into(),
        reclaim_idle: Duration::from_secs(30),
        user_limit: seckill::http::Limit::per_second(5),
        // Every simulated user comes from 127.0.0.1: no per-IP limit here.
        ip_limit: None,
    })
    .await?;
    let base = format!("http://{}", service.addr());
    let tokens = Tokens::new(secret.as_bytes())?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()?;

    // The voucher, on sale from now for an hour.
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let created: Value = http
        .post(format!("{base}/api/vouchers"))
        .bearer_auth(tokens.mint(Principal::Admin, Duration::from_secs(600)))
        .json(&json!({
            "title": "Demo flash sale", "stock": args.stock,
            "begin_ms": now_ms - 1_000, "end_ms": now_ms + 3_600_000
        }))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let voucher = created["id"].as_i64().context("voucher id")?;
    println!(
        "sale: voucher {voucher}, {} units, {} users x {} requests, {} in flight, {:?} path",
        args.stock, args.users, args.requests_per_user, args.concurrency, args.mode
    );

    let report = fire(&http, &base, &tokens, voucher, &args).await?;
    // A graceful stop finishes the requests in flight and drains the order
    // pipeline; the checks then read Redis and the database themselves.
    let drain_started = Instant::now();
    service.stop().await?;
    println!(
        "pipeline drained {:.2?} after the last response",
        drain_started.elapsed()
    );
    let ok = verify(&redis_url, &database_url, voucher, &args, &report).await?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(ok)
}

/// What the load generator saw.
struct LoadReport {
    accepted_users: Vec<i64>,
    refused: u64,
    rate_limited: u64,
    errors: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

async fn fire(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    voucher: i64,
    args: &DemoArgs,
) -> anyhow::Result<LoadReport> {
    // Every user asks several times, interleaved as real crowds do.
    let total = args.users as u64 * u64::from(args.requests_per_user);
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} requests {per_sec} eta {eta}",
    )?);
    let url = Arc::new(format!("{base}/api/vouchers/{voucher}/seckill"));
    let user_tokens: Arc<Vec<String>> = Arc::new(
        (1..=args.users)
            .map(|u| tokens.mint(Principal::User(u), Duration::from_secs(3600)))
            .collect(),
    );
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(AtomicU64::new(0));
    let rate_limited = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latency = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let users = args.users as u64;
    let started = Instant::now();
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            let (
                http,
                url,
                user_tokens,
                next,
                accepted,
                refused,
                rate_limited,
                errors,
                latency,
                bar,
            ) = (
                http.clone(),
                url.clone(),
                user_tokens.clone(),
                next.clone(),
                accepted.clone(),
                refused.clone(),
                rate_limited.clone(),
                errors.clone(),
                latency.clone(),
                bar.clone(),
            );
            tokio::spawn(async move {
                let mut local =
                    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    // Spread a user's requests over the run: i-th request
                    // goes to user (i * prime) mod users.
                    let user = (i.wrapping_mul(7_919) % users) as usize;
                    let sent = Instant::now();
                    let response = http
                        .post(url.as_str())
                        .bearer_auth(&user_tokens[user])
                        .send()
                        .await;
                    let _ = local.record(sent.elapsed().as_micros() as u64);
                    match response.map(|r| r.status()) {
                        Ok(s) if s.is_success() => {
                            accepted.lock().expect("lock").push(user as i64 + 1)
                        }
                        Ok(s) if s == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                            rate_limited.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(s) if s.is_client_error() => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    bar.inc(1);
                }
                latency
                    .lock()
                    .expect("lock")
                    .add(&local)
                    .expect("same bounds");
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let accepted_users = std::mem::take(&mut *accepted.lock().expect("lock"));
    let latency = latency.lock().expect("lock").clone();
    Ok(LoadReport {
        accepted_users,
        refused: refused.load(Ordering::Relaxed),
        rate_limited: rate_limited.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        elapsed,
        latency,
    })
}

async fn verify(
    redis_url: &str,
    database_url: &str,
    voucher: i64,
    args: &DemoArgs,
    load: &LoadReport,
) -> anyhow::Result<bool> {
    let db = Database::connect(database_url).await?;
    let conn = ConnectionManager::new(redis::Client::open(redis_url)?).await?;
    let found = reconcile(&conn, &db, PREFIX, voucher).await?;
    let dead_letters: i64 = redis::cmd("XLEN")
        .arg(seckill::store::dead_letter_stream(PREFIX))
        .query_async(&mut conn.clone())
        .await?;
    let requests = args.users as u64 * u64::from(args.requests_per_user);
    let accepted = load.accepted_users.len() as i64;
    let distinct: HashSet<i64> = load.accepted_users.iter().copied().collect();
    let db_orders = db.order_count(voucher).await?;
    let expected_sold = args.stock.min(args.users);
    let ms = |q: f64| load.latency.value_at_quantile(q) as f64 / 1000.0;

    println!("\n== report ==");
    println!(
        "requests: {requests} in {:.2?} = {:.0} requests/s; accepted {accepted}, refused {} (sold out / already bought), rate-limited {}, errors {}",
        load.elapsed,
        requests as f64 / load.elapsed.as_secs_f64(),
        load.refused,
        load.rate_limited,
        load.errors
    );
    println!(
        "latency: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        ms(0.999),
        load.latency.max() as f64 / 1000.0
    );
    let db_stock = db.voucher_stock(voucher).await?;
    let mut checks = vec![
        ("no request failed", load.errors == 0),
        ("no oversell: accepted <= stock", accepted <= args.stock),
        (
            "no undersell: all stock sold while buyers remained",
            accepted == expected_sold,
        ),
        ("one order per user", distinct.len() as i64 == accepted),
        (
            "every accepted order is in the database",
            db_orders == accepted,
        ),
        (
            "database stock = stock - orders",
            db_stock == Some(args.stock - db_orders),
        ),
    ];
    // On the async path Redis decides and the database follows: they must
    // agree. On the sync path the database alone decides.
    if args.mode == Mode::Async {
        checks.extend([
            (
                "Redis stock equals database stock",
                found.redis_stock == found.db_stock,
            ),
            ("nothing pending in the pipeline", found.in_stream == 0),
            ("nothing dead-lettered", dead_letters == 0),
            (
                "Redis and database agree (reconcile)",
                found.is_consistent(),
            ),
        ]);
    }
    let mut ok = true;
    for (what, held) in checks {
        println!("[{}] {what}", if held { "ok" } else { "FAILED" });
        ok &= held;
    }
    for difference in found
        .differences()
        .iter()
        .filter(|_| args.mode == Mode::Async)
    {
        println!("  {difference}");
    }
    println!(
        "{}",
        if ok {
            "all invariants hold"
        } else {
            "INVARIANTS FAILED"
        }
    );
    Ok(ok)
}
