//! Payments a provider confirms by signed callback: the service against
//! `seckill-tools payments` (a real process on its own port), and against
//! callbacks written by hand for every case a provider can send.

use std::process::Stdio;
use std::time::{Duration, SystemTime};

use reqwest::StatusCode;
use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use seckill::payments::events::{self, SIGNATURE_HEADER};
use seckill::service::Service;
use seckill::settings::{PaymentSettings, Settings};
use seckill::testing as support;
use secrecy::SecretString;
use serde_json::{json, Value};
use testkit::RedisServer;
use tokio::io::{AsyncBufReadExt, BufReader};

const SECRET: &str = "payments-test-token-secret";
const API_KEY: &str = "sk_test_payments";
const WEBHOOK_SECRET: &str = "whsec_payments_test";

/// The provider simulator as a child process (killed when dropped), and
/// its base URL.
struct Provider {
    child: tokio::process::Child,
    base: String,
}

impl Provider {
    async fn start(switches: &[&str]) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckill-tools"))
            .args([
                "payments",
                "--api-key",
                API_KEY,
                "--webhook-secret",
                WEBHOOK_SECRET,
            ])
            .args(switches)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the simulator starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the simulator prints its address")
            .unwrap()
            .unwrap();
        let base = line
            .strip_prefix("payments: listening on ")
            .expect("its address line")
            .to_owned();
        Self { child, base }
    }

    async fn call_back(&self, service: &str) {
        let r = reqwest::Client::new()
            .put(format!("{}/v1/callbacks", self.base))
            .json(&json!([service]))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    async fn ledger(&self) -> Value {
        reqwest::get(format!("{}/v1/ledger", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A service paying through `provider`, on a private Redis and a fresh
/// SQLite file; its base URL and database.
async fn service(what: &str, provider: &Provider) -> (RedisServer, Service, String, Database) {
    let dir = std::env::temp_dir().join(format!("seckill-payments-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    service_on(&format!("sqlite://{}/shop.db", dir.display()), provider).await
}

/// As [`service`], on the database at `database`.
async fn service_on(
    database: &str,
    provider: &Provider,
) -> (RedisServer, Service, String, Database) {
    let redis = RedisServer::start();
    let service = Service::start(Settings {
        payments: PaymentSettings::Provider {
            url: provider.base.clone(),
            api_key: SecretString::from(API_KEY),
            webhook_secret: SecretString::from(WEBHOOK_SECRET),
            tolerance: events::DEFAULT_TOLERANCE,
        },
        ..support::settings(redis.url(), database, SECRET)
    })
    .await
    .unwrap();
    let base = format!("http://{}", service.addr());
    provider.call_back(&base).await;
    let db = Database::connect(database).await.unwrap();
    (redis, service, base, db)
}

struct Shop {
    http: reqwest::Client,
    base: String,
    tokens: Tokens,
}

impl Shop {
    fn new(base: &str) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
            tokens: Tokens::new(SECRET.as_bytes()).unwrap(),
        }
    }

    async fn voucher(&self, pay_within_ms: u64) -> i64 {
        let now = support::now_ms();
        let body = json!({"title": "Hotpot for two", "stock": 10, "begin_ms": now - 1000,
            "end_ms": now + 3_600_000, "pay_within_ms": pay_within_ms,
            "price_minor": 1990, "face_value_minor": 5000, "currency": "CNY"});
        support::create_voucher_from(&self.http, &self.base, &self.tokens, body).await
    }

    /// `user` buys `voucher`; the order once stored.
    async fn bought(&self, voucher: i64, user: i64) -> Value {
        let r = support::purchase(&self.http, &self.base, &self.tokens, voucher, user).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            self.becomes(voucher, user, "reserved").await,
            "the order is stored"
        );
        self.order(voucher, user).await
    }

    async fn order(&self, voucher: i64, user: i64) -> Value {
        self.http
            .get(format!("{}/api/vouchers/{voucher}/order", self.base))
            .bearer_auth(
                self.tokens
                    .mint(Principal::User(user), Duration::from_secs(600)),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn act(&self, user: i64, order: &Value, what: &str, key: &str) -> (StatusCode, Value) {
        let id = order["order_id"].as_str().unwrap();
        let r = self
            .http
            .post(format!("{}/api/orders/{id}/{what}", self.base))
            .bearer_auth(
                self.tokens
                    .mint(Principal::User(user), Duration::from_secs(600)),
            )
            .header("Idempotency-Key", key)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    /// Whether `user`'s order of `voucher` reads `state` within a bound a
    /// slow machine keeps.
    async fn becomes(&self, voucher: i64, user: i64, state: &str) -> bool {
        testkit::eventually(Duration::from_secs(30), || async {
            self.order(voucher, user).await["state"] == state
        })
        .await
    }

    /// Sends `event` signed with `secret` as of `at`.
    async fn callback(&self, event: &Value, secret: &str, at: SystemTime) -> (StatusCode, Value) {
        let body = serde_json::to_vec(event).unwrap();
        let r = self
            .http
            .post(format!("{}/api/payments/events", self.base))
            .header(SIGNATURE_HEADER, events::sign(secret.as_bytes(), at, &body))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }
}

/// Shop 7, 9: through a provider that confirms late, twice, out of order
/// and alongside forged copies, a payment is pending (202) until its
/// callback pays the order, a refund is refunding until its callback
/// refunds it, every forged copy is refused, every event applied once, and
/// the provider keeps what the paid orders cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_and_refunds_follow_a_provider_that_repeats_reorders_and_is_forged() {
    let provider = Provider::start(&[
        "--delay-ms",
        "100",
        "--reorder-ms",
        "200",
        "--duplicate",
        "1",
        "--forge",
        "1",
    ])
    .await;
    let (_redis, service, base, db) = service("repeats", &provider).await;
    let shop = Shop::new(&base);
    let voucher = shop.voucher(600_000).await;
    const BUYERS: i64 = 6;
    let mut orders = Vec::new();
    for user in 1..=BUYERS {
        orders.push(shop.bought(voucher, user).await);
    }
    for (user, order) in (1..).zip(&orders) {
        let (status, pending) = shop.act(user, order, "pay", &format!("pay-{user}")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
        assert_eq!(
            (&pending["state"], &pending["payment"]),
            (&json!("reserved"), &json!("pending"))
        );
        // Another key while it is under way is refused; the same is not.
        let (status, e) = shop.act(user, order, "pay", "another-key").await;
        assert_eq!(
            (status, &e["code"]),
            (StatusCode::CONFLICT, &json!("payment_under_way"))
        );
        let (status, _) = shop.act(user, order, "pay", &format!("pay-{user}")).await;
        assert_eq!(status, StatusCode::ACCEPTED);
    }
    for user in 1..=BUYERS {
        assert!(
            shop.becomes(voucher, user, "paid").await,
            "user {user}'s order is paid by its callback"
        );
    }
    // Half are refunded, by callback too; their units come back on sale.
    for (user, order) in (1..=BUYERS / 2).zip(&orders) {
        let (status, refunding) = shop
            .act(user, order, "refund", &format!("refund-{user}"))
            .await;
        assert_eq!(
            (status, &refunding["state"]),
            (StatusCode::ACCEPTED, &json!("refunding")),
            "{refunding}"
        );
    }
    for user in 1..=BUYERS / 2 {
        assert!(
            shop.becomes(voucher, user, "refunded").await,
            "user {user}'s refund"
        );
    }
    assert_eq!(
        db.voucher_stock(voucher).await.unwrap(),
        Some(10 - BUYERS + BUYERS / 2)
    );
    // Every callback delivered, the forged copies refused.
    let settled = testkit::eventually(Duration::from_secs(30), || async {
        let ledger = provider.ledger().await;
        ledger["callbacks"]["acknowledged"].as_u64() >= Some(2 * (BUYERS + BUYERS / 2) as u64)
    })
    .await;
    let ledger = provider.ledger().await;
    assert!(settled, "{ledger}");
    assert_eq!(ledger["callbacks"]["forged_taken"], Value::Null, "{ledger}");
    assert!(ledger["callbacks"]["forged_refused"].as_u64() >= Some((BUYERS + BUYERS / 2) as u64));
    let states = db.order_states(voucher).await.unwrap();
    assert_eq!(
        (states.paid, states.refunded),
        (BUYERS - BUYERS / 2, BUYERS / 2)
    );
    // The money: kept = what the paid orders cost.
    let revenue = db.revenue(voucher).await.unwrap();
    let cny = revenue.keys().next().copied().expect("revenue in CNY");
    let kept = ledger["totals"]["CNY"]["charged_minor"].as_i64().unwrap()
        - ledger["totals"]["CNY"]["voided_minor"].as_i64().unwrap()
        - ledger["totals"]["CNY"]["refunded_minor"].as_i64().unwrap();
    assert_eq!(revenue[&cny], kept);
    assert_eq!(kept, (BUYERS - BUYERS / 2) * 1990);
    service.stop().await.unwrap();
}

/// Shop 8, 9: callbacks written by hand, one per case: a forged one, a
/// stale one and one without a signature are 401s and change nothing; a
/// charge for another amount is refused and recorded; an event sent again
/// is applied once; a refund's callback before the refund is a 409 (the
/// provider sends it again); a charge confirmed after its order expired is
/// voided; and a provider that never calls back leaves the order to expire
/// and its charge voided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_callback_case_has_its_outcome() {
    every_callback_case_on(None).await;
}

/// The same on PostgreSQL and MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_callback_case_has_its_outcome_on_postgres_and_mariadb() {
    let pg = testkit::PostgresServer::start();
    every_callback_case_on(Some(&pg.url())).await;
    let maria = testkit::MariaDbServer::start();
    every_callback_case_on(Some(&maria.url())).await;
}

async fn every_callback_case_on(database: Option<&str>) {
    // This provider takes charges and loses every callback: the test sends
    // its own.
    let provider = Provider::start(&["--lose", "1", "--delay-ms", "50"]).await;
    let (_redis, service, base, db) = match database {
        Some(url) => service_on(url, &provider).await,
        None => service("cases", &provider).await,
    };
    let shop = Shop::new(&base);
    let voucher = shop.voucher(600_000).await;
    let order = shop.bought(voucher, 1).await;
    let (status, pending) = shop.act(1, &order, "pay", "pay-1").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    let id: i64 = order["order_id"].as_str().unwrap().parse().unwrap();
    let reference = db
        .order(id)
        .await
        .unwrap()
        .unwrap()
        .pay_reference
        .expect("the charge asked for");
    let event_of = |id: &str, kind: &str, reference: &str, amount: i64| {
        json!({"id": id, "type": kind, "reference": reference, "order_id": order["order_id"],
               "amount_minor": amount, "currency": "CNY"})
    };
    let event = |id: &str, kind: &str, amount: i64| event_of(id, kind, &reference, amount);
    let now = SystemTime::now();
    // Forged, stale, unsigned: refused, nothing changes.
    let paid = event("evt_a", "charge.succeeded", 1990);
    let (status, _) = shop.callback(&paid, "not the secret", now).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = shop
        .callback(&paid, WEBHOOK_SECRET, now - Duration::from_secs(301))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let unsigned = shop
        .http
        .post(format!("{base}/api/payments/events"))
        .json(&paid)
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
    // The right signature behind 4,000 wrong ones: refused unread (each
    // would have cost an HMAC over the body), and the order stays unpaid.
    let body = serde_json::to_vec(&paid).unwrap();
    let signed = events::sign(WEBHOOK_SECRET.as_bytes(), now, &body);
    let (t, v1) = signed.split_once(",v1=").unwrap();
    let stuffed = format!(
        "{t}{},v1={v1}",
        format!(",v1={}", "00".repeat(32)).repeat(4_000)
    );
    let stuffed = shop
        .http
        .post(format!("{base}/api/payments/events"))
        .header(SIGNATURE_HEADER, stuffed)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(stuffed.status(), StatusCode::UNAUTHORIZED);
    let answer: Value = stuffed.json().await.unwrap();
    assert!(
        answer["message"]
            .as_str()
            .unwrap_or_default()
            .contains("too many signatures"),
        "{answer}"
    );
    assert_eq!(shop.order(voucher, 1).await["state"], "reserved");
    // A charge of another amount: refused, recorded (and voided); the
    // order stays unpaid.
    let other = event_of("evt_b", "charge.succeeded", "ch_other", 1);
    let (status, answer) = shop.callback(&other, WEBHOOK_SECRET, now).await;
    assert_eq!(
        (status, &answer["outcome"]),
        (StatusCode::OK, &json!("amount_mismatch"))
    );
    assert_eq!(shop.order(voucher, 1).await["state"], "reserved");
    // A refund's callback before the payment's: not applied yet.
    let (status, e) = shop
        .callback(
            &event("evt_c", "refund.succeeded", 1990),
            WEBHOOK_SECRET,
            now,
        )
        .await;
    assert_eq!(
        (status, &e["code"]),
        (StatusCode::CONFLICT, &json!("event_too_early")),
        "{e}"
    );
    // The payment's: paid, once.
    let (status, answer) = shop.callback(&paid, WEBHOOK_SECRET, now).await;
    assert_eq!(
        (status, &answer["outcome"]),
        (StatusCode::OK, &json!("paid"))
    );
    let (status, answer) = shop.callback(&paid, WEBHOOK_SECRET, now).await;
    assert_eq!(
        (status, &answer["outcome"]),
        (StatusCode::OK, &json!("duplicate"))
    );
    assert_eq!(shop.order(voucher, 1).await["state"], "paid");
    assert_eq!(
        db.event_outcome("evt_a").await.unwrap().as_deref(),
        Some("paid")
    );
    assert_eq!(
        db.event_outcome("evt_b").await.unwrap().as_deref(),
        Some("amount_mismatch")
    );
    assert_eq!(
        db.event_outcome("evt_c").await.unwrap(),
        None,
        "sent again later"
    );

    // A provider that never calls back: the order expires, the charge is
    // voided; the callback that comes after all voids it again.
    let late = shop.voucher(3_000).await;
    let order = shop.bought(late, 2).await;
    let (status, _) = shop.act(2, &order, "pay", "pay-2").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(
        shop.becomes(late, 2, "expired").await,
        "the order expires unpaid"
    );
    let id: i64 = order["order_id"].as_str().unwrap().parse().unwrap();
    let reference = db.order(id).await.unwrap().unwrap().pay_reference.unwrap();
    let voided = testkit::eventually(Duration::from_secs(30), || async {
        provider.ledger().await["totals"]["CNY"]["voids"].as_u64() >= Some(1)
    })
    .await;
    assert!(voided, "the expired order's charge is voided");
    let after = json!({"id": "evt_d", "type": "charge.succeeded", "reference": reference,
        "order_id": order["order_id"], "amount_minor": 1990, "currency": "CNY"});
    let (status, answer) = shop
        .callback(&after, WEBHOOK_SECRET, SystemTime::now())
        .await;
    assert_eq!(
        (status, &answer["outcome"]),
        (StatusCode::OK, &json!("voided"))
    );
    assert_eq!(shop.order(late, 2).await["state"], "expired");
    // The provider kept only the paid order's price.
    let ledger = provider.ledger().await;
    let totals = &ledger["totals"]["CNY"];
    let kept = totals["charged_minor"].as_i64().unwrap()
        - totals["voided_minor"].as_i64().unwrap()
        - totals["refunded_minor"].as_i64().unwrap();
    assert_eq!(kept, 1990, "{ledger}");
    service.stop().await.unwrap();
}
