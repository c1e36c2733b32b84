//! `cargo bench -p hasp-sql --bench sql_lock [-- --duration SECS]`
//!
//! The database lock on PostgreSQL beside hasp's Redis lock, same run, each
//! on a fresh private server: uncontended pairs/s (each task its own name)
//! at C = 1 and 16, and W2 (32 tasks on one name, each holding it 1 ms):
//! acquisitions/s and acquire-wait p99.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use testkit::{PostgresServer, RedisServer};

type Pair = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = Duration> + Send>> + Send + Sync>;

fn main() {
    let mut duration = Duration::from_secs(5);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--duration" {
            let secs: f64 = args
                .next()
                .and_then(|s| s.parse().ok())
                .expect("--duration SECS");
            duration = Duration::from_secs_f64(secs);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(duration));
}

async fn run(duration: Duration) {
    println!("hasp-sql benchmark: {duration:?} per measurement, 2 worker threads\n");
    println!("| lock | C = 1 pairs/s | C = 16 pairs/s | W2 acq/s (32 tasks, 1 ms) | W2 wait p99 |");
    println!("|---|---:|---:|---:|---:|");
    let redis = RedisServer::start_tcp();
    let client = hasp::Client::open(&redis.url()).await.unwrap();
    let uncontended: Pair = {
        let client = client.clone();
        Arc::new(move |i| {
            let lock = client.lock(&format!("u-{i}")).unwrap();
            Box::pin(async move {
                let t = Instant::now();
                lock.lock().await.unwrap().unlock().await.unwrap();
                t.elapsed()
            })
        })
    };
    let contended: Pair = {
        let client = client.clone();
        Arc::new(move |_| {
            let lock = client.lock("w2").unwrap();
            Box::pin(async move {
                let t = Instant::now();
                let guard = lock.lock().await.unwrap();
                let waited = t.elapsed();
                tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(1)));
                guard.unlock().await.unwrap();
                waited
            })
        })
    };
    row("hasp (Redis)", duration, uncontended, contended).await;
    drop(redis);

    let pg = PostgresServer::start();
    let sql = hasp_sql::SqlClient::open(
        &pg.url(),
        hasp_sql::SqlSettings::default().set_connections(20),
    )
    .await
    .unwrap();
    sql.migrate().await.unwrap();
    let uncontended: Pair = {
        let sql = sql.clone();
        Arc::new(move |i| {
            let lock = sql.lock(&format!("u-{i}")).unwrap();
            Box::pin(async move {
                let t = Instant::now();
                lock.lock().await.unwrap().unlock().await.unwrap();
                t.elapsed()
            })
        })
    };
    let contended: Pair = {
        let sql = sql.clone();
        Arc::new(move |_| {
            let lock = sql.lock("w2").unwrap();
            Box::pin(async move {
                let t = Instant::now();
                let guard = lock.lock().await.unwrap();
                let waited = t.elapsed();
                tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(1)));
                guard.unlock().await.unwrap();
                waited
            })
        })
    };
    row("hasp-sql (PostgreSQL)", duration, uncontended, contended).await;
}

async fn row(label: &str, duration: Duration, uncontended: Pair, contended: Pair) {
    let c1 = pairs(1, duration, uncontended.clone()).await.0;
    let c16 = pairs(16, duration, uncontended).await.0;
    let (w2, wait) = pairs(32, duration * 2, contended).await;
    println!(
        "| {label} | {c1:.0} | {c16:.0} | {w2:.0} | {:.1} ms |",
        wait.value_at_quantile(0.99) as f64 / 1000.0
    );
}

/// Pairs/s of `c` tasks running `pair(task)` in a loop, and the histogram
/// of what the pairs returned (µs).
async fn pairs(c: usize, duration: Duration, pair: Pair) -> (f64, Histogram<u64>) {
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let tasks: Vec<_> = (0..c)
        .map(|i| {
            let pair = pair.clone();
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new(3).unwrap();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let took = pair(i).await;
                    h.record(took.as_micros() as u64).unwrap();
                    n += 1;
                }
                (n, h)
            })
        })
        .collect();
    let mut total = 0;
    let mut all = Histogram::<u64>::new(3).unwrap();
    for t in tasks {
        let (n, h) = t.await.unwrap();
        total += n;
        all.add(h).unwrap();
    }
    (total as f64 / started.elapsed().as_secs_f64(), all)
}
