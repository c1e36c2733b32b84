//! A tour of hasp against a real Redis: contention across clients with
//! fencing, the watchdog, and loss detection. Exits non-zero if any check
//! fails.
//!
//! Runs against `REDIS_URL` if set, otherwise starts a private redis-server
//! on a unix socket in a temporary directory.
//!
//! ```sh
//! cargo run --release -p hasp --example demo
//! ```

use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use hasp::{Client, Settings};

const CLIENTS: usize = 4;
const TASKS_PER_CLIENT: usize = 8;
const ROUNDS: usize = 50;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let private;
    let url = match std::env::var("REDIS_URL") {
        Ok(url) => url,
        Err(_) => {
            private = testkit::RedisServer::start();
            println!("started a private redis-server at {}", private.url());
            private.url()
        }
    };
    let settings = Settings::default().set_watchdog_timeout(Duration::from_secs(1));

    // 1. Contention: CLIENTS clients (think: service instances), each with
    //    TASKS_PER_CLIENT tasks, read-modify-write one counter under one lock.
    //    The protected store rejects writes whose fencing token is not newer
    //    than the last one it accepted.
    let mut raw = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("DEL")
        .arg("demo:counter")
        .arg("demo:last-token")
        .query_async(&mut raw)
        .await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = Client::open_with(&url, settings.clone()).await?;
        for _ in 0..TASKS_PER_CLIENT {
            let lock = client.lock("demo:counter")?;
            let mut raw = raw.clone();
            tasks.push(tokio::spawn(async move {
                let mut waits = Vec::with_capacity(ROUNDS);
                for _ in 0..ROUNDS {
                    let asked = Instant::now();
                    let guard = lock.lock().await?;
                    waits.push(asked.elapsed());
                    let token = guard.fencing_token();
                    let (n, last): (Option<i64>, Option<u64>) = redis::pipe()
                        .get("demo:counter")
                        .get("demo:last-token")
                        .query_async(&mut raw)
                        .await?;
                    ensure!(last.unwrap_or(0) < token, "stale fencing token {token}");
                    let _: () = redis::pipe()
                        .set("demo:counter", n.unwrap_or(0) + 1)
                        .set("demo:last-token", token)
                        .query_async(&mut raw)
                        .await?;
                    guard.unlock().await?;
                }
                anyhow::Ok(waits)
            }));
        }
    }
    let mut waits = Vec::new();
    for t in tasks {
        waits.extend(t.await??);
    }
    let took = started.elapsed();
    let counter: i64 = redis::cmd("GET")
        .arg("demo:counter")
        .query_async(&mut raw)
        .await?;
    let expected = (CLIENTS * TASKS_PER_CLIENT * ROUNDS) as i64;
    waits.sort();
    let pct = |p: f64| waits[((waits.len() - 1) as f64 * p) as usize];
    println!(
        "contention: {CLIENTS} clients x {TASKS_PER_CLIENT} tasks x {ROUNDS} rounds -> counter {counter} (expected {expected}) \
         in {took:.2?}: {:.0} acquisitions/s, wait p50 {:.2?} p99 {:.2?} max {:.2?}",
        expected as f64 / took.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    ensure!(counter == expected, "lost updates: {counter} != {expected}");

    // 2. Watchdog: a lock without lease outlives its 1 s lease while held.
    let client = Client::open_with(&url, settings.clone()).await?;
    let lock = client.lock("demo:long-job")?;
    let guard = lock.lock().await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ttl = lock.remaining_ttl().await?.context("lock vanished")?;
    println!(
        "watchdog: held for 3 s with a 1 s lease; remaining TTL {ttl:?}; renew calls so far {}",
        client.stats().renew_calls
    );
    ensure!(
        lock.is_held_by_me().await?,
        "the watchdog let the lock expire"
    );

    // 3. Loss detection: someone deletes the key behind the holder's back.
    let _: () = redis::cmd("DEL")
        .arg("hasp:{demo:long-job}")
        .query_async(&mut raw)
        .await?;
    let noticed = Instant::now();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .context("loss was not noticed")?;
    println!(
        "loss detection: noticed {:?} after the key was deleted",
        noticed.elapsed()
    );
    ensure!(
        matches!(guard.unlock().await, Err(hasp::Error::NotHeld { .. })),
        "release of a lost lock must be NotHeld"
    );

    println!("all checks passed");
    Ok(())
}
