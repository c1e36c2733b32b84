//! The service as a Redis user with only the rules
//! `seckill::store::acl_rules` gives (`docs/guarantees.md`, service 20):
//! it sells, stores, takes payments and cancellations, expires orders,
//! repairs a sale after Redis lost it, and runs a sale's waiting room.

use seckill::testing as support;

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use seckill::service::Service;
use serde_json::Value;
use testkit::{RedisServer, ServerOptions, Transport};

const SECRET: &str = "acl-test-secret-0000001";

/// Service 20: a whole sale as the restricted user, through a Redis
/// restart without data (the user is in the server's configuration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_runs_as_a_user_with_only_the_documented_rules() {
    testkit::logs();
    let rules = seckill::store::acl_rules("seckill");
    let mut user: Vec<String> = ["--user", "shop", "on", ">shop-password"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    user.extend(rules.split(' ').map(str::to_owned));
    let mut redis = RedisServer::start_with(ServerOptions {
        transport: Transport::Tcp,
        extra_args: user,
        ..ServerOptions::default()
    });
    let url = redis
        .url()
        .replacen("redis://", "redis://shop:shop-password@", 1);
    let dir = std::env::temp_dir().join(format!("seckill-acl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let database = format!("sqlite://{}/shop.db", dir.display());
    let service = Service::start(support::settings(url, &database, SECRET))
        .await
        .unwrap();
    let base = format!("http://{}", service.addr());
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let now = support::now_ms();
    let voucher = support::create_voucher_from(
        &http,
        &base,
        &tokens,
        serde_json::json!({
            "title": "ACL sale", "stock": 40, "begin_ms": now - 1000,
            "end_ms": now + 3_600_000, "pay_within_ms": 3_000
        }),
    )
    .await;
    let mut accepted = Vec::new();
    for user in 1..=10 {
        let r = support::purchase(&http, &base, &tokens, voucher, user).await;
        assert_eq!(r.status(), StatusCode::OK);
        let body: Value = r.json().await.unwrap();
        accepted.push(body["order_id"].as_str().unwrap().to_owned());
    }
    let db = Database::connect(&database).await.unwrap();
    let stored = testkit::eventually(Duration::from_secs(30), || async {
        db.order_count(voucher).await.unwrap() == 10
    })
    .await;
    assert!(stored, "orders not stored");
    let act = |user: i64, order: &str, action: &str| {
        let request = http
            .post(format!("{base}/api/orders/{order}/{action}"))
            .bearer_auth(tokens.mint(Principal::User(user), Duration::from_secs(60)))
            .header("Idempotency-Key", format!("acl-{user}"));
        async move { request.send().await.unwrap().status() }
    };
    assert_eq!(act(1, &accepted[0], "pay").await, StatusCode::OK);
    assert_eq!(act(2, &accepted[1], "cancel").await, StatusCode::OK);
    // The rest expire (3 s window) and their units come back.
    let expired = testkit::eventually(Duration::from_secs(30), || async {
        db.order_states(voucher).await.unwrap().expired == 8
    })
    .await;
    assert!(expired, "orders did not expire");

    // Redis loses everything: the sale is restored and sells again.
    redis.restart();
    let resumed = testkit::eventually(Duration::from_secs(30), || async {
        support::purchase(&http, &base, &tokens, voucher, 100)
            .await
            .status()
            == StatusCode::OK
    })
    .await;
    assert!(resumed, "purchases never resumed after the restart");
    let buyers: HashSet<i64> = db.order_users(voucher).await.unwrap().into_iter().collect();
    assert!(buyers.contains(&1), "the paying buyer lost");

    // A sale behind a waiting room: joined, drawn, admitted, bought with
    // the pass.
    let begin = support::now_ms() + 1_000;
    let roomed = support::create_voucher_from(
        &http,
        &base,
        &tokens,
        serde_json::json!({
            "title": "ACL room", "stock": 5, "begin_ms": begin, "end_ms": begin + 3_600_000,
            "waiting_room": {"admit_per_s": 100, "opens_before_ms": 60_000}
        }),
    )
    .await;
    let room = |join: bool| {
        let url = format!("{base}/api/vouchers/{roomed}/room");
        let request = if join { http.post(url) } else { http.get(url) };
        let request = request.bearer_auth(tokens.mint(Principal::User(7), Duration::from_secs(60)));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert_eq!(room(true).await["state"], "awaiting_draw");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let pass = loop {
        if let Some(pass) = room(false).await["pass"].as_str() {
            break pass.to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "never admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let bought = http
        .post(format!("{base}/api/vouchers/{roomed}/seckill"))
        .bearer_auth(tokens.mint(Principal::User(7), Duration::from_secs(60)))
        .header("Room-Pass", pass)
        .send()
        .await
        .unwrap();
    assert_eq!(bought.status(), StatusCode::OK);
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
