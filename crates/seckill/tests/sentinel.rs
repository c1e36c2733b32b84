//! The service on a Sentinel service: its Redis connection, its locks and
//! its pipeline follow a failover to the new master.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seckill::auth::Tokens;
use seckill::db::Database;
use seckill::service::Service;
use seckill::settings::Settings;
use seckill::store::{ReplicaAck, SENTINEL_SCHEME};
use serde_json::Value;
use testkit::{SentinelGroup, SENTINEL_SERVICE};

const SECRET: &str = "sentinel-test-secret-001";

/// Purchases keep coming while Sentinel moves the master to a replica: the
/// service answers each 200 or 503 (never another 5xx), every order it
/// accepted is stored, no order is stored that was not accepted or left
/// with an unknown outcome (a 503), and purchases are accepted again on
/// the new master. With replica acknowledgement on, as the README's
/// production advice has it: Sentinel does not stop the old master's
/// writes while it promotes the replica, and orders the old master takes
/// then are lost when it is demoted (without acknowledgement, 6 of 2,614
/// accepted orders in one run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_sentinel_follows_a_failover_under_load() {
    let group = SentinelGroup::start(1, 3);
    let hosts: Vec<String> = group
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("{SENTINEL_SCHEME}{}/{SENTINEL_SERVICE}", hosts.join(","));
    let dir = std::env::temp_dir().join(format!("seckill-sentinel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let database = format!("sqlite://{}/shop.db", dir.display());
    let service = Service::start(Settings {
        replica_ack: Some(ReplicaAck {
            replicas: 1,
            timeout: Duration::from_millis(100),
        }),
        ..support::settings(url, &database, SECRET)
    })
    .await
    .unwrap();
    let base = format!("http://{}", service.addr());
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let voucher = support::open_voucher(&http, &base, &tokens, "Failover sale", 1_000_000).await;

    // Load: 8 buyers at a time, each request from a new user.
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicBool::new(false));
    let next_user = Arc::new(AtomicI64::new(1));
    // user -> (status, order id if accepted, sent after the move)
    let outcomes = Arc::new(Mutex::new(HashMap::new()));
    let buyers: Vec<_> = (0..8)
        .map(|_| {
            let (http, base, tokens) = (http.clone(), base.clone(), tokens.clone());
            let (stop, moved, next_user, outcomes) = (
                stop.clone(),
                moved.clone(),
                next_user.clone(),
                outcomes.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Acquire) {
                    let user = next_user.fetch_add(1, Ordering::Relaxed);
                    let after = moved.load(Ordering::Acquire);
                    let r = support::purchase(&http, &base, &tokens, voucher, user).await;
                    let status = r.status().as_u16();
                    let body: Value = r.json().await.unwrap_or(Value::Null);
                    let order = body["order_id"]
                        .as_str()
                        .and_then(|id| id.parse::<i64>().ok());
                    outcomes
                        .lock()
                        .unwrap()
                        .insert(user, (status, order, after, body));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old = group.master_port();
    let new = tokio::task::block_in_place(|| group.failover());
    assert_ne!(old, new);
    moved.store(true, Ordering::Release);
    // Load goes on until purchases have been accepted on the new master for
    // a while (bounded: a service that never follows fails here).
    let followed = testkit::eventually(Duration::from_secs(30), || async {
        outcomes
            .lock()
            .unwrap()
            .values()
            .filter(|(status, _, after, _)| *status == 200 && *after)
            .count()
            >= 100
    })
    .await;
    stop.store(true, Ordering::Release);
    for buyer in buyers {
        buyer.await.unwrap();
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    let count = |f: &dyn Fn(u16) -> bool| outcomes.values().filter(|o| f(o.0)).count();
    println!(
        "figure: failover under load: {} requests, {} accepted, {} 503, {} accepted after the move",
        outcomes.len(),
        count(&|s| s == 200),
        count(&|s| s == 503),
        outcomes
            .values()
            .filter(|(status, _, after, _)| *status == 200 && *after)
            .count(),
    );
    assert!(followed, "no purchase was accepted on the new master");
    for (user, (status, _, _, body)) in &outcomes {
        assert!(
            *status == 200 || *status == 503,
            "user {user}: {status} {body}"
        );
    }
    let codes: std::collections::BTreeMap<String, usize> = outcomes
        .values()
        .filter(|o| o.0 == 503)
        .fold(Default::default(), |mut codes, o| {
            *codes.entry(o.3["code"].to_string()).or_default() += 1;
            codes
        });
    println!("figure: 503s by code: {codes:?}");

    // Every accepted order reaches the database; nothing else does but
    // orders whose answer was a 503 (an unknown outcome).
    let accepted: HashSet<i64> = outcomes.values().filter_map(|o| o.1).collect();
    let unknown: HashSet<i64> = outcomes
        .iter()
        .filter(|(_, o)| o.0 == 503)
        .map(|(user, _)| *user)
        .collect();
    let db = Database::connect(&database).await.unwrap();
    let drained = testkit::eventually(Duration::from_secs(60), || async {
        let stored: HashSet<i64> = db.order_ids(voucher).await.unwrap().into_iter().collect();
        accepted.is_subset(&stored)
    })
    .await;
    let stored: HashSet<i64> = db.order_ids(voucher).await.unwrap().into_iter().collect();
    let lost = accepted.difference(&stored).count();
    assert!(drained, "{lost} accepted orders never stored");
    for (order, user) in db.voucher_orders(voucher).await.unwrap() {
        assert!(
            accepted.contains(&order) || unknown.contains(&user),
            "order {order} of user {user} stored, but never accepted"
        );
    }
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
