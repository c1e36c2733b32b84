//! The service on a Redis that speaks TLS only (`docs/guarantees.md`,
//! service 19): one server (`rediss://`) on both purchase paths, a
//! Sentinel service (`rediss+sentinel://`) through a failover and a
//! cluster (`rediss+cluster://`), trusting a private CA given by the
//! settings (and, for the Sentinel service's servers, verifying them by
//! the name the settings give); and on a PostgreSQL and a MariaDB that
//! speak TLS only.

use seckill::testing as support;

use std::collections::HashSet;
use std::time::Duration;

use reqwest::StatusCode;
use seckill::auth::{Principal, Tokens};
use seckill::db::Database;
use seckill::service::Service;
use seckill::settings::{Mode, Settings};
use seckill::store::{RedisTls, SENTINEL_TLS_SCHEME};
use serde_json::Value;
use testkit::{RedisServer, SentinelGroup, ServerOptions, TestCa, Transport, SENTINEL_SERVICE};

const SECRET: &str = "tls-test-secret-000001";

/// A private CA in a directory of its own, removed when dropped.
struct Ca {
    ca: TestCa,
    dir: std::path::PathBuf,
}

impl Ca {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("seckill-tls-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self {
            ca: TestCa::create(&dir).unwrap(),
            dir,
        }
    }

    fn trust(&self) -> RedisTls {
        RedisTls {
            ca_file: Some(self.ca.ca_file()),
            ..RedisTls::default()
        }
    }

    /// An instance on the Redis deployment `url` (trusting this CA) and
    /// the SQLite file `database`, and its address.
    async fn serve(&self, url: String, database: &str) -> (Service, String) {
        let service = Service::start(Settings {
            redis_tls: self.trust(),
            ..support::settings(url, database, SECRET)
        })
        .await
        .unwrap();
        let base = format!("http://{}", service.addr());
        (service, base)
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sells `buyers` units of a fresh voucher through `base`, then pays for
/// the first order and cancels the second; returns the accepted order ids.
async fn sell(http: &reqwest::Client, base: &str, tokens: &Tokens, buyers: i64) -> (i64, Vec<i64>) {
    let voucher = support::open_voucher(http, base, tokens, "TLS sale", buyers * 2).await;
    let mut accepted = Vec::new();
    for user in 1..=buyers {
        let r = support::purchase(http, base, tokens, voucher, user).await;
        assert_eq!(r.status(), StatusCode::OK);
        let body: Value = r.json().await.unwrap();
        accepted.push(body["order_id"].as_str().unwrap().parse().unwrap());
    }
    (voucher, accepted)
}

async fn wait_stored(database: &str, voucher: i64, accepted: &[i64]) {
    let db = Database::connect(database).await.unwrap();
    let want: HashSet<i64> = accepted.iter().copied().collect();
    let stored = testkit::eventually(Duration::from_secs(30), || async {
        let stored: HashSet<i64> = db.order_ids(voucher).await.unwrap().into_iter().collect();
        want.is_subset(&stored)
    })
    .await;
    assert!(stored, "accepted orders not stored");
}

/// Service 19: on `rediss://` the fast path, its pipeline and order life,
/// and the locked path (its per-user locks are a hasp client over TLS too)
/// sell, store and change orders as on plain TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_sells_on_a_redis_that_speaks_tls_only() {
    let ca = Ca::new("server");
    let redis = RedisServer::start_with(ServerOptions {
        transport: Transport::Tcp,
        tls: Some(ca.ca.server_options(false)),
        ..ServerOptions::default()
    });
    assert!(redis.url().starts_with("rediss://"));
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    for mode in [Mode::Async, Mode::Sync] {
        let database = format!("sqlite://{}/{mode:?}.db", ca.dir.display());
        let service = Service::start(Settings {
            redis_tls: ca.trust(),
            mode,
            ..support::settings(redis.url(), &database, SECRET)
        })
        .await
        .unwrap();
        let base = format!("http://{}", service.addr());
        let (voucher, accepted) = sell(&http, &base, &tokens, 20).await;
        wait_stored(&database, voucher, &accepted).await;
        let pay = http
            .post(format!("{base}/api/orders/{}/pay", accepted[0]))
            .bearer_auth(tokens.mint(Principal::User(1), Duration::from_secs(60)))
            .header("Idempotency-Key", "tls-pay-1")
            .send()
            .await
            .unwrap();
        assert_eq!(pay.status(), StatusCode::OK, "{mode:?}");
        let cancel = http
            .post(format!("{base}/api/orders/{}/cancel", accepted[1]))
            .bearer_auth(tokens.mint(Principal::User(2), Duration::from_secs(60)))
            .send()
            .await
            .unwrap();
        assert_eq!(cancel.status(), StatusCode::OK, "{mode:?}");
        let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), StatusCode::OK);
        service.stop().await.unwrap();
    }
}

/// Service 19: without the CA the same service does not start on a
/// `rediss://` Redis whose certificate the system does not trust, and
/// says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_stops_the_start_and_says_why() {
    let ca = Ca::new("untrusted");
    let redis = RedisServer::start_with(ServerOptions {
        transport: Transport::Tcp,
        tls: Some(ca.ca.server_options(false)),
        ..ServerOptions::default()
    });
    let database = format!("sqlite://{}/shop.db", ca.dir.display());
    let started = tokio::time::timeout(
        Duration::from_secs(30),
        Service::start(support::settings(redis.url(), &database, SECRET)),
    )
    .await
    .expect("the start hung");
    let error = format!(
        "{:#}",
        started.expect_err("started on an untrusted certificate")
    );
    assert!(error.contains("UnknownIssuer"), "{error}");
}

/// Service 19: on `rediss+sentinel://` the service follows a failover,
/// TLS to the sentinels and to each master, and every accepted order is
/// stored. Every server's certificate names only `redis.sentinel.test`,
/// not the addresses the sentinels announce: the service verifies each by
/// the name its settings give (`redis_tls_server_name`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_follows_a_failover_over_tls() {
    let ca = Ca::new("sentinel");
    let options = ca
        .ca
        .issue_server_options("named", &["redis.sentinel.test"], false)
        .unwrap();
    let group = SentinelGroup::start_with_tls(1, 3, Some(options));
    let hosts: Vec<String> = group
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("rediss://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!(
        "{SENTINEL_TLS_SCHEME}{}/{SENTINEL_SERVICE}",
        hosts.join(",")
    );
    let database = format!("sqlite://{}/shop.db", ca.dir.display());
    let service = Service::start(Settings {
        redis_tls: RedisTls {
            server_name: Some("redis.sentinel.test".to_owned()),
            ..ca.trust()
        },
        ..support::settings(url, &database, SECRET)
    })
    .await
    .unwrap();
    let base = format!("http://{}", service.addr());
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let (voucher, mut accepted) = sell(&http, &base, &tokens, 10).await;
    tokio::task::block_in_place(|| group.failover());
    // Purchases are accepted again on the new master, and until then (and
    // while the former master is demoted) every answer is a 503.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut user = 1_000;
    let resumed = loop {
        user += 1;
        let r = support::purchase(&http, &base, &tokens, voucher, user).await;
        if r.status() == StatusCode::OK {
            let body: Value = r.json().await.unwrap();
            break Some(body["order_id"].as_str().unwrap().parse().unwrap());
        }
        assert_eq!(
            r.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "while the master moves"
        );
        if std::time::Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    accepted.push(resumed.expect("no purchase accepted after the failover"));
    wait_stored(&database, voucher, &accepted).await;
    service.stop().await.unwrap();
}

/// Service 19: on `rediss+cluster://` (TLS to every node and between
/// them) the service sells and stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_sells_on_a_cluster_that_speaks_tls_only() {
    let ca = Ca::new("cluster");
    let cluster =
        testkit::RedisCluster::try_start_with_tls(3, 0, Some(ca.ca.server_options(false))).unwrap();
    let nodes: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("rediss://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("{}{}", seckill::store::CLUSTER_TLS_SCHEME, nodes.join(","));
    let database = format!("sqlite://{}/shop.db", ca.dir.display());
    let (service, base) = ca.serve(url, &database).await;
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let (voucher, accepted) = sell(&http, &base, &tokens, 10).await;
    wait_stored(&database, voucher, &accepted).await;
    service.stop().await.unwrap();
}

/// Service 19: the database over TLS. PostgreSQL and MariaDB that accept
/// TLS only on TCP (`hostnossl … reject`, `require_secure_transport`),
/// reached with `sslmode=verify-full` / `ssl-mode=VERIFY_IDENTITY` and the
/// private CA in the URL: the service migrates, sells and stores; the same
/// server asked without TLS refuses, and the start says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_stores_orders_in_a_database_that_speaks_tls_only() {
    let ca = Ca::new("database");
    let redis = RedisServer::start();
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let postgres = testkit::PostgresServer::try_start_with_tls(&ca.ca).unwrap();
    let mariadb = testkit::MariaDbServer::start_with_tls(&ca.ca);
    let databases = [
        (
            "PostgreSQL",
            postgres.tls_url().unwrap(),
            postgres.plain_tcp_url().unwrap(),
        ),
        (
            "MariaDB",
            mariadb.tls_url().unwrap(),
            mariadb.plain_tcp_url().unwrap(),
        ),
    ];
    for (i, (name, tls_url, plain_url)) in databases.iter().enumerate() {
        let settings = Settings {
            prefix: format!("db-tls-{i}"),
            ..support::settings(redis.url(), tls_url, SECRET)
        };
        let service = Service::start(settings).await.unwrap();
        let base = format!("http://{}", service.addr());
        let (voucher, accepted) = sell(&http, &base, &tokens, 20).await;
        wait_stored(tls_url, voucher, &accepted).await;
        service.stop().await.unwrap();

        let refused = tokio::time::timeout(
            Duration::from_secs(30),
            Service::start(Settings {
                prefix: format!("db-plain-{i}"),
                ..support::settings(redis.url(), plain_url, SECRET)
            }),
        )
        .await
        .expect("the start hung");
        let error = format!(
            "{:#}",
            refused.expect_err("started on a database connection without TLS")
        );
        // PostgreSQL names the cause ("no pg_hba.conf entry … no
        // encryption"); MariaDB, under require_secure_transport, answers a
        // client without TLS "Access denied" (the credentials that just
        // worked over TLS).
        let why = if *name == "PostgreSQL" {
            "no encryption"
        } else {
            "Access denied"
        };
        assert!(error.contains(why), "{name}: {error}");
    }

    // A CA that did not sign the server's certificate: refused.
    let other = ca.ca.another().unwrap();
    let untrusted = databases[0].1.replace(
        &ca.ca.ca_file().display().to_string(),
        &other.ca_file().display().to_string(),
    );
    let refused = Service::start(Settings {
        prefix: "db-untrusted".into(),
        ..support::settings(redis.url(), untrusted, SECRET)
    })
    .await;
    let error = format!(
        "{:#}",
        refused.expect_err("started on an untrusted certificate")
    );
    assert!(error.contains("UnknownIssuer"), "{error}");
}
