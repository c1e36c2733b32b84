//! Two service instances at once on one Redis and one PostgreSQL database:
//! purchases spread over both, both pipelines consuming the same streams.

use seckill::testing as support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use seckill::reconcile::reconcile;
use seckill::service::Service;
use seckill::settings::Settings;
use serde_json::Value;
use testkit::{PostgresServer, RedisServer};

const SECRET: &str = "two-instances-secret-01";

/// The commands `redis` has run since it started.
fn commands_processed(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

fn config(redis: &str, database: &str, consumer: &str) -> Settings {
    Settings {
        consumer: consumer.into(),
        ..support::settings(redis, database, SECRET)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_sale_and_the_pipeline_without_loss_or_duplicates() {
    const STOCK: i64 = 200;
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    let a = Service::start(config(&redis.url(), &pg.url(), "a"))
        .await
        .unwrap();
    let b = Service::start(config(&redis.url(), &pg.url(), "b"))
        .await
        .unwrap();
    let bases = Arc::new([
        format!("http://{}", a.addr()),
        format!("http://{}", b.addr()),
    ]);
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let voucher = support::open_voucher(&http, &bases[0], &tokens, "Shared", STOCK).await;

    // 600 users, each asking once through each instance, all at once.
    let calls: Vec<_> = (1..=600i64)
        .flat_map(|user| [0usize, 1].map(move |i| (user, i)))
        .map(|(user, i)| {
            let (http, bases, token) = (
                http.clone(),
                bases.clone(),
                tokens.mint(Principal::User(user), Duration::from_secs(60)),
            );
            tokio::spawn(async move {
                let r = http
                    .post(format!("{}/api/vouchers/{voucher}/seckill", bases[i]))
                    .bearer_auth(token)
                    .send()
                    .await
                    .unwrap();
                (
                    user,
                    r.status().is_success(),
                    r.json::<Value>().await.unwrap(),
                )
            })
        })
        .collect();
    let mut accepted = HashSet::new();
    let mut buyers = HashSet::new();
    for c in calls {
        let (user, ok, body) = c.await.unwrap();
        if ok {
            accepted.insert(body["order_id"].as_str().unwrap().parse::<i64>().unwrap());
            assert!(buyers.insert(user), "user {user} got two orders");
        }
    }
    assert_eq!(accepted.len() as i64, STOCK);

    a.stop().await.unwrap();
    b.stop().await.unwrap();
    let db = Database::connect(&pg.url()).await.unwrap();
    let stored: HashSet<i64> = db.order_ids(voucher).await.unwrap().into_iter().collect();
    assert_eq!(stored, accepted, "stored orders differ from accepted ones");
    let conn = seckill::store::connect(&redis.url()).await.unwrap();
    let found = reconcile(
        &seckill::store::Redis::new(conn.clone(), "seckill"),
        &db,
        voucher,
    )
    .await
    .unwrap();
    assert!(found.is_consistent(), "{:?}", found.differences());
    assert_eq!(found.db_stock, Some(0));
}

/// What an idle instance asks Redis does not grow with its open sales
/// (`docs/guarantees.md`, service 26): its commands per second with 200
/// open sales are those with 2, give or take the ticks a window catches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_asks_redis_as_much_with_200_open_sales_as_with_2() {
    const FEW: usize = 2;
    const MANY: usize = 200;
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("seckill-open-idle-{}", std::process::id()));
    let database = format!("sqlite://{}/idle.db", dir.display());
    let service = Service::start(Settings {
        reclaim_idle: Duration::from_millis(500),
        ..config(&redis.url(), &database, "open-idle")
    })
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let tokens = Arc::new(Tokens::new(SECRET.as_bytes()).unwrap());
    let base = Arc::new(format!("http://{}", service.addr()));
    let open = |from: usize, to: usize| {
        let (http, base, tokens) = (http.clone(), base.clone(), tokens.clone());
        futures_util::stream::iter(from..to)
            .map(move |i| {
                let (http, base, tokens) = (http.clone(), base.clone(), tokens.clone());
                async move {
                    support::open_voucher(&http, &base, &tokens, &format!("Open {i}"), 5).await
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<i64>>()
    };
    let commands = || commands_processed(&redis);
    let per_second = || async {
        let before = commands();
        let window = Duration::from_secs(5);
        tokio::time::sleep(window).await;
        (commands() - before) as f64 / window.as_secs_f64()
    };
    assert_eq!(open(0, FEW).await.len(), FEW);
    // Time is the subject: the takeover rounds after the start (2 × the
    // 500 ms takeover + 5 s) end, and the worker lists the sales (every
    // second).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let few = per_second().await;
    assert_eq!(open(FEW, MANY).await.len(), MANY - FEW);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let many = per_second().await;
    eprintln!("idle: {few:.1} Redis commands/s with {FEW} open sales, {many:.1} with {MANY}");
    assert!(
        many <= few * 1.5 + 2.0,
        "idle: {few:.1} Redis commands/s with {FEW} open sales, {many:.1} with {MANY}"
    );
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// An idle instance costs Redis almost nothing, however many
/// sales it has seen: 1,000 sales that were open and ended, and 10 open
/// ones, make fewer than 100 Redis commands a second. Then the 10
/// open sales under load still get every accepted order stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_instance_with_a_thousand_ended_sales_barely_touches_redis() {
    const ENDED: usize = 1_000;
    const OPEN: usize = 10;
    const STOCK: i64 = 30;
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("seckill-idle-{}", std::process::id()));
    let database = format!("sqlite://{}/idle.db", dir.display());
    let service = Service::start(config(&redis.url(), &database, "idle"))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let tokens = Arc::new(Tokens::new(SECRET.as_bytes()).unwrap());
    let base = Arc::new(format!("http://{}", service.addr()));
    // The sales open now and end in 10 s: the worker reads their streams
    // while they are open, and must let them go once they ended. A sale
    // created later than that (a slow, loaded machine) still gets two
    // seconds open: a window that ended already is refused.
    let ends = support::now_ms() + 10_000;
    let created = futures_util::stream::iter(0..ENDED)
        .map(|i| {
            let (http, base, tokens) = (http.clone(), base.clone(), tokens.clone());
            async move {
                let now = support::now_ms();
                let end = ends.max(now + 2_000);
                let window = now - 1_000..end;
                support::create_voucher(&http, &base, &tokens, &format!("Ended {i}"), 5, window)
                    .await;
                end
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<i64>>()
        .await;
    assert_eq!(created.len(), ENDED);
    let last_end = created.iter().copied().max().unwrap_or(ends);
    let mut open = Vec::new();
    for i in 0..OPEN {
        open.push(support::open_voucher(&http, &base, &tokens, &format!("Open {i}"), STOCK).await);
    }
    let commands = || commands_processed(&redis);
    // Time is the subject: wait out the sales and the worker's next
    // refresh of its list (every second).
    let wait = (last_end - support::now_ms()).max(0) as u64 + 2_500;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let before = commands();
    let window = Duration::from_secs(4);
    tokio::time::sleep(window).await;
    let per_second = (commands() - before) as f64 / window.as_secs_f64();
    eprintln!("{per_second:.0} Redis commands/s idle, {ENDED} ended and {OPEN} open sales");
    assert!(
        per_second < 100.0,
        "{per_second:.0} Redis commands/s idle with {ENDED} ended and {OPEN} open sales"
    );

    // The open sales under load: each sells out, every order is stored.
    let buys = open
        .iter()
        .flat_map(|&voucher| (1..=STOCK + 10).map(move |user| (voucher, user)));
    let accepted: Vec<(i64, i64)> = futures_util::stream::iter(buys)
        .map(|(voucher, user)| {
            let (http, base, tokens) = (http.clone(), base.clone(), tokens.clone());
            async move {
                let r = support::purchase(&http, &base, &tokens, voucher, user).await;
                let ok = r.status().is_success();
                let body: Value = r.json().await.unwrap();
                ok.then(|| {
                    (
                        voucher,
                        body["order_id"].as_str().unwrap().parse::<i64>().unwrap(),
                    )
                })
            }
        })
        .buffer_unordered(64)
        .filter_map(|x| async move { x })
        .collect()
        .await;
    assert_eq!(
        accepted.len(),
        OPEN * STOCK as usize,
        "every unit sold once"
    );
    service.stop().await.unwrap(); // drains the pipeline
    let db = Database::connect(&database).await.unwrap();
    for &voucher in &open {
        let stored: HashSet<i64> = db.order_ids(voucher).await.unwrap().into_iter().collect();
        let sold: HashSet<i64> = accepted
            .iter()
            .filter(|&&(v, _)| v == voucher)
            .map(|&(_, id)| id)
            .collect();
        assert_eq!(
            stored, sold,
            "voucher {voucher}: stored orders differ from accepted ones"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
