//! Kill the service (SIGKILL) while accepted orders are still in the
//! pipeline, start it again, and find every accepted order exactly once.

mod support;

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use serde_json::Value;
use testkit::RedisServer;

const SECRET: &str = "crash-test-secret-0123";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn serve(redis: &str, database: &str, port: u16, consumer: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_seckill"))
        .args(["serve", "--redis-url", redis, "--database-url", database])
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--consumer",
            consumer,
        ])
        .args(["--reclaim-idle-ms", "500", "--ip-rate", "0"])
        .env("SECKILL_TOKEN_SECRET", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start seckill serve")
}

async fn wait_healthy(http: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "service never became healthy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_service_loses_and_doubles_no_accepted_order() {
    const STOCK: i64 = 1_500;
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("seckill-crash-{}", std::process::id()));
    let database = format!("sqlite://{}/crash.db", dir.display());
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();

    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut first = serve(&redis.url(), &database, port, "first");
    wait_healthy(&http, &base).await;
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
                    let r: Value = http
                        .post(format!("{base}/api/vouchers/{voucher}/seckill"))
                        .bearer_auth(tokens.mint(Principal::User(user), Duration::from_secs(600)))
                        .send()
                        .await
                        .unwrap()
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
    signal(&first, "STOP");
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
    signal(&first, "KILL");
    first.wait().unwrap();
    assert!(
        in_stream > 0,
        "the pipeline had already finished: nothing was in flight at the kill"
    );

    // A new instance takes over the dead one's pending entries.
    let mut second = serve(&redis.url(), &database, port, "second");
    wait_healthy(&http, &base).await;
    let db = Database::connect(&database).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.order_count(voucher).await.unwrap() < STOCK {
        assert!(
            Instant::now() < deadline,
            "orders missing after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal(&second, "TERM");
    second.wait().unwrap();

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
