//! The service repairs a sale's Redis state that Redis lost or
//! rolled back, from the database, with purchases answered 503 meanwhile,
//! and no oversell or duplicate across two instances.

use seckill::testing as support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use seckill::service::Service;
use seckill::settings::Settings;
use serde_json::Value;
use testkit::{RedisServer, ServerOptions};

const SECRET: &str = "repair-test-secret-0001";

struct Shop {
    redis: RedisServer,
    db: Database,
    db_url: String,
    instances: [Service; 2],
    tokens: Tokens,
    http: reqwest::Client,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two instances on `redis` and a fresh SQLite file.
async fn shop(what: &str, redis: RedisServer) -> Shop {
    let dir = std::env::temp_dir().join(format!("seckill-repair-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let database = format!("sqlite://{}/shop.db", dir.display());
    let config = |consumer: &str| Settings {
        consumer: consumer.into(),
        reclaim_idle: Duration::from_millis(500),
        ..support::settings(redis.url(), &database, SECRET)
    };
    let a = Service::start(config("a")).await.unwrap();
    let b = Service::start(config("b")).await.unwrap();
    Shop {
        db: Database::connect(&database).await.unwrap(),
        db_url: database,
        redis,
        instances: [a, b],
        tokens: Tokens::new(SECRET.as_bytes()).unwrap(),
        http: reqwest::Client::new(),
        _dir: TempDir(dir),
    }
}

impl Shop {
    fn base(&self, i: usize) -> String {
        format!("http://{}", self.instances[i % 2].addr())
    }

    async fn open_voucher(&self, stock: i64) -> i64 {
        support::open_voucher(
            &self.http,
            &self.base(0),
            &self.tokens,
            "Repair sale",
            stock,
        )
        .await
    }

    /// One purchase: `(status, code or "accepted", Retry-After present)`.
    async fn buy_once(&self, instance: usize, voucher: i64, user: i64) -> (u16, String, bool) {
        let response = self
            .http
            .post(format!(
                "{}/api/vouchers/{voucher}/seckill",
                self.base(instance)
            ))
            .bearer_auth(
                self.tokens
                    .mint(Principal::User(user), Duration::from_secs(600)),
            )
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let retry_after = response.headers().contains_key("retry-after");
        let body: Value = response.json().await.unwrap();
        let code = body["code"].as_str().unwrap_or("accepted").to_owned();
        (status, code, retry_after)
    }

    /// Buys until the answer is not a 503 (at most 20 s); returns the final
    /// code and the 503 codes seen on the way.
    async fn buy(&self, instance: usize, voucher: i64, user: i64) -> (String, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut unavailable = Vec::new();
        loop {
            let (status, code, retry_after) = self.buy_once(instance, voucher, user).await;
            if status != 503 {
                return (code, unavailable);
            }
            assert!(retry_after, "a 503 without Retry-After");
            unavailable.push(code);
            assert!(
                Instant::now() < deadline,
                "still 503 after 20 s: {unavailable:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Users `users` buy at once, alternating instances; returns each
    /// user's final code, and every 503 code seen.
    async fn buy_all(
        &self,
        voucher: i64,
        users: std::ops::RangeInclusive<i64>,
    ) -> (Vec<(i64, String)>, Vec<String>) {
        let asks = users.map(|user| async move {
            let (code, unavailable) = self.buy(user as usize, voucher, user).await;
            ((user, code), unavailable)
        });
        let results = futures_util::future::join_all(asks).await;
        let mut unavailable = Vec::new();
        let mut codes = Vec::new();
        for (code, u) in results {
            codes.push(code);
            unavailable.extend(u);
        }
        (codes, unavailable)
    }

    async fn wait_stored(&self, voucher: i64, n: i64) {
        let stored = testkit::eventually(Duration::from_secs(20), || async {
            self.db.order_count(voucher).await.unwrap_or(0) >= n
        })
        .await;
        assert!(stored, "fewer than {n} orders stored");
    }

    /// `sale_repairs_total{kind}` summed over both instances.
    async fn repairs(&self, kind: &str) -> u64 {
        let mut total = 0;
        for i in 0..2 {
            let text = self
                .http
                .get(format!("{}/metrics", self.base(i)))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let prefix = format!("seckill_sale_repairs_total{{kind=\"{kind}\"}} ");
            total += text
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map_or(0, |n| n.trim().parse::<u64>().unwrap());
        }
        total
    }

    async fn stop(self) {
        let [a, b] = self.instances;
        a.stop().await.unwrap();
        b.stop().await.unwrap();
    }
}

fn count(codes: &[(i64, String)], code: &str) -> usize {
    codes.iter().filter(|(_, c)| c == code).count()
}

/// Stored orders: one per user, `expected` in all, database stock = stock −
/// orders.
async fn assert_sale(shop: &Shop, voucher: i64, stock: i64, expected: i64) {
    shop.wait_stored(voucher, expected).await;
    let orders = shop.db.voucher_orders(voucher).await.unwrap();
    let users: HashSet<i64> = orders.iter().map(|o| o.user_id).collect();
    let ids: HashSet<i64> = orders.iter().map(|o| o.order_id).collect();
    assert_eq!(orders.len() as i64, expected, "orders stored");
    assert_eq!(users.len(), orders.len(), "a user with two orders");
    assert_eq!(ids.len(), orders.len(), "an order id used twice");
    assert_eq!(
        shop.db.voucher_stock(voucher).await.unwrap(),
        Some(stock - expected)
    );
}

/// Redis restarted without its data: the first purchase finds Redis without
/// the purchase script, the sale is restored from the database by one
/// instance while purchases answer 503 `sale_repairing`, earlier buyers
/// stay buyers, the remaining stock sells exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_redis_lost_in_a_restart_is_restored_from_the_database_by_one_instance() {
    const STOCK: i64 = 50;
    let mut shop = shop("restart", RedisServer::start()).await;
    let voucher = shop.open_voucher(STOCK).await;
    let (codes, _) = shop.buy_all(voucher, 1..=20).await;
    assert_eq!(count(&codes, "accepted"), 20);
    shop.wait_stored(voucher, 20).await;

    shop.redis.restart(); // no persistence: every key is gone
    let (codes, unavailable) = shop.buy_all(voucher, 1..=120).await;
    // Earlier buyers hear already_bought, or sold_out once this instance
    // knows the sale sold out (then it does not ask Redis).
    assert!(
        codes[..20]
            .iter()
            .all(|(_, c)| c == "already_bought" || c == "sold_out"),
        "{codes:?}"
    );
    assert_eq!(count(&codes, "accepted") as i64, STOCK - 20, "{codes:?}");
    assert_eq!(
        count(&codes, "sold_out") + count(&codes, "already_bought"),
        120 - 30,
        "{codes:?}"
    );
    // Purchases that came before the repair was done waited for it (the
    // background check may have finished it before any purchase came).
    assert!(
        unavailable
            .iter()
            .all(|c| c == "sale_repairing" || c == "unavailable"),
        "{unavailable:?}"
    );
    assert_sale(&shop, voucher, STOCK, STOCK).await;
    assert_eq!(
        shop.repairs("restored").await,
        1,
        "restored once, by one instance"
    );
    shop.stop().await;
}

/// Redis came back with state older than the database's (an old snapshot,
/// a lagging replica): a buyer and units it had already sold are missing.
/// The restart is noticed, the buyer put back and the stock lowered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_state_rolled_back_in_a_restart_is_repaired_not_sold_again() {
    const STOCK: i64 = 20;
    let redis = RedisServer::start_with(ServerOptions::default().with_aof("always"));
    let mut shop = shop("rollback", redis).await;
    let voucher = shop.open_voucher(STOCK).await;
    let (codes, _) = shop.buy_all(voucher, 1..=10).await;
    assert_eq!(count(&codes, "accepted"), 10);
    shop.wait_stored(voucher, 10).await;

    // As an older snapshot would show it: user 3 not yet a buyer, 5 more
    // units in stock. Written before the restart (and kept by the AOF), so
    // that the server comes back with it whenever the service looks.
    let prefix = format!("seckill:{{v{voucher}}}");
    shop.redis.cli(&["SREM", &format!("{prefix}:buyers"), "3"]);
    shop.redis
        .cli(&["HSET", &format!("{prefix}:voucher"), "stock", "15"]);
    shop.redis.restart();

    let (code, unavailable) = shop.buy(0, voucher, 3).await;
    assert_eq!(code, "already_bought", "{unavailable:?}");
    // A purchase that came before the repair was done waited for it (the
    // check after the reconnect may have finished it before any came).
    assert!(
        unavailable
            .iter()
            .all(|c| c == "sale_repairing" || c == "unavailable"),
        "{unavailable:?}"
    );
    let (codes, _) = shop.buy_all(voucher, 11..=40).await;
    assert_eq!(count(&codes, "accepted"), 10, "{codes:?}");
    assert_sale(&shop, voucher, STOCK, STOCK).await;
    assert_eq!(shop.repairs("repaired").await, 1);
    shop.stop().await;
}

/// A sale whose Redis keys vanished without a restart (evicted, deleted by
/// hand) is restored on the next purchase of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_whose_keys_vanished_is_restored_on_the_next_purchase() {
    const STOCK: i64 = 5;
    let shop = shop("vanished", RedisServer::start()).await;
    let voucher = shop.open_voucher(STOCK).await;
    let (codes, _) = shop.buy_all(voucher, 1..=3).await;
    assert_eq!(count(&codes, "accepted"), 3);
    shop.wait_stored(voucher, 3).await;
    let prefix = format!("seckill:{{v{voucher}}}");
    shop.redis.cli(&[
        "DEL",
        &format!("{prefix}:voucher"),
        &format!("{prefix}:buyers"),
    ]);

    let (code, unavailable) = shop.buy(1, voucher, 2).await;
    assert_eq!(code, "already_bought");
    assert_eq!(unavailable, ["sale_repairing"]);
    let (codes, _) = shop.buy_all(voucher, 4..=10).await;
    assert_eq!(count(&codes, "accepted"), 2, "{codes:?}");
    assert_sale(&shop, voucher, STOCK, STOCK).await;
    // A voucher nobody created is still a plain 404.
    let (status, code, _) = shop.buy_once(0, voucher + 100, 1).await;
    assert_eq!((status, code.as_str()), (404, "unknown_voucher"));
    shop.stop().await;
}

/// `seckill reconcile --repair` restores a sale Redis lost (it
/// applied 0 repairs and exited 1 on every run), and exits 0 after. The
/// instances are stopped first: a running instance restores the sale by
/// itself (see the test above), and would race the command to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_repair_restores_a_sale_redis_lost() {
    let shop = shop("reconcile", RedisServer::start()).await;
    let voucher = shop.open_voucher(4).await;
    let (codes, _) = shop.buy_all(voucher, 1..=2).await;
    assert_eq!(count(&codes, "accepted"), 2);
    shop.wait_stored(voucher, 2).await;
    let Shop {
        redis,
        instances: [a, b],
        db_url: database,
        _dir,
        ..
    } = shop;
    a.stop().await.unwrap();
    b.stop().await.unwrap();
    redis.cli(&["FLUSHALL"]);
    let reconcile = |repair: bool| {
        let (redis, database) = (redis.url(), database.clone());
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_seckill"));
        command.args([
            "reconcile",
            "--redis-url",
            &redis,
            "--database-url",
            &database,
        ]);
        if repair {
            command.arg("--repair");
        }
        command.output().unwrap()
    };
    assert!(
        !reconcile(false).status.success(),
        "the loss goes unreported"
    );
    let repaired = reconcile(true);
    let text = String::from_utf8_lossy(&repaired.stdout);
    assert!(repaired.status.success(), "{text}");
    assert!(text.contains("1 restored"), "{text}");
    // Clean again: the stock, the buyers and the orders in Redis are the
    // database's.
    assert!(reconcile(false).status.success());
}

/// A service started on a deployment with no open sale arms its fast path:
/// a purchase of a voucher that does not exist is a 404 at once, not a 503
/// `sale_repairing` (Redis never failed), on either instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_started_with_no_open_sale_answers_an_unknown_voucher_with_404() {
    let shop = shop("no-open-sale", RedisServer::start()).await;
    for (i, voucher) in [(0, 9_999), (1, 9_998), (0, 9_997)] {
        let (status, code, _) = shop.buy_once(i, voucher, 1).await;
        assert_eq!(
            (status, code.as_str()),
            (404, "unknown_voucher"),
            "instance {i}"
        );
    }
}
