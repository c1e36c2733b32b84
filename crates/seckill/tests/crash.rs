//! Kill the service (SIGKILL) while accepted orders are still in the
//! pipeline, start it again, and find every accepted order exactly once.

mod support;

use support::ServeProcess;

use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use seckill::auth::Tokens;
use seckill::db::Database;
use serde_json::Value;
use testkit::RedisServer;

const SECRET: &str = "crash-test-secret-0123";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_service_loses_and_doubles_no_accepted_order() {
    const STOCK: i64 = 1_500;
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("seckill-crash-{}", std::process::id()));
    let database = format!("sqlite://{}/crash.db", dir.display());
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();

    let mut first = ServeProcess::start(&redis.url(), &database, "first", SECRET).await;
    let base = first.base.clone();
    let voucher = support::open_voucher(&http, &base, &tokens, "Crash sale", STOCK).await;

    // Buy everything, 64 at a time.
    let next = Arc::new(std::sync::atomic::AtomicI64::new(1));
    let workers: Vec<_> = (0..64)
        .map(|_| {
            let (http, base, tokens, next) =
                (http.clone(), base.clone(), tokens.clone(), next.clone());
            tokio::spawn(async move {
                let mut accepted = Vec::new();
                loop {
                    let user = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if user > STOCK {
                        return accepted;
                    }
                    let r: Value = support::purchase(&http, &base, &tokens, voucher, user)
                        .await
                        .json()
                        .await
                        .unwrap();
                    accepted.push(
                        r["order_id"]
                            .as_str()
                            .expect("accepted")
                            .parse::<i64>()
                            .unwrap(),
                    );
                }
            })
        })
        .collect();
    let mut accepted = HashSet::new();
    for w in workers {
        accepted.extend(w.await.unwrap());
    }
    assert_eq!(accepted.len() as i64, STOCK);

    // Freeze the service, confirm orders are still in flight, then kill it.
    first.signal("STOP");
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let in_stream: i64 = redis::cmd("XLEN")
        .arg(format!("seckill:{{v{voucher}}}:orders"))
        .query_async(&mut conn)
        .await
        .unwrap();
    first.end("KILL");
    assert!(
        in_stream > 0,
        "the pipeline had already finished: nothing was in flight at the kill"
    );

    // A new instance takes over the dead one's pending entries.
    let mut second = ServeProcess::start(&redis.url(), &database, "second", SECRET).await;
    let db = Database::connect(&database).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.order_count(voucher).await.unwrap() < STOCK {
        assert!(
            Instant::now() < deadline,
            "orders missing after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    second.end("TERM");

    // Exactly once: every accepted id stored, nothing else, stock consistent.
    assert_eq!(db.order_count(voucher).await.unwrap(), STOCK);
    assert_eq!(db.voucher_stock(voucher).await.unwrap(), Some(0));
    let stored: HashSet<i64> = stored_ids(&db, voucher).await;
    assert_eq!(stored, accepted, "stored orders differ from accepted ones");
    // And the operator's check agrees.
    let reconciled = Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args([
            "reconcile",
            "--redis-url",
            &redis.url(),
            "--database-url",
            &database,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&reconciled.stdout);
    assert!(reconciled.status.success(), "{text}");
    assert!(text.contains("consistent"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
    eprintln!("{in_stream} orders were in the stream at the kill");
}

async fn stored_ids(db: &Database, voucher: i64) -> HashSet<i64> {
    db.order_ids(voucher).await.unwrap().into_iter().collect()
}
