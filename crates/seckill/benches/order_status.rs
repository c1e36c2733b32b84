//! Order status (`GET /api/vouchers/{id}/order`'s lookup) beside the number
//! of orders waiting in the voucher's stream: 10,000 and 100,000
//! accepted orders the pipeline has not stored yet, then buyers' status
//! asked one at a time through `Sales::order_of` (the database first, then
//! Redis). The same lookups with the `order-of` hash deleted take the path
//! of sales from before it (a bounded stream scan): what every lookup cost
//! before.
//!
//! `cargo bench -p seckill --bench order_status` (a private redis-server
//! and a SQLite file; about a minute).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use hdrhistogram::Histogram;
use seckill::db::Database;
use seckill::domain::voucher::{SaleTerms, Title};
use seckill::repair::SaleRepair;
use seckill::sale::{PurchasePath, Sales};
use seckill::store::{FastPath, OrderIdGenerator, VoucherKeys};

/// Lookups per row.
const LOOKUPS: u64 = 5_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let redis = testkit::RedisServer::start();
    let dir = std::env::temp_dir().join(format!("seckill-order-status-{}", std::process::id()));
    let db = Database::connect(&format!("sqlite://{}/bench.db", dir.display())).await?;
    db.migrate().await?;
    let conn = seckill::store::connect(&redis.url()).await?;
    let fast = Arc::new(FastPath::new(
        seckill::store::Redis::new(conn.clone(), "seckill"),
        OrderIdGenerator::new(seckill::store::Redis::new(conn.clone(), "seckill"), 1_000)?,
    ));
    let locks = seckill::store::lock_client(
        &redis.url(),
        &seckill::store::RedisTls::default(),
        hasp::Settings::default(),
    )
    .await?;
    let repair = Arc::new(SaleRepair::new(fast.clone(), db.clone(), locks, None));
    let sales = Sales::new(PurchasePath::Async, fast.clone(), db.clone(), repair);
    println!("| orders in the stream | lookup | p50 ms | p99 ms | max ms | lookups/s | found |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for orders in [10_000i64, 100_000] {
        let now = SystemTime::now();
        let terms = SaleTerms::new(
            orders,
            now - Duration::from_secs(60),
            now + Duration::from_secs(3600),
        )?;
        let voucher = db
            .create_voucher(&Title::parse(&format!("{orders} orders"))?, &terms)
            .await?;
        fast.load_voucher(voucher, &terms).await?;
        fast.arm(voucher).await?;
        // Every unit sold; no pipeline runs, so every order stays in the
        // stream.
        let sold = futures_util::stream::iter(1..=orders)
            .map(|user| {
                let fast = fast.clone();
                async move { fast.purchase(voucher, user).await }
            })
            .buffer_unordered(64)
            .filter(|r| std::future::ready(r.is_ok()))
            .count()
            .await;
        anyhow::ensure!(sold as i64 == orders, "{sold} of {orders} purchases made");
        for (name, without_index) in [("order-of hash", false), ("stream scan (before)", true)] {
            if without_index {
                let _: () = redis::cmd("DEL")
                    .arg(VoucherKeys::new("seckill", voucher).order_of)
                    .query_async(&mut conn.clone())
                    .await?;
            }
            let mut latency = Histogram::<u64>::new(3)?;
            let started = Instant::now();
            let mut found_all = 0;
            for i in 0..LOOKUPS {
                // Spread over the whole stream.
                let user = 1 + (i as i64 * 7_919) % orders;
                let t = Instant::now();
                let found = sales.order_of(voucher, user).await?;
                latency.record(t.elapsed().as_micros() as u64)?;
                // The scan is bounded (10,000 entries): later buyers are
                // not found, which was the old layout's other flaw.
                found_all += u64::from(found.is_some());
            }
            if !without_index {
                anyhow::ensure!(found_all == LOOKUPS, "a buyer's order was not found");
            }
            let rate = LOOKUPS as f64 / started.elapsed().as_secs_f64();
            let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1_000.0;
            println!(
                "| {orders} | {name} | {:.3} | {:.3} | {:.3} | {rate:.0} | {found_all}/{LOOKUPS} |",
                ms(0.5),
                ms(0.99),
                latency.max() as f64 / 1_000.0
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    Ok(())
}
