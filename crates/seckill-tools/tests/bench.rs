//! `seckill-tools bench` end to end: the real binary against live service
//! instances on a private Redis and a real database; its JSON report and
//! PNG charts are read back and its counts compared with the database.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use seckill::db::Database;
use seckill::service::Service;
use seckill::settings::{Mode, Settings};
use seckill::testing as support;
use serde_json::Value;
use testkit::{PostgresServer, RedisServer};

const SECRET: &str = "bench-test-secret-0001";

async fn bench(args: &[&str]) -> Output {
    bench_command(args)
        .output()
        .await
        .expect("run seckill-tools bench")
}

fn bench_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckill-tools"));
    command
        .arg("bench")
        .args(args)
        .env("SECKILL_TOKEN_SECRET", SECRET)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}

/// Starts a 5,000-user open-loop bench (with `args`) against `url` and
/// returns once 10 of its orders are in `database` (voucher 1).
async fn bench_under_way(
    args: &[&str],
    url: &str,
    redis: &str,
    database: &str,
    out: &Path,
) -> tokio::process::Child {
    let common = [
        "--url",
        url,
        "--users",
        "5000",
        "--stock",
        "1000",
        "--redis-url",
        redis,
    ];
    let stores = ["--database-url", database, "--out", out.to_str().unwrap()];
    let child = bench_command(&[&common[..], &stores[..], args].concat())
        .spawn()
        .expect("run seckill-tools bench");
    let db = Database::connect(database).await.unwrap();
    let underway = testkit::eventually(Duration::from_secs(20), || async {
        db.order_count(1).await.unwrap_or(0) >= 10
    })
    .await;
    assert!(underway, "no orders were stored");
    child
}

/// `seckill-tools bench` with `args`, checking against `redis` and `database`,
/// writing into `out`.
async fn bench_with_stores(args: &[&str], redis: &str, database: &str, out: &Path) -> Output {
    let out = out.to_str().unwrap();
    let stores = [
        "--redis-url",
        redis,
        "--database-url",
        database,
        "--out",
        out,
    ];
    bench(&[args, &stores[..]].concat()).await
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn report(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).expect("report.json"))
        .expect("report.json is JSON")
}

/// Each chart is a real PNG of the size the bench draws.
fn assert_charts(dir: &Path) {
    for name in ["throughput.png", "latency.png", "latency-distribution.png"] {
        let png = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name} is not a PNG");
        assert_eq!(&png[12..16], b"IHDR", "{name}");
        let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((width, height), (1000, 560), "{name}");
        // A blank canvas compresses to almost nothing; axes, text and
        // lines do not.
        assert!(png.len() > 10_000, "{name} is {} bytes", png.len());
    }
}

/// A service in `mode` on a private Redis and a fresh SQLite file.
async fn sqlite_service(what: &str, mode: Mode) -> (RedisServer, String, Service) {
    let redis = RedisServer::start();
    let database = format!("sqlite://{}/bench.db", tempdir(what).display());
    let service = Service::start(Settings {
        mode,
        ..support::settings(redis.url(), &database, SECRET)
    })
    .await
    .unwrap();
    (redis, database, service)
}

/// Two service instances, `a` and `b`, on `redis` and `database`.
async fn two_instances(redis: &RedisServer, database: &str) -> (Service, Service) {
    let config = |consumer: &str| Settings {
        consumer: consumer.into(),
        ..support::settings(redis.url(), database, SECRET)
    };
    let a = Service::start(config("a")).await.unwrap();
    let b = Service::start(config("b")).await.unwrap();
    (a, b)
}

/// A closed-loop bench over two URLs: 200 users asking 600 times in all,
/// 16 in flight, for 40 units.
fn sale_of_40<'a>(url_a: &'a str, url_b: &'a str) -> [&'a str; 12] {
    [
        "--url",
        url_a,
        "--url",
        url_b,
        "--concurrency",
        "16",
        "--requests",
        "600",
        "--users",
        "200",
        "--stock",
        "40",
    ]
}

/// The names of the report's checks: those that `held` as given, or all.
fn check_names(report: &Value, held: Option<bool>) -> Vec<&str> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| held.is_none_or(|h| c["held"] == h))
        .map(|c| c["name"].as_str().unwrap())
        .collect()
}

fn n(report: &Value, field: &str) -> i64 {
    report[field]
        .as_i64()
        .unwrap_or_else(|| panic!("{field} in {report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_loop_bench_over_two_instances_agrees_with_the_database() {
    let redis = RedisServer::start();
    let pg = PostgresServer::start();
    let (a, b) = two_instances(&redis, &pg.url()).await;
    let out_dir = tempdir("closed");
    let (url_a, url_b) = (
        format!("http://{}", a.addr()),
        format!("http://{}/", b.addr()),
    );
    let out = bench_with_stores(
        &[&sale_of_40(&url_a, &url_b)[..], &["--ceiling", "300ms"]].concat(),
        &redis.url(),
        &pg.url(),
        &out_dir,
    )
    .await;
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("all invariants hold"), "{log}");

    let r = report(&out_dir);
    assert_eq!(r["model"], "closed", "{r}");
    assert_eq!(n(&r, "requests"), 600);
    assert!(r["ceiling_rps"].as_f64().unwrap() > 0.0, "{r}");
    assert!(log.contains("of the ceiling"), "{log}");
    // Spread round-robin: each instance got half.
    let targets = r["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2);
    for t in targets {
        assert_eq!(t["requests"], 300, "{t}");
    }
    let outcomes: i64 = r["outcomes"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum();
    assert_eq!(outcomes, 600, "{r}");
    // 200 users asking 3 times each for 40 units: the stock sells out.
    assert_eq!(n(&r, "accepted"), 40, "{r}");
    assert_eq!(r["invariants_hold"], true);
    assert!(r["checks"].as_array().unwrap().len() >= 10, "{r}");

    // The database, read here rather than trusted from the report.
    let db = Database::connect(&pg.url()).await.unwrap();
    let voucher = n(&r, "voucher");
    assert_eq!(db.order_count(voucher).await.unwrap(), 40);
    assert_eq!(db.voucher_stock(voucher).await.unwrap(), Some(0));
    let per_second: i64 = r["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| n(s, "completed"))
        .sum();
    assert_eq!(per_second, 600, "the timeline accounts for every request");
    assert_charts(&out_dir);
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_bench_keeps_its_schedule_and_charges_waiting_to_latency() {
    let (redis, database, service) = sqlite_service("open-db", Mode::Async).await;
    let out_dir = tempdir("open");
    let url = format!("http://{}", service.addr());
    let out = bench_with_stores(
        &[
            "--url",
            &url,
            "--rate",
            "300",
            "--duration",
            "2s",
            "--users",
            "1000",
            "--stock",
            "100",
        ],
        &redis.url(),
        &database,
        &out_dir,
    )
    .await;
    let log = text(&out);
    assert!(out.status.success(), "{log}");

    let r = report(&out_dir);
    assert_eq!(r["model"], "open");
    // Scheduled at 300/s for 2 s: exactly 600 requests, whatever the
    // service's speed.
    assert_eq!(n(&r, "requests"), 600, "{r}");
    let latency = &r["latency_ms"];
    let service_time = &r["service_time_ms"];
    for q in ["p50", "p99", "max"] {
        assert!(
            latency[q].as_f64().unwrap() >= service_time[q].as_f64().unwrap(),
            "latency from the schedule includes the round trip: {q} {latency} {service_time}"
        );
    }
    let db = Database::connect(&database).await.unwrap();
    let voucher = n(&r, "voucher");
    assert_eq!(db.order_count(voucher).await.unwrap(), n(&r, "accepted"));
    assert_eq!(n(&r, "accepted"), 100, "{r}");
    assert_charts(&out_dir);
    service.stop().await.unwrap();
}

/// Service 8 to 11: the buyer model after the load (some pay, some cancel,
/// some never pay within a 3 s window; of those who pay, some have it
/// refunded and some redeem it), over two instances: every unit given back
/// sells again, every unit ends paid or used, and the stores agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_with_the_buyer_model_ends_with_every_unit_paid() {
    let redis = RedisServer::start();
    let database = format!("sqlite://{}/bench.db", tempdir("buyers").display());
    let (a, b) = two_instances(&redis, &database).await;
    let out_dir = tempdir("buyers-out");
    let (url_a, url_b) = (
        format!("http://{}", a.addr()),
        format!("http://{}", b.addr()),
    );
    let model = [
        "--pay-share",
        "0.5",
        "--cancel-share",
        "0.2",
        "--refund-share",
        "0.2",
        "--redeem-share",
        "0.3",
        "--pay-within",
        "3s",
        "--rounds",
        "4",
    ];
    let out = bench_with_stores(
        &[&sale_of_40(&url_a, &url_b)[..], &model[..]].concat(),
        &redis.url(),
        &database,
        &out_dir,
    )
    .await;
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("all invariants hold"), "{log}");
    let r = report(&out_dir);
    let held = check_names(&r, Some(true));
    for wanted in [
        "no order both paid and given back (answers)",
        "stock = available + reserved + paid + used + refunded units kept (database)",
        "every unit given back was sold again, and every unit ends paid or used (database)",
        "no unit taken back twice: Redis' returned orders = cancelled + expired + refunded units back, Redis stock = database stock",
        "the database's paid, used, refunded and cancelled orders are those answered so",
    ] {
        assert!(held.contains(&wanted), "{wanted}: {held:?}");
    }
    // The database, read here: every unit paid, each once.
    let db = Database::connect(&database).await.unwrap();
    let voucher = n(&r, "voucher");
    let seckill::db::StateCounts {
        reserved,
        paid,
        cancelled,
        expired,
        used,
        refunded,
        ..
    } = db.order_states(voucher).await.unwrap();
    assert_eq!((reserved, paid + used), (0, 40), "{log}");
    assert!(
        cancelled + expired > 0 && refunded > 0 && used > 0,
        "the model gave no unit back, or refunded or redeemed none: {log}"
    );
    assert_eq!(db.voucher_stock(voucher).await.unwrap(), Some(0));
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_of_the_locked_sync_path_checks_the_database_alone() {
    let (redis, database, service) = sqlite_service("sync-db", Mode::Sync).await;
    let out_dir = tempdir("sync");
    let url = format!("http://{}", service.addr());
    let out = bench_with_stores(
        &[
            "--url",
            &url,
            "--concurrency",
            "8",
            "--requests",
            "150",
            "--users",
            "50",
            "--stock",
            "20",
        ],
        &redis.url(),
        &database,
        &out_dir,
    )
    .await;
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let r = report(&out_dir);
    assert_eq!(n(&r, "accepted"), 20, "{r}");
    let checks = check_names(&r, None);
    // Orders are stored before the answer: the database is the whole truth,
    // and the Redis-side checks of the pipeline do not apply.
    assert!(checks.contains(&"every accepted order is stored (accepted ⊆ stored)"));
    assert!(!checks.iter().any(|c| c.contains("pipeline")), "{checks:?}");
    let db = Database::connect(&database).await.unwrap();
    assert_eq!(db.order_count(n(&r, "voucher")).await.unwrap(), 20);
    service.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_goes_away_mid_run_is_counted_reported_and_fails_the_run() {
    let (redis, database, service) = sqlite_service("gone-db", Mode::Async).await;
    let out_dir = tempdir("gone");
    let url = format!("http://{}", service.addr());
    let args = ["--rate", "300", "--duration", "4s"];
    let child = bench_under_way(&args, &url, &redis.url(), &database, &out_dir).await;
    service.stop().await.unwrap();

    let out = child.wait_with_output().await.unwrap();
    let log = text(&out);
    assert!(
        !out.status.success(),
        "a run with failed requests passed: {log}"
    );
    let r = report(&out_dir);
    let refused_connections = r["outcomes"]["error: connect"].as_i64().unwrap_or(0);
    assert!(refused_connections > 0, "{r}");
    assert_eq!(r["invariants_hold"], false);
    let failed = check_names(&r, Some(false));
    assert_eq!(failed, ["no request failed"], "{r}");
    // What was accepted before the stop was drained into the database.
    let db = Database::connect(&database).await.unwrap();
    assert_eq!(db.order_count(1).await.unwrap(), n(&r, "accepted"));
    assert_eq!(n(&r, "requests"), 1200, "the schedule went on: {r}");
    assert_charts(&out_dir);
}

/// A request whose answer died with its instance has an unknown
/// outcome; the store checks hold with accepted ⊆ stored ⊆ accepted ∪
/// unknown, and the report says how many unknowns turned out stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_run_leaves_unknown_outcomes_that_the_store_checks_account_for() {
    let redis = RedisServer::start();
    let database = format!("sqlite://{}/bench.db", tempdir("killed-db").display());
    let mut doomed = support::ServeProcess::start(&redis.url(), &database, "doomed", SECRET).await;
    let survivor = support::ServeProcess::start(&redis.url(), &database, "survivor", SECRET).await;
    let out_dir = tempdir("killed");
    let args = [
        "--url",
        &survivor.base,
        "--rate",
        "600",
        "--duration",
        "4s",
        "--drain-timeout",
        "20s",
    ];
    let child = bench_under_way(&args, &doomed.base, &redis.url(), &database, &out_dir).await;
    // Frozen first, so requests are in flight on it when it dies.
    doomed.signal("STOP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    doomed.end("KILL");
    let out = child.wait_with_output().await.unwrap();
    let log = text(&out);
    let r = report(&out_dir);
    let failed = check_names(&r, Some(false));
    // Requests to the dead instance failed; nothing else did.
    assert_eq!(failed, ["no request failed"], "{log}");
    let checked = check_names(&r, None);
    assert!(
        checked
            .iter()
            .any(|c| c.contains("stored ⊆ accepted ∪ unknown")),
        "{r}"
    );
    let unknown = n(&r, "unknown");
    let unknown_stored = n(&r, "unknown_stored");
    assert!(unknown > 0, "no request was in flight at the kill: {r}");
    assert!(unknown_stored <= unknown, "{r}");
    let db = Database::connect(&database).await.unwrap();
    let stored = db.order_count(1).await.unwrap();
    assert_eq!(stored, n(&r, "accepted") + unknown_stored, "{r}");
    eprintln!(
        "{unknown} unknown outcomes, {unknown_stored} stored; {} refused connections",
        r["outcomes"]["error: connect"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_killed_mid_run_fails_requests_and_checks_but_the_report_is_written() {
    let (mut redis, database, service) = sqlite_service("redis-gone-db", Mode::Async).await;
    let out_dir = tempdir("redis-gone");
    let url = format!("http://{}", service.addr());
    let args = [
        "--rate",
        "200",
        "--duration",
        "3s",
        "--drain-timeout",
        "1s",
        "--timeout",
        "2s",
    ];
    let child = bench_under_way(&args, &url, &redis.url(), &database, &out_dir).await;
    redis.kill();
    let out = child.wait_with_output().await.unwrap();
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    let r = report(&out_dir);
    let failed_requests: i64 = r["outcomes"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("error"))
        .map(|(_, n)| n.as_i64().unwrap())
        .sum();
    assert!(failed_requests > 0, "{r}");
    let unchecked = r["checks"].as_array().unwrap().iter().any(|c| {
        c["held"] == false
            && c["name"]
                .as_str()
                .unwrap()
                .starts_with("the stores could be checked")
    });
    assert!(unchecked, "{r}");
    assert_charts(&out_dir);
    // Without its Redis the service still stops, and soon (it took 23 s
    // with redis-rs' default reconnection retries; ~1 s now).
    tokio::time::timeout(Duration::from_secs(15), service.stop())
        .await
        .expect("the service stops without its Redis")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_and_unreachable_instances_are_refused_before_any_load() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--url", "http://127.0.0.1:9", "--rate", "0"],
            "--rate must be",
        ),
        (
            &["--url", "http://127.0.0.1:9", "--concurrency", "0"],
            "--concurrency must be",
        ),
        (
            &["--url", "http://127.0.0.1:9", "--requests", "0"],
            "--requests must be positive",
        ),
        (
            &[
                "--url",
                "http://127.0.0.1:9",
                "--rate",
                "5",
                "--concurrency",
                "2",
            ],
            "cannot be used with",
        ),
        (
            &["--url", "http://127.0.0.1:9", "--requests", "5"],
            "does not answer /healthz",
        ),
    ];
    for (args, expected) in cases {
        let out = bench(args).await;
        let log = text(&out);
        assert!(!out.status.success(), "{args:?} succeeded: {log}");
        assert!(log.contains(expected), "{args:?}: {log}");
    }
}

fn tempdir(what: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("seckill-bench-test-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Shop 9 through the bench: two instances paying through the provider
/// simulator (callbacks late, reordered and sent twice), the buyer model
/// paying, refunding and redeeming; the money checked against the
/// provider's ledger (`--payments-ledger`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_checks_the_money_against_the_providers_ledger() {
    use seckill::settings::PaymentSettings;
    use secrecy::SecretString;
    use tokio::io::AsyncBufReadExt;
    let mut provider = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckill-tools"))
        .args([
            "payments",
            "--api-key",
            "sk_bench",
            "--webhook-secret",
            "whsec_bench",
        ])
        .args([
            "--delay-ms",
            "50",
            "--reorder-ms",
            "100",
            "--duplicate",
            "0.5",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(provider.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let ledger = line
        .strip_prefix("payments: listening on ")
        .unwrap()
        .to_owned();
    let redis = RedisServer::start();
    let database = format!("sqlite://{}/bench.db", tempdir("money").display());
    let config = |consumer: &str| Settings {
        consumer: consumer.into(),
        payments: PaymentSettings::Provider {
            url: ledger.clone(),
            api_key: SecretString::from("sk_bench"),
            webhook_secret: SecretString::from("whsec_bench"),
            tolerance: seckill::payments::events::DEFAULT_TOLERANCE,
        },
        ..support::settings(redis.url(), &database, SECRET)
    };
    let a = Service::start(config("a")).await.unwrap();
    let b = Service::start(config("b")).await.unwrap();
    let (url_a, url_b) = (
        format!("http://{}", a.addr()),
        format!("http://{}", b.addr()),
    );
    let set = reqwest::Client::new()
        .put(format!("{ledger}/v1/callbacks"))
        .json(&[&url_a, &url_b])
        .send()
        .await
        .unwrap();
    assert!(set.status().is_success());
    let out_dir = tempdir("money-out");
    let model = [
        "--pay-share",
        "0.6",
        "--cancel-share",
        "0.1",
        "--refund-share",
        "0.2",
        "--redeem-share",
        "0.3",
        "--pay-within",
        "2s",
        "--rounds",
        "4",
        "--payments-ledger",
        &ledger,
    ];
    let out = bench_with_stores(
        &[&sale_of_40(&url_a, &url_b)[..], &model[..]].concat(),
        &redis.url(),
        &database,
        &out_dir,
    )
    .await;
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let r = report(&out_dir);
    let held = check_names(&r, Some(true));
    for wanted in [
        "money: every order kept its amount if paid or used, nothing otherwise (0 not)",
        "money adds up (CNY): the provider kept what the paid and used orders cost",
    ] {
        assert!(held.contains(&wanted), "{wanted}: {held:?}");
    }
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// Room 9 (`docs/guarantees.md`): `bench --crowd`, 1,000 people and 50
/// bots (each 20× a person's requests, early) at 100 units over two
/// instances: behind the waiting room the bots' units are within noise of
/// their share of the crowd (4.8%: about 5 units), beside the same crowd
/// at a sale without a room, where they are measured and reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_waiting_room_bots_buy_no_more_than_their_share() {
    let (redis, database, a) = sqlite_service("crowd", Mode::Async).await;
    let b = Service::start(Settings {
        consumer: "b".into(),
        ..support::settings(redis.url(), &database, SECRET)
    })
    .await
    .unwrap();
    let (url_a, url_b) = (
        format!("http://{}", a.addr()),
        format!("http://{}", b.addr()),
    );
    let out = tempdir("crowd-report");
    let run = bench(&[
        "--url",
        &url_a,
        "--url",
        &url_b,
        "--crowd",
        "--people",
        "1000",
        "--bots",
        "50",
        "--bot-factor",
        "20",
        "--stock",
        "100",
        "--admit-per-s",
        "100",
        "--lead",
        "3s",
        "--out",
        out.to_str().unwrap(),
    ])
    .await;
    let log = text(&run);
    assert!(run.status.success(), "{log}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("crowd-report.json")).unwrap()).unwrap();
    let room = &report["with_room"];
    let units = |o: &Value| o["people_units"].as_u64().unwrap() + o["bot_units"].as_u64().unwrap();
    // Every unit sold, in both sales, and nothing unexpected answered.
    assert_eq!(units(room), 100, "{log}");
    assert_eq!(units(&report["without_room"]), 100, "{log}");
    assert_eq!(room["unexpected"], 0, "{log}");
    // Five standard deviations of a fair draw: by chance once in a few
    // million runs.
    assert!(room["z"].as_f64().unwrap() <= 5.0, "{log}");
    println!("{log}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
