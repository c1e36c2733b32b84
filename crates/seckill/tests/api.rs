//! The HTTP API over real HTTP: the shipped `Service` (its HTTP server
//! with the connection limits, the order pipeline's worker, self-repair),
//! started with test settings on a real redis-server and SQLite file (or
//! PostgreSQL, MariaDB).

use seckill::testing as support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use seckill::http::Limit;
use seckill::service::Service;
use seckill::settings::Settings;
use seckill::store::{FastPath, OrderIdGenerator};
use serde_json::{json, Value};
use testkit::RedisServer;

const SECRET: &str = "test-secret-0123456789";

struct TestApp {
    base: String,
    /// The service's database and Redis, seen from beside it.
    db: Database,
    fast: Arc<FastPath>,
    http: reqwest::Client,
    tokens: Tokens,
    redis: RedisServer,
    _service: Service,
    _dir: std::path::PathBuf,
}

impl TestApp {
    fn token(&self, who: Principal) -> String {
        self.tokens.mint(who, Duration::from_secs(3600))
    }

    async fn create_voucher(&self, body: Value) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}/api/vouchers", self.base))
            .bearer_auth(self.token(Principal::Admin))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    /// `POST /api/vouchers` with `body` sent as it is (JSON no serializer
    /// would write), as the admin.
    async fn create_voucher_raw(&self, body: String) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}/api/vouchers", self.base))
            .bearer_auth(self.token(Principal::Admin))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn buy(&self, voucher: i64, user: i64) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}/api/vouchers/{voucher}/seckill", self.base))
            .bearer_auth(self.token(Principal::User(user)))
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    /// `GET path` (a path without parameters), unauthenticated.
    async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    /// Whether `user`'s order of `voucher` reads `reserved` (stored) within a bound a
    /// slow machine keeps (the service's pipeline worker stores it).
    async fn order_stored(&self, voucher: i64, user: i64) -> bool {
        testkit::eventually(Duration::from_secs(30), || async {
            let r = self
                .http
                .get(format!("{}/api/vouchers/{voucher}/order", self.base))
                .bearer_auth(self.token(Principal::User(user)))
                .send()
                .await
                .unwrap();
            r.json::<Value>().await.unwrap_or(Value::Null)["state"] == "reserved"
        })
        .await
    }

    /// `POST /api/orders/{order}/{action}` as `user`, with an
    /// `Idempotency-Key` when given.
    async fn order_action(
        &self,
        user: i64,
        order: &str,
        action: &str,
        key: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .post(format!("{}/api/orders/{order}/{action}", self.base))
            .bearer_auth(self.token(Principal::User(user)));
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        let r = req.send().await.unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    /// `user`'s latest order of `voucher` as the API shows it.
    async fn order_of(&self, voucher: i64, user: i64) -> Value {
        self.http
            .get(format!("{}/api/vouchers/{voucher}/order", self.base))
            .bearer_auth(self.token(Principal::User(user)))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or(Value::Null)
    }

    /// Whether `user`'s latest order of `voucher` reads `state` within a
    /// bound a slow machine keeps.
    async fn order_becomes(&self, voucher: i64, user: i64, state: &str) -> bool {
        testkit::eventually(Duration::from_secs(30), || async {
            self.order_of(voucher, user).await["state"] == state
        })
        .await
    }

    /// The voucher as read after everything done before this call: a read
    /// may answer from figures up to a second old (`as_of_ms` says when
    /// they were read), so this asks again until they are from after the
    /// call.
    async fn show(&self, voucher: i64) -> (StatusCode, Value) {
        let since = now_ms();
        loop {
            let (status, view) = self.show_once(voucher).await;
            if status != StatusCode::OK || view["as_of_ms"].as_u64().is_some_and(|t| t >= since) {
                return (status, view);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn show_once(&self, voucher: i64) -> (StatusCode, Value) {
        let r = self
            .http
            .get(format!("{}/api/vouchers/{voucher}", self.base))
            .send()
            .await
            .unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }
}

async fn spawn_app() -> TestApp {
    spawn_app_with(None, None).await
}

/// An app whose users may buy `user_limit` and whose client addresses may
/// call `ip_limit` (`None`: unlimited).
async fn spawn_app_with(user_limit: Option<Limit>, ip_limit: Option<Limit>) -> TestApp {
    spawn_app_on(None, user_limit, ip_limit).await
}

/// The shipped service on `database_url`, or on a fresh SQLite file.
async fn spawn_app_on(
    database_url: Option<String>,
    user_limit: Option<Limit>,
    ip_limit: Option<Limit>,
) -> TestApp {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "seckill-api-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let url = database_url.unwrap_or_else(|| format!("sqlite://{}/api.db", dir.display()));
    let redis = RedisServer::start();
    let service = Service::start(Settings {
        user_limit,
        ip_limit,
        ..support::settings(redis.url(), url.clone(), SECRET)
    })
    .await
    .unwrap();
    let db = Database::connect(&url).await.unwrap();
    let conn = seckill::store::connect(&redis.url()).await.unwrap();
    let fast = Arc::new(FastPath::new(
        seckill::store::Redis::new(conn.clone(), "seckill"),
        OrderIdGenerator::new(seckill::store::Redis::new(conn, "seckill"), 100).unwrap(),
    ));
    TestApp {
        base: format!("http://{}", service.addr()),
        db,
        fast,
        http: reqwest::Client::new(),
        tokens: Tokens::new(SECRET.as_bytes()).unwrap(),
        redis,
        _service: service,
        _dir: dir,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn open_voucher(stock: i64) -> Value {
    json!({ "title": "Hotpot for two", "stock": stock, "begin_ms": now_ms() - 1000, "end_ms": now_ms() + 3_600_000 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voucher_is_created_shown_and_bought_once_per_user() {
    let app = spawn_app().await;
    let (status, v) = app.create_voucher(open_voucher(2)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["id"].as_i64().unwrap();
    assert_eq!(app.show(id).await.1["stock_left"], 2);

    let (status, order) = app.buy(id, 7).await;
    assert_eq!(status, StatusCode::OK, "{order}");
    assert_eq!(order["state"], "pending");
    assert!(order["order_id"].as_str().unwrap().parse::<i64>().unwrap() > 0);
    let (status, again) = app.buy(id, 7).await;
    assert_eq!(
        (status, again["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_bought"))
    );
    assert_eq!(app.buy(id, 8).await.0, StatusCode::OK);
    let (status, sold) = app.buy(id, 9).await;
    assert_eq!(
        (status, sold["code"].as_str()),
        (StatusCode::CONFLICT, Some("sold_out"))
    );
    assert_eq!(app.show(id).await.1["stock_left"], 0);
    let (status, unknown) = app.buy(id + 100, 9).await;
    assert_eq!(
        (status, unknown["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_voucher"))
    );
    assert_eq!(app.show(id + 100).await.0, StatusCode::NOT_FOUND);
}

/// Service 17: a voucher read reflects every purchase committed
/// a second or more before it was answered (and never one not yet made),
/// and says as of when; reads share the instance's live figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voucher_reads_are_at_most_a_second_stale_and_say_as_of_when() {
    let app = Arc::new(spawn_app().await);
    let (_, v) = app.create_voucher(open_voucher(40)).await;
    let id = v["id"].as_i64().unwrap();
    let buying = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = {
        let (app, buying) = (app.clone(), buying.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut reads = Vec::new();
            while buying.load(std::sync::atomic::Ordering::Acquire)
                || started.elapsed() < Duration::from_millis(1_500)
            {
                let sent = now_ms();
                let (status, view) = app.show_once(id).await;
                assert_eq!(status, StatusCode::OK, "{view}");
                let as_of = view["as_of_ms"].as_u64().expect("as_of_ms");
                let left = view["stock_left"].as_i64().unwrap();
                reads.push((sent, now_ms(), as_of, left));
            }
            reads
        })
    };
    let mut purchases = Vec::new(); // (sent, answered)
    for user in 1..=30 {
        let sent = now_ms();
        assert_eq!(app.buy(id, user).await.0, StatusCode::OK);
        purchases.push((sent, now_ms()));
    }
    buying.store(false, std::sync::atomic::Ordering::Release);
    let reads = reader.await.unwrap();
    let mut shared = 0;
    for &(sent, received, as_of, left) in &reads {
        assert!(
            as_of + 1_000 >= sent,
            "read sent at {sent} answered as of {as_of}"
        );
        let committed = purchases.iter().filter(|&&(_, done)| done <= as_of).count() as i64;
        let begun = purchases
            .iter()
            .filter(|&&(start, _)| start <= received)
            .count() as i64;
        assert!(
            left <= 40 - committed,
            "as of {as_of}: {left} left, {committed} bought before"
        );
        assert!(
            left >= 40 - begun,
            "{left} left with only {begun} purchases begun"
        );
        shared += usize::from(as_of < sent);
    }
    assert!(
        shared > 0,
        "no read of {} answered from the shared figures",
        reads.len()
    );
}

#[tokio::test]
async fn tokens_are_required_and_roles_are_enforced() {
    let app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(5)).await;
    let id = v["id"].as_i64().unwrap();
    let url = format!("{}/api/vouchers/{id}/seckill", app.base);
    let none = app.http.post(&url).send().await.unwrap();
    assert_eq!(none.status(), StatusCode::UNAUTHORIZED);
    let body: Value = none.json().await.unwrap();
    assert_eq!(body["code"], "unauthorized");
    let forged = Tokens::new(b"some-other-secret-987654")
        .unwrap()
        .mint(Principal::User(1), Duration::from_secs(60));
    assert_eq!(
        app.http
            .post(&url)
            .bearer_auth(forged)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let admin = app.token(Principal::Admin);
    assert_eq!(
        app.http
            .post(&url)
            .bearer_auth(admin)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    let user = app.token(Principal::User(3));
    let create = app
        .http
        .post(format!("{}/api/vouchers", app.base))
        .bearer_auth(user)
        .json(&open_voucher(1))
        .send()
        .await
        .unwrap();
    assert_eq!(create.status(), StatusCode::FORBIDDEN);
    // Nothing was bought or created by the refused calls.
    assert_eq!(app.show(id).await.1["stock_left"], 5);
    assert_eq!(app.show(id + 1).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn malformed_voucher_requests_are_400s_naming_the_field_and_write_nothing() {
    let app = spawn_app().await;
    let now = now_ms();
    let cases = [
        (
            json!({ "title": "x", "stock": "ten", "begin_ms": now, "end_ms": now + 1 }),
            "stock",
        ),
        (
            json!({ "title": "x", "stock": 0, "begin_ms": now, "end_ms": now + 1 }),
            "stock",
        ),
        (
            json!({ "title": "x", "stock": -3, "begin_ms": now, "end_ms": now + 1 }),
            "stock",
        ),
        (
            json!({ "title": "x", "stock": 1_000_000_000_000i64, "begin_ms": now, "end_ms": now + 1 }),
            "stock",
        ),
        (
            json!({ "title": "x", "stock": 1, "begin_ms": now, "end_ms": now - 1 }),
            "end_ms",
        ),
        (
            json!({ "title": "x", "stock": 1, "begin_ms": 1u64 << 63, "end_ms": now }),
            "begin_ms",
        ),
        (
            json!({ "title": "x", "stock": 1, "begin_ms": -5, "end_ms": now }),
            "begin_ms",
        ),
        (
            json!({ "title": "   ", "stock": 1, "begin_ms": now, "end_ms": now + 1 }),
            "title",
        ),
        (
            json!({ "stock": 1, "begin_ms": now, "end_ms": now + 1 }),
            "title",
        ),
        (
            json!({ "title": "x", "stock": 1, "begin_ms": now, "end_ms": now + 1, "colour": "red" }),
            "colour",
        ),
    ];
    for (body, field) in cases {
        let (status, err) = app.create_voucher(body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {err}");
        assert_eq!(err["field"], field, "{body} -> {err}");
        assert_eq!(err["code"], "invalid_request");
    }
    let raw = app
        .http
        .post(format!("{}/api/vouchers", app.base))
        .bearer_auth(app.token(Principal::Admin))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    let huge = app
        .http
        .post(format!("{}/api/vouchers", app.base))
        .bearer_auth(app.token(Principal::Admin))
        .header("content-type", "application/json")
        .body(format!("{{\"title\": \"{}\"}}", "x".repeat(64 * 1024)))
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // No partial write: the first valid voucher gets the first id.
    let (status, v) = app.create_voucher(open_voucher(1)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(v["id"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_http_purchases_never_oversell() {
    let app = Arc::new(spawn_app().await);
    let (_, v) = app.create_voucher(open_voucher(300)).await;
    let id = v["id"].as_i64().unwrap();
    // 2,000 users, each asking once, all at once: more buyers than stock.
    let calls: Vec<_> = (1..=2_000)
        .map(|user| {
            let app = app.clone();
            tokio::spawn(async move { app.buy(id, user).await.0 })
        })
        .collect();
    let mut ok = 0;
    for c in calls {
        match c.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::CONFLICT => {}
            other => panic!("{other}"),
        }
    }
    assert_eq!(
        ok, 300,
        "no oversell, and no undersell while buyers remained"
    );
    assert_eq!(app.show(id).await.1["stock_left"], 0);
}

#[tokio::test]
async fn readiness_reports_each_dependency() {
    let mut app = spawn_app().await;
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(
        ready.json::<Value>().await.unwrap(),
        json!({"redis": "ok", "database": "ok"})
    );
    app.redis.kill();
    let down = app.get("/readyz").await;
    assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(down.json::<Value>().await.unwrap()["redis"], "unreachable");
    // Liveness does not depend on Redis.
    let alive = app.get("/healthz").await;
    assert_eq!(alive.status(), StatusCode::OK);
}

#[tokio::test]
async fn users_and_ips_over_their_rate_get_429s() {
    let per_user = Limit::per_second(1); // burst 2
    let app = spawn_app_with(per_user, None).await;
    let (_, v) = app.create_voucher(open_voucher(100)).await;
    let id = v["id"].as_i64().unwrap();
    let statuses: Vec<StatusCode> = {
        let mut s = Vec::new();
        for _ in 0..3 {
            s.push(app.buy(id, 5).await.0);
        }
        s
    };
    assert_eq!(statuses[0], StatusCode::OK);
    assert_eq!(
        statuses[1],
        StatusCode::CONFLICT,
        "within the burst: an ordinary refusal"
    );
    let (status, body) = app.buy(id, 5).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited"))
    );
    // Another user is not affected.
    assert_eq!(app.buy(id, 6).await.0, StatusCode::OK);

    let per_ip = Limit::per_second(2); // burst 4
    let app = spawn_app_with(None, per_ip).await;
    let mut limited = 0;
    for _ in 0..10 {
        if app.show(1).await.0 == StatusCode::TOO_MANY_REQUESTS {
            limited += 1;
        }
    }
    assert!(limited >= 5, "only {limited} of 10 rapid requests limited");
    // Health checks are never limited.
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), StatusCode::OK);
}

#[tokio::test]
async fn users_see_their_own_orders_pending_then_created_or_failed() {
    use seckill::pipeline::{OrderPipeline, PipelineSettings};
    let app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(5)).await;
    let id = v["id"].as_i64().unwrap();
    let get = |path: String, user: i64| {
        let req = app
            .http
            .get(format!("{}{path}", app.base))
            .bearer_auth(app.token(Principal::User(user)));
        async move {
            let r = req.send().await.unwrap();
            (r.status(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (_, bought) = app.buy(id, 1).await;
    let (status, order) = get(format!("/api/vouchers/{id}/order"), 1).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(order["order_id"], bought["order_id"]);
    // Pending until the service's pipeline worker has stored it.
    assert!(
        matches!(order["state"].as_str(), Some("pending" | "reserved")),
        "{order}"
    );
    // Nobody else sees it, and a user with no order gets a 404.
    assert_eq!(
        get(format!("/api/vouchers/{id}/order"), 2).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(get("/api/orders".into(), 1).await.1, json!([]));

    assert!(app.order_stored(id, 1).await, "the worker stores the order");
    let (_, list) = get("/api/orders".into(), 1).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["order_id"], bought["order_id"]);
    assert!(get("/api/orders".into(), 2)
        .await
        .1
        .as_array()
        .unwrap()
        .is_empty());

    // An order the pipeline gave up on reads as failed; here a buyer from
    // before the order-of and failed hashes (found by the stream scan).
    let pipeline = OrderPipeline::new(
        app.fast.redis().clone(),
        app.db.clone(),
        PipelineSettings::new("test"),
    )
    .unwrap();
    let mut c = app.fast.redis().connection().clone();
    let _: i64 = redis::cmd("SADD")
        .arg(format!("seckill:{{v{id}}}:buyers"))
        .arg(3)
        .query_async(&mut c)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(pipeline.dead_letter_stream())
        .arg("*")
        .arg("stream")
        .arg(format!("seckill:{{v{id}}}:orders"))
        .arg("order")
        .arg(4_294_967_297i64)
        .arg("user")
        .arg(3)
        .arg("voucher")
        .arg(id)
        .arg("reason")
        .arg("test")
        .query_async(&mut c)
        .await
        .unwrap();
    let (_, failed) = get(format!("/api/vouchers/{id}/order"), 3).await;
    assert_eq!(
        (failed["state"].as_str(), failed["order_id"].as_str()),
        (Some("failed"), Some("4294967297"))
    );
    let (status, _) = app
        .http
        .get(format!("{}/api/orders", app.base))
        .send()
        .await
        .map(|r| (r.status(), ()))
        .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_outcome() {
    let app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(1)).await;
    let id = v["id"].as_i64().unwrap();
    assert_eq!(app.buy(id, 1).await.0, StatusCode::OK);
    assert_eq!(app.buy(id, 2).await.0, StatusCode::CONFLICT);
    let text = app.get("/metrics").await.text().await.unwrap();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.starts_with(needle))
            .map(str::to_owned)
    };
    assert_eq!(
        line("seckill_http_requests_total{outcome=\"ok\",route=\"/api/vouchers/{id}/seckill\"}")
            .as_deref(),
        Some("seckill_http_requests_total{outcome=\"ok\",route=\"/api/vouchers/{id}/seckill\"} 1"),
        "{text}"
    );
    assert!(
        line("seckill_http_requests_total{outcome=\"409\",route=\"/api/vouchers/{id}/seckill\"} 1")
            .is_some(),
        "{text}"
    );
    assert!(
        text.contains("seckill_http_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(text.contains("seckill_pipeline_lag_orders"), "{text}");
}

#[tokio::test]
async fn every_operation_in_the_openapi_document_is_served() {
    let app = spawn_app().await;
    let r = app.get("/openapi.json").await;
    assert_eq!(r.status(), StatusCode::OK);
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.0.3");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 9);
    for (path, operations) in paths {
        for (method, op) in operations.as_object().unwrap() {
            let url = format!(
                "{}{}",
                app.base,
                path.replace("{id}", "1").replace("{file}", "seckill.js")
            );
            let secured = op.get("security").is_some();
            let token = if path == "/api/vouchers" || path == "/api/admin/live" {
                Principal::Admin
            } else {
                Principal::User(1)
            };
            let mut req = app
                .http
                .request(method.to_uppercase().parse().unwrap(), &url);
            if secured {
                req = req.bearer_auth(app.token(token));
            }
            if method == "post" && path == "/api/vouchers" {
                req = req.json(&open_voucher(1));
            }
            let res = req.send().await.unwrap();
            let status = res.status();
            let streams = res
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
            // An event stream lasts as long as the service: its head is the answer.
            let body = if streams {
                String::new()
            } else {
                res.text().await.unwrap()
            };
            // The router's own 404/405 have no JSON body; the API's do.
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            if status == StatusCode::NOT_FOUND {
                let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                assert!(v.get("code").is_some(), "{method} {path} is not routed");
            }
            let documented = op["responses"].as_object().unwrap();
            assert!(
                documented.contains_key(status.as_str()),
                "{method} {path}: undocumented {status}"
            );
        }
    }
}

/// Every route and refusal, with the service's worker moving orders to
/// `reserved` and its sweep expiring them.
async fn route_tour(app: &TestApp, backend: seckill::db::Backend) {
    assert_eq!(
        app.db.backend(),
        backend,
        "the tour runs on the wrong database"
    );
    let hour = 3_600_000;
    let (status, v) = app.create_voucher(open_voucher(2)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["id"].as_i64().unwrap();
    // One title rule on every backend (PostgreSQL cannot store
    // U+0000; nobody does now), and a title is stored as sent; a title
    // that would show other than it reads is refused.
    for bad in [
        "nul\u{0}inside",
        " padded ",
        "teapot\u{202E}gpj.exe",
        "isolate\u{2067}d",
    ] {
        let (status, e) = app
            .create_voucher(
                json!({"title": bad, "stock": 1, "begin_ms": now_ms(), "end_ms": now_ms() + hour}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {e}");
        assert_eq!(e["field"], "title", "{e}");
    }
    let (status, v) = app
        .create_voucher(json!({"title": "火锅 Hotpot 🍲", "stock": 1, "begin_ms": now_ms(), "end_ms": now_ms() + hour}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["title"], "火锅 Hotpot 🍲");
    let (_, later) = app
        .create_voucher(json!({"title": "Later", "stock": 1, "begin_ms": now_ms() + hour, "end_ms": now_ms() + 2 * hour}))
        .await;
    let (_, over) = app
        .create_voucher(json!({"title": "Over", "stock": 1, "begin_ms": now_ms() - 2 * hour, "end_ms": now_ms() - hour}))
        .await;
    let (status, err) = app
        .create_voucher(json!({"title": "x", "stock": 0, "begin_ms": 1, "end_ms": 2}))
        .await;
    assert_eq!(
        (status, err["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("stock"))
    );

    let list: Value = app.get("/api/vouchers").await.json().await.unwrap();
    assert_eq!(list.as_array().unwrap().len(), 4);
    assert_eq!(app.show(id).await.1["stock_left"], 2);
    assert_eq!(app.buy(id, 1).await.0, StatusCode::OK);
    assert_eq!(app.buy(id, 1).await.1["code"], "already_bought");
    assert_eq!(app.buy(id, 2).await.0, StatusCode::OK);
    assert_eq!(app.buy(id, 3).await.1["code"], "sold_out");
    assert_eq!(
        app.buy(later["id"].as_i64().unwrap(), 1).await.1["code"],
        "sale_not_started"
    );
    assert_eq!(
        app.buy(over["id"].as_i64().unwrap(), 1).await.1["code"],
        "sale_ended"
    );
    assert_eq!(app.buy(id + 100, 1).await.1["code"], "unknown_voucher");
    let user_token = app.token(Principal::User(1));
    let order = |token: String| {
        let req = app
            .http
            .get(format!("{}/api/vouchers/{id}/order", app.base))
            .bearer_auth(token);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    assert!(matches!(
        order(user_token.clone()).await["state"].as_str(),
        Some("pending" | "reserved")
    ));
    // The service's worker stores both orders.
    assert!(app.order_stored(id, 1).await, "the worker stores the order");
    assert!(app.order_stored(id, 2).await, "the worker stores the order");
    assert_eq!(order(user_token.clone()).await["state"], "reserved");
    let mine: Value = app
        .http
        .get(format!("{}/api/orders", app.base))
        .bearer_auth(user_token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(mine.as_array().unwrap().len(), 1);
    assert_eq!(app.db.voucher_stock(id).await.unwrap(), Some(0));
    order_life_tour(app, id).await;
    shop_tour(app).await;
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::OK);
}

/// Shop 1, 2: a voucher as a shop sells it (shop, texts, price and face
/// value in minor units of an ISO 4217 currency) is stored and read back
/// as sent on every database, what a shop must not publish is a 400 naming
/// the field, and an order carries its voucher's price.
async fn shop_tour(app: &TestApp) {
    let hour = 3_600_000;
    let rules = "One per table.\n不与其他优惠同享 🍲";
    let priced = |extra: Value| {
        let mut body = json!({
            "title": "Hotpot for two", "stock": 3,
            "begin_ms": now_ms() - 1000, "end_ms": now_ms() + hour,
            "shop": {"id": 42, "name": "海底捞 Haidilao"}, "subtitle": "Any weekday",
            "rules": rules, "price_minor": 9900, "face_value_minor": 20000, "currency": "CNY",
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body
    };
    let (status, v) = app
        .create_voucher(priced(json!({"refund_restock": "never"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["id"].as_i64().unwrap();
    for view in [v, app.show(id).await.1] {
        assert_eq!(
            view["shop"],
            json!({"id": 42, "name": "海底捞 Haidilao"}),
            "{view}"
        );
        assert_eq!(view["subtitle"], "Any weekday");
        assert_eq!(view["rules"], rules);
        assert_eq!(
            (&view["price_minor"], &view["face_value_minor"]),
            (&json!(9900), &json!(20000))
        );
        assert_eq!(
            (&view["currency"], &view["currency_exponent"]),
            (&json!("CNY"), &json!(2))
        );
        assert_eq!(view["refund_restock"], "never");
    }
    // Without a price: free, in no currency, of no named shop.
    let (_, free) = app.create_voucher(open_voucher(1)).await;
    assert_eq!(
        (
            &free["price_minor"],
            &free["face_value_minor"],
            &free["currency"]
        ),
        (&json!(0), &json!(0), &json!("XXX"))
    );
    assert_eq!(
        (&free["shop"], &free["subtitle"]),
        (&Value::Null, &json!(""))
    );
    assert_eq!(free["refund_restock"], "while_open");
    // Whole yen: no minor unit below the yen.
    let (status, yen) = app
        .create_voucher(priced(
            json!({"price_minor": 500, "face_value_minor": null, "currency": "JPY"}),
        ))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{yen}");
    assert_eq!(
        (&yen["face_value_minor"], &yen["currency_exponent"]),
        (&json!(500), &json!(0))
    );
    let above = priced(json!({"price_minor": 30000, "allow_price_above_face": true}));
    assert_eq!(app.create_voucher(above).await.0, StatusCode::CREATED);
    let stored = app.db.voucher_ids().await.unwrap();
    for (extra, field) in [
        (json!({"price_minor": 30000}), "price_minor"),
        (json!({"price_minor": -1}), "price_minor"),
        (
            json!({"price_minor": 1_000_000_000_001i64, "face_value_minor": null}),
            "price_minor",
        ),
        (json!({"face_value_minor": -5}), "face_value_minor"),
        (json!({"currency": "ABC"}), "currency"),
        (json!({"currency": "cny"}), "currency"),
        (json!({"currency": "XAU"}), "currency"),
        (json!({"currency": "XXX"}), "currency"),
        (json!({"currency": null}), "currency"),
        (json!({"subtitle": "teapot\u{202E}gpj.exe"}), "subtitle"),
        (json!({"subtitle": "x".repeat(201)}), "subtitle"),
        (json!({"subtitle": "two\nlines"}), "subtitle"),
        (json!({"rules": "tab\there"}), "rules"),
        (json!({"rules": "x".repeat(2001)}), "rules"),
        (json!({"shop": {"id": 0, "name": "x"}}), "shop.id"),
        (json!({"shop": {"id": 1, "name": " padded"}}), "shop.name"),
        (json!({"refund_restock": "sometimes"}), "refund_restock"),
    ] {
        let body = priced(extra.clone());
        let (status, e) = app.create_voucher(body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra} -> {e}");
        assert_eq!(e["field"], field, "{extra} -> {e}");
    }
    assert_eq!(
        app.db.voucher_ids().await.unwrap(),
        stored,
        "a refused voucher was stored"
    );
    // The order carries the price, and paying it keeps it.
    assert_eq!(app.buy(id, 5).await.0, StatusCode::OK);
    assert!(app.order_stored(id, 5).await, "the worker stores the order");
    let order = app.order_of(id, 5).await;
    assert_eq!(
        (&order["amount_minor"], &order["currency"]),
        (&json!(9900), &json!("CNY")),
        "{order}"
    );
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let (status, paid) = app
        .order_action(5, &order_id, "pay", Some("shop-tour"))
        .await;
    assert_eq!(status, StatusCode::OK, "{paid}");
    assert_eq!(
        (&paid["state"], &paid["amount_minor"]),
        (&json!("paid"), &json!(9900))
    );
    let revenue = app.db.revenue(id).await.unwrap();
    let cny = seckill::domain::money::Currency::parse("currency", "CNY").unwrap();
    assert_eq!(revenue.into_iter().collect::<Vec<_>>(), [(cny, 9900)]);
    after_payment_tour(app, id, &paid).await;
}

/// `POST /api/redemptions` with `body`, as `who`.
async fn redeem(app: &TestApp, who: Principal, body: Value) -> (StatusCode, Value) {
    let r = app
        .http
        .post(format!("{}/api/redemptions", app.base))
        .bearer_auth(app.token(who))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

/// Shop 4, 5 over HTTP: voucher `id` (its refunded units kept) and user
/// 5's `paid` order of it.
async fn after_payment_tour(app: &TestApp, id: i64, paid: &Value) {
    let order_id = paid["order_id"].as_str().unwrap();
    let code = paid["redeem_code"]
        .as_str()
        .expect("a paid order shows its code");
    // The shop redeems it as the buyer reads it out: once.
    let typed = code.to_lowercase().replace('-', " ");
    let (status, used) = redeem(app, Principal::Admin, json!({"code": typed})).await;
    assert_eq!(
        (status, &used["state"]),
        (StatusCode::OK, &json!("used")),
        "{used}"
    );
    assert!(used["used_ms"].as_i64().is_some());
    let (status, again) = redeem(app, Principal::Admin, json!({"code": code})).await;
    assert_eq!(
        (status, &again["code"]),
        (StatusCode::CONFLICT, &json!("order_used"))
    );
    let (status, e) = app.order_action(5, order_id, "refund", Some("r-5")).await;
    assert_eq!(
        (status, &e["code"]),
        (StatusCode::CONFLICT, &json!("order_used")),
        "{e}"
    );
    let (status, e) = redeem(app, Principal::User(5), json!({"code": code})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{e}");
    let (status, e) = redeem(app, Principal::Admin, json!({"code": "ABCDE-ABCDU"})).await;
    assert_eq!(
        (status, &e["field"]),
        (StatusCode::BAD_REQUEST, &json!("code")),
        "{e}"
    );
    let (status, e) = redeem(app, Principal::Admin, json!({"code": "00000-00000"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{e}");
    // Another buyer's order: refunded once per key; not before payment.
    assert_eq!(app.buy(id, 6).await.0, StatusCode::OK);
    assert!(app.order_stored(id, 6).await, "the worker stores the order");
    let order = app.order_of(id, 6).await;
    let order_id = order["order_id"].as_str().unwrap();
    let (status, e) = app.order_action(6, order_id, "refund", Some("r-6")).await;
    assert_eq!(
        (status, &e["code"]),
        (StatusCode::CONFLICT, &json!("order_not_paid")),
        "{e}"
    );
    let (status, e) = app.order_action(6, order_id, "refund", None).await;
    assert_eq!(
        (status, &e["field"]),
        (StatusCode::BAD_REQUEST, &json!("Idempotency-Key"))
    );
    assert_eq!(
        app.order_action(6, order_id, "pay", Some("p-6")).await.0,
        StatusCode::OK
    );
    let stock = app.db.voucher_stock(id).await.unwrap();
    let (status, refunded) = app.order_action(6, order_id, "refund", Some("r-6")).await;
    assert_eq!(
        (status, &refunded["state"]),
        (StatusCode::OK, &json!("refunded")),
        "{refunded}"
    );
    assert!(refunded["refunded_ms"].as_i64().is_some());
    let (status, again) = app.order_action(6, order_id, "refund", Some("r-6")).await;
    assert_eq!(
        (status, &again["state"]),
        (StatusCode::OK, &json!("refunded")),
        "{again}"
    );
    let (status, e) = app.order_action(5, order_id, "refund", Some("r-6")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another buyer's order: {e}");
    assert_eq!(
        app.db.voucher_stock(id).await.unwrap(),
        stock,
        "this voucher keeps refunded units"
    );
    let refunded_code = refunded["redeem_code"].as_str().unwrap();
    let (status, e) = redeem(app, Principal::Admin, json!({"code": refunded_code})).await;
    assert_eq!(
        (status, &e["code"]),
        (StatusCode::CONFLICT, &json!("order_refunded"))
    );
}

/// Payment, cancellation, expiry and each refusal, on voucher `sold`
/// whose two units users 1 and 2 hold in stored orders.
async fn order_life_tour(app: &TestApp, sold: i64) {
    let first = app.order_of(sold, 1).await["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = app.order_of(sold, 2).await["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, e) = app.order_action(1, &first, "pay", None).await;
    assert_eq!(
        (status, e["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("Idempotency-Key"))
    );
    let (status, e) = app.order_action(1, &first, "pay", Some("bad key!")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
    // Another buyer's order is not found, whatever the action.
    assert_eq!(
        app.order_action(2, &first, "pay", Some("k1")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.order_action(2, &first, "cancel", None).await.0,
        StatusCode::NOT_FOUND
    );
    let (status, paid) = app.order_action(1, &first, "pay", Some("k1")).await;
    assert_eq!(
        (status, paid["state"].as_str()),
        (StatusCode::OK, Some("paid")),
        "{paid}"
    );
    assert!(paid["paid_ms"].as_i64().is_some() && paid["pay_by_ms"].as_i64().is_some());
    // The same key answers the same; another key, or a cancellation, is a
    // 409: a paid order is not cancelled (it is refunded instead).
    let (status, again) = app.order_action(1, &first, "pay", Some("k1")).await;
    assert_eq!(
        (status, again["paid_ms"].clone()),
        (StatusCode::OK, paid["paid_ms"].clone())
    );
    let (status, e) = app.order_action(1, &first, "pay", Some("k2")).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_paid"))
    );
    let (status, e) = app.order_action(1, &first, "cancel", None).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_paid"))
    );
    // A cancellation gives the unit back at once, in both stores, once.
    let (status, cancelled) = app.order_action(2, &second, "cancel", None).await;
    assert_eq!(
        (status, cancelled["state"].as_str()),
        (StatusCode::OK, Some("cancelled")),
        "{cancelled}"
    );
    assert_eq!(
        app.order_action(2, &second, "cancel", None).await.0,
        StatusCode::OK
    );
    let (status, e) = app.order_action(2, &second, "pay", Some("k3")).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_cancelled"))
    );
    assert_eq!(app.db.voucher_stock(sold).await.unwrap(), Some(1));
    assert_eq!(app.show(sold).await.1["stock_left"], 1);
    // The buyer may buy again (the default), and their new order is the
    // one they see; the unit is sold once.
    assert_eq!(app.buy(sold, 2).await.0, StatusCode::OK);
    assert_eq!(app.buy(sold, 3).await.1["code"], "sold_out");
    assert!(
        app.order_becomes(sold, 2, "reserved").await,
        "the new order is stored"
    );
    assert_ne!(
        app.order_of(sold, 2).await["order_id"].as_str(),
        Some(second.as_str())
    );
    let shown = app
        .http
        .get(format!("{}/api/orders/{second}", app.base))
        .bearer_auth(app.token(Principal::User(2)))
        .send()
        .await
        .unwrap();
    assert_eq!(shown.status(), StatusCode::OK);
    assert_eq!(shown.json::<Value>().await.unwrap()["state"], "cancelled");

    // Expiry: a unit not paid for within the voucher's window comes back.
    let (status, v) = app
        .create_voucher(
            json!({"title": "Pay fast", "stock": 1, "begin_ms": now_ms() - 1000,
            "end_ms": now_ms() + 3_600_000, "pay_within_ms": 300, "rebuy_after_cancel": false}),
        )
        .await;
    assert_eq!(
        (status, v["pay_within_ms"].as_i64()),
        (StatusCode::CREATED, Some(300)),
        "{v}"
    );
    let fast = v["id"].as_i64().unwrap();
    assert_eq!(app.buy(fast, 5).await.0, StatusCode::OK);
    assert!(
        app.order_becomes(fast, 5, "expired").await,
        "the sweep expires it"
    );
    let late = app.order_of(fast, 5).await["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, e) = app.order_action(5, &late, "pay", Some("k5")).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (StatusCode::CONFLICT, Some("order_expired"))
    );
    assert!(
        testkit::eventually(Duration::from_secs(30), || async {
            app.show(fast).await.1["stock_left"] == 1
        })
        .await,
        "the expired unit is on sale again"
    );
    assert_eq!(app.db.voucher_stock(fast).await.unwrap(), Some(1));
    // This voucher does not let a buyer whose order was given back buy
    // again; another buyer gets the unit.
    assert_eq!(app.buy(fast, 5).await.1["code"], "already_bought");
    assert_eq!(app.buy(fast, 6).await.0, StatusCode::OK);
    let bad = json!({"title": "x", "stock": 1, "begin_ms": 1, "end_ms": 2, "pay_within_ms": 0});
    let (status, e) = app.create_voucher(bad).await;
    assert_eq!(
        (status, e["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("pay_within_ms"))
    );
}

#[tokio::test]
async fn every_route_and_refusal_works_on_sqlite_postgres_and_mariadb() {
    use seckill::db::Backend;
    route_tour(&spawn_app().await, Backend::Sqlite).await;
    let pg = testkit::PostgresServer::start();
    route_tour(
        &spawn_app_on(Some(pg.url()), None, None).await,
        Backend::Postgres,
    )
    .await;
    let maria = testkit::MariaDbServer::start();
    route_tour(
        &spawn_app_on(Some(maria.url()), None, None).await,
        Backend::MySql,
    )
    .await;
}

/// With Redis hanging (paused, so connections stay open and
/// nothing answers), `/readyz` answers 503 in about a second, naming it,
/// instead of making the probe time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_answers_in_about_a_second_when_redis_hangs() {
    let app = spawn_app().await;
    app.redis.pause();
    let started = std::time::Instant::now();
    let r = app.get("/readyz").await;
    let took = started.elapsed();
    app.redis.resume();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["redis"].as_str(), body["database"].as_str()),
        (Some("timeout"), Some("ok"))
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(2_500),
        "{took:?}"
    );
}

/// A Redis that is down is a 503 with `Retry-After` in the JSON
/// error shape, not a 500; `/readyz` names the failing dependency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_down_answers_503_with_retry_after() {
    let mut app = spawn_app().await;
    let (status, v) = app.create_voucher(open_voucher(5)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["id"].as_i64().unwrap();
    app.redis.kill();
    for _ in 0..3 {
        let r = app
            .http
            .post(format!("{}/api/vouchers/{id}/seckill", app.base))
            .bearer_auth(app.token(Principal::User(1)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["retry-after"], "1");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], "unavailable", "{body}");
        assert_eq!(body["message"], "redis is unavailable; retry later");
    }
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["redis"].as_str(), body["database"].as_str()),
        (Some("unreachable"), Some("ok"))
    );
}

/// Path, route and method errors come in the documented JSON
/// shape, naming the field where there is one.
#[tokio::test]
async fn path_route_and_method_errors_are_json() {
    let app = spawn_app().await;
    let r = app.get("/api/vouchers/abc").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (body["code"].as_str(), body["field"].as_str()),
        (Some("invalid_request"), Some("id"))
    );
    let r = app
        .http
        .delete(format!("{}/api/vouchers", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "method_not_allowed");
    let r = app.get("/api/nothing-here").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "not_found");
}

/// Service 22: every answer, a page, a JSON answer or an error, tells the browser to
/// run scripts and styles from this origin only and nothing inline, never
/// to frame the page, never to guess a type, never to pass the address on;
/// the pages' icon is served.
#[tokio::test]
async fn every_answer_carries_the_browser_security_headers() {
    let app = spawn_app().await;
    for path in [
        "/",
        "/admin",
        "/api/vouchers",
        "/api/nothing-here",
        "/assets/seckill.js",
    ] {
        let r = app.get(path).await;
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let csp = header("content-security-policy");
        for directive in [
            "script-src 'self'",
            "frame-ancestors 'none'",
            "default-src 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp:?}");
        }
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp:?}");
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
    }
    let icon = app.get("/assets/favicon.svg").await;
    assert_eq!(icon.status(), StatusCode::OK);
    assert_eq!(icon.headers()["content-type"], "image/svg+xml");
    let page = app.get("/").await.text().await.unwrap();
    assert!(page.contains(r#"<link rel="icon" href="/assets/favicon.svg""#));
    assert!(
        !page.contains(" style="),
        "no inline style the policy would block"
    );
}

/// The authentication scheme is case-insensitive, and a 429
/// says when to come back.
#[tokio::test]
async fn a_lowercase_bearer_scheme_is_accepted_and_429_has_retry_after() {
    let app = spawn_app_with(Limit::per_second(1), None).await;
    let (_, v) = app.create_voucher(open_voucher(100)).await;
    let id = v["id"].as_i64().unwrap();
    let buy = || {
        app.http
            .post(format!("{}/api/vouchers/{id}/seckill", app.base))
            .header(
                "Authorization",
                format!("bearer {}", app.token(Principal::User(9))),
            )
            .send()
    };
    assert_eq!(buy().await.unwrap().status(), StatusCode::OK);
    let mut limited = None;
    for _ in 0..4 {
        let r = buy().await.unwrap();
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r);
            break;
        }
    }
    let limited = limited.expect("the per-user limit answered 429");
    assert_eq!(limited.headers()["retry-after"], "1");
}

/// A key given twice names that field, not the whole body.
#[tokio::test]
async fn a_duplicated_key_names_its_field() {
    let app = spawn_app().await;
    let now = now_ms();
    let body = format!(
        r#"{{"title":"x","stock":1,"stock":2,"begin_ms":{now},"end_ms":{}}}"#,
        now + 60_000
    );
    let (status, body) = app.create_voucher_raw(body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], "stock", "{body}");
}

/// With PostgreSQL stopped, reads that need it are a 503
/// with `Retry-After` within about the pool's acquire timeout (2 s, was
/// 30 s), `/readyz` names it within about a second, purchases (Redis
/// alone) go on, and all recovers when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_a_fast_503_and_purchases_go_on() {
    let mut pg = testkit::PostgresServer::start();
    let app = spawn_app_on(Some(pg.url()), None, None).await;
    let (_, v) = app.create_voucher(open_voucher(5)).await;
    let id = v["id"].as_i64().unwrap();
    pg.stop(false);

    let started = std::time::Instant::now();
    let r = app.get("/api/vouchers").await;
    let took = started.elapsed();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "unavailable", "{body}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    let started = std::time::Instant::now();
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        ready.headers()["retry-after"],
        "1",
        "readyz's 503 says when to ask again"
    );
    let body: Value = ready.json().await.unwrap();
    assert_ne!(body["database"], "ok", "{body}");

    assert_eq!(
        app.buy(id, 1).await.0,
        StatusCode::OK,
        "Redis alone decides"
    );

    pg.try_restart().unwrap();
    let back = testkit::eventually(Duration::from_secs(10), || async {
        app.http
            .get(format!("{}/api/vouchers", app.base))
            .send()
            .await
            .is_ok_and(|r| r.status() == StatusCode::OK)
    })
    .await;
    assert!(back, "reads never recovered");
}

/// A voucher created while Redis is down is not left half made:
/// it is created (the database is the record, so a retrying client does not
/// make it twice) and becomes sellable once Redis is back, its sale restored
/// from the database by the first purchase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voucher_created_while_redis_is_down_becomes_sellable_when_it_returns() {
    let mut app = spawn_app().await;
    app.redis.kill();
    let (status, v) = app.create_voucher(open_voucher(1)).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let id = v["id"].as_i64().unwrap();
    let (status, e) = app.buy(id, 1).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{e}");

    app.redis.restart(); // without data, as after the outage
    let mut answers = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = app.buy(id, 1).await;
        answers.push(body["code"].as_str().unwrap_or("accepted").to_owned());
        if status == StatusCode::OK {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never sellable: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answers.iter().any(|c| c == "sale_repairing"), "{answers:?}");
    assert_eq!(app.buy(id, 2).await.1["code"], "sold_out");
    assert_eq!(app.db.voucher_ids().await.unwrap(), [id], "created once");
}

/// The purchase route reads no body and refuses a large one (it
/// used to accept and ignore 10 MB); `/metrics` and `/openapi.json` are
/// rate-limited per IP like the API, the probes are not.
#[tokio::test]
async fn per_route_body_limits_and_rate_limits_on_every_public_route() {
    let app = spawn_app_with(None, Limit::per_second(1)).await;
    let (_, v) = app.create_voucher(open_voucher(1)).await;
    let id = v["id"].as_i64().unwrap();
    let r = app
        .http
        .post(format!("{}/api/vouchers/{id}/seckill", app.base))
        .bearer_auth(app.token(Principal::User(1)))
        .body(vec![b'x'; 10 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "payload_too_large");

    for route in ["/metrics", "/openapi.json"] {
        let statuses: Vec<StatusCode> = futures_util::future::join_all(
            (0..6).map(|_| app.http.get(format!("{}{route}", app.base)).send()),
        )
        .await
        .into_iter()
        .map(|r| r.unwrap().status())
        .collect();
        assert!(
            statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
            "{route}: {statuses:?}"
        );
    }
    for probe in ["/healthz", "/readyz"] {
        for _ in 0..6 {
            let r = app.http.get(format!("{}{probe}", app.base)).send().await;
            assert_eq!(r.unwrap().status(), StatusCode::OK, "{probe}");
        }
    }
}

/// Every answer carries a request id (the client's, when it sends
/// a sensible one), the id every log line of the request carries.
#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let app = spawn_app().await;
    let id_of = |r: &reqwest::Response| {
        r.headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let made = app.get("/healthz").await;
    let made = id_of(&made).expect("an id is made");
    assert_eq!(made.len(), 36, "{made}");
    let kept = app
        .http
        .get(format!("{}/api/nothing", app.base))
        .header("x-request-id", "lb-4f2a.7")
        .send()
        .await
        .unwrap();
    assert_eq!(id_of(&kept).as_deref(), Some("lb-4f2a.7"));
    let replaced = app
        .http
        .get(format!("{}/healthz", app.base))
        .header("x-request-id", "no spaces or {braces} please")
        .send()
        .await
        .unwrap();
    assert_ne!(
        id_of(&replaced).as_deref(),
        Some("no spaces or {braces} please")
    );
}

/// A SQLite file another process holds locked (`BEGIN EXCLUSIVE`): every
/// route that reads the database answers 503 `unavailable` with
/// `Retry-After`, as a stopped server does, not 500 after SQLite's own
/// busy wait; purchases (Redis alone) go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_sqlite_file_is_a_503_on_every_route() {
    use sqlx::Connection;
    let app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(5)).await;
    let id = v["id"].as_i64().unwrap();
    assert_eq!(app.buy(id, 1).await.0, StatusCode::OK);

    let url = format!("sqlite://{}/api.db", app._dir.display());
    let mut other = sqlx::sqlite::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut other)
        .await
        .unwrap();
    let user = app.token(Principal::User(1));
    for path in [
        format!("/api/vouchers/{id}"),
        format!("/api/vouchers/{id}/order"),
        "/api/vouchers".to_owned(),
        "/api/orders".to_owned(),
    ] {
        let started = std::time::Instant::now();
        let r = app
            .http
            .get(format!("{}{path}", app.base))
            .bearer_auth(&user)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let retry_after = r.headers().get("retry-after").cloned();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        println!(
            "figure: {path} on a locked SQLite file: {status} after {:?}",
            started.elapsed()
        );
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert_eq!(body["code"], "unavailable", "{path}: {body}");
        assert!(retry_after.is_some(), "{path}: no Retry-After");
    }
    assert_eq!(
        app.buy(id, 2).await.0,
        StatusCode::OK,
        "Redis alone decides"
    );
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    assert_eq!(app.show(id).await.0, StatusCode::OK);
}

/// With the SQLite file locked by another process, payments and
/// cancellations sent one after another are each a 503 within about two
/// seconds
/// (`docs/guarantees.md`, service 3): the wait for the one connection and
/// the wait for the file's lock share one budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_locked_sqlite_file_every_order_change_is_a_503_within_two_seconds() {
    use sqlx::Connection;
    let app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(20)).await;
    let voucher = v["id"].as_i64().unwrap();
    let mut orders = Vec::new();
    for user in 1..=8 {
        assert_eq!(app.buy(voucher, user).await.0, StatusCode::OK);
        assert!(app.order_stored(voucher, user).await);
        orders.push((
            user,
            app.order_of(voucher, user).await["order_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        ));
    }
    let url = format!("sqlite://{}/api.db", app._dir.display());
    let mut other = sqlx::sqlite::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut other)
        .await
        .unwrap();
    // One after another, 250 ms apart: a change that gets the connection
    // late must not then wait for the lock as long again.
    let changes = orders.iter().map(|(user, order)| {
        let action = if user % 2 == 0 { "pay" } else { "cancel" };
        let app = &app;
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(250 * *user as u64)).await;
            let started = std::time::Instant::now();
            let (status, body) = app
                .order_action(*user, order, action, Some("locked-key"))
                .await;
            (action, status, body, started.elapsed())
        }
    });
    let answers = futures_util::future::join_all(changes).await;
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    let slowest = answers.iter().map(|a| a.3).max().unwrap();
    println!("figure: 8 order changes on a locked SQLite file, the slowest 503 after {slowest:?}");
    for (action, status, body, _) in &answers {
        assert_eq!(*status, StatusCode::SERVICE_UNAVAILABLE, "{action}: {body}");
        assert_eq!(body["code"], "unavailable", "{action}: {body}");
    }
    assert!(
        slowest < std::time::Duration::from_millis(2_500),
        "a 503 after {slowest:?}"
    );
}

/// A title with a lone UTF-16 surrogate escape (not a character: JSON
/// text that no string can hold) is a 400 naming `title`, as any other bad
/// title.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_surrogate_in_a_title_names_the_title() {
    let app = spawn_app().await;
    let body = format!(
        r#"{{"title": "bad \ud800 title", "stock": 1, "begin_ms": {}, "end_ms": {}}}"#,
        now_ms(),
        now_ms() + 60_000
    );
    let (status, err) = app.create_voucher_raw(body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(err["field"], "title", "{err}");
    assert_eq!(err["code"], "invalid_request", "{err}");
}

/// Paying or cancelling an order that was accepted but is not stored yet
/// (`docs/guarantees.md`, service 8) is a 409 `order_pending` with
/// `Retry-After`, not a 404; one the pipeline gave up on is a 409
/// `order_failed`; an unknown id, or another buyer's, stays a 404. (The
/// orders in flight are written as the purchase writes them, without a
/// stream entry, so that the pipeline does not store them meanwhile.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_not_stored_yet_is_a_409_to_pay_or_cancel_not_a_404() {
    let app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(50)).await;
    let voucher = v["id"].as_i64().unwrap();
    let mut conn = redis::Client::open(app.redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = seckill::store::VoucherKeys::new("seckill", voucher);
    let (pending, failed) = (4_000_000_001_i64, 4_000_000_002_i64);
    let () = redis::pipe()
        .hset(&keys.order_of, 7, pending)
        .hset(&keys.order_of, 8, failed)
        .hset(&keys.failed, 8, failed)
        .query_async(&mut conn)
        .await
        .unwrap();
    for action in ["pay", "cancel"] {
        let key = Some("key-1").filter(|_| action == "pay");
        let r = app
            .http
            .post(format!("{}/api/orders/{pending}/{action}", app.base))
            .bearer_auth(app.token(Principal::User(7)));
        let r = match key {
            Some(key) => r.header("Idempotency-Key", key),
            None => r,
        };
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::CONFLICT, "{action}");
        assert_eq!(
            r.headers().get("retry-after").map(|v| v.to_str().unwrap()),
            Some("1")
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], "order_pending", "{action}: {body}");
        let (status, body) = app.order_action(8, &failed.to_string(), action, key).await;
        assert_eq!(status, StatusCode::CONFLICT, "{action}: {body}");
        assert_eq!(body["code"], "order_failed", "{action}: {body}");
        // Another buyer's order, and an unknown one: not found.
        let (status, _) = app.order_action(9, &pending.to_string(), action, key).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{action}");
        let (status, _) = app.order_action(7, "4000000009", action, key).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{action}");
    }
}

/// After a Redis outage (restarted without its data) nobody has to buy
/// first for the service to notice (`docs/guarantees.md`, service 3 and
/// 4): the sale is restored from the database before any purchase is
/// made, and twenty buyers arriving together afterwards are all served,
/// none refused as if Redis were still down or the sale still repairing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_the_sale_is_repaired_and_purchases_resume_before_a_buyer_asks() {
    let mut app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(50)).await;
    let id = v["id"].as_i64().unwrap();
    assert_eq!(app.buy(id, 1).await.0, StatusCode::OK);
    assert!(app.order_stored(id, 1).await);
    app.redis.kill();
    let (status, body) = app.buy(id, 2).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    app.redis.restart(); // without data

    // Restored, then armed: the purchase script is loaded last, once the
    // state is verified, and purchases answer 503 until then.
    let restored = testkit::eventually(Duration::from_secs(30), || async {
        app.fast.remaining_stock(id).await.ok().flatten() == Some(49)
            && app.fast.is_armed().await.unwrap_or(false)
    })
    .await;
    assert!(restored, "the sale was not restored before anyone bought");
    let buys: Vec<_> = (3..23).map(|user| app.buy(id, user)).collect();
    for (status, body) in futures_util::future::join_all(buys).await {
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

/// Once a purchase found Redis unreachable, the next purchases are
/// refused with the same 503 at once instead of each waiting for its own
/// connection attempts (seconds each); the service finds out when Redis is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_while_redis_is_known_down_are_refused_at_once() {
    let mut app = spawn_app().await;
    let (_, v) = app.create_voucher(open_voucher(50)).await;
    let id = v["id"].as_i64().unwrap();
    assert_eq!(app.buy(id, 1).await.0, StatusCode::OK);
    app.redis.kill();
    let (status, body) = app.buy(id, 2).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let started = std::time::Instant::now();
    for user in 3..23 {
        let (status, body) = app.buy(id, user).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["code"], "unavailable", "{body}");
    }
    let took = started.elapsed();
    println!("figure: 20 purchases with Redis known down answered in {took:?}");
    // Each waited for its own reconnection attempts (20 took 10.8 s) when
    // the service did not remember; now together they take milliseconds.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    app.redis.restart();
    let back = testkit::eventually(Duration::from_secs(30), || async {
        app.buy(id, 100).await.0 != StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert!(back, "purchases never resumed");
}
