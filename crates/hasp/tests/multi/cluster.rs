//! A client of a Redis Cluster (multi 17–19; multi 21 is the spec suite
//! run with `HASP_SPEC_DEPLOYMENT=cluster`, see `tests/spec/main.rs`).

use std::time::{Duration, Instant};

use hasp::{Client, Owner};
use testkit::RedisCluster;

use crate::helpers::{lock_key, quick};

async fn cluster_client(cluster: &RedisCluster) -> Client {
    cluster_client_with_lease(cluster, Duration::from_millis(1_500)).await
}

/// As [`cluster_client`], with a watchdog timeout of `lease`.
async fn cluster_client_with_lease(cluster: &RedisCluster, lease: Duration) -> Client {
    testkit::logs();
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    Client::open_cluster(&urls, quick().set_watchdog_timeout(lease))
        .await
        .expect("open a cluster client")
}

/// The slot of a lock named `name` (that of its hash tag).
fn slot_of(cluster: &RedisCluster, name: &str) -> u16 {
    cluster.nodes[0]
        .cli(&["CLUSTER", "KEYSLOT", &lock_key(name)])
        .parse()
        .unwrap()
}

/// multi 17: a client made from seed nodes locks names spread over every
/// master; each lock's keys live on the master of its slot; operations of
/// many tasks at once (many slots) all complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_spread_over_every_master() {
    let cluster = RedisCluster::start(3);
    let client = cluster_client(&cluster).await;
    let names: Vec<String> = (0..60).map(|i| format!("spread-{i}")).collect();
    let guards = futures_util::future::join_all(names.iter().map(|name| {
        let lock = client.lock(name).unwrap();
        async move { lock.lock().await.unwrap() }
    }))
    .await;
    // Held past two leases: renewed on every master.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let mut masters = std::collections::HashSet::new();
    for name in &names {
        let master = cluster.master_of(slot_of(&cluster, name));
        assert_eq!(master.cli(&["EXISTS", &lock_key(name)]), "1", "{name}");
        masters.insert(master.port());
    }
    assert_eq!(masters.len(), 3, "60 names should touch every master");
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    for name in &names {
        let master = cluster.master_of(slot_of(&cluster, name));
        assert_eq!(master.cli(&["EXISTS", &lock_key(name)]), "0");
    }
}

/// multi 18: waiting is woken by sharded release messages (`SPUBLISH` /
/// `SSUBSCRIBE`) on the shard of the lock, for locks on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_through_sharded_pubsub() {
    let cluster = RedisCluster::start(3);
    let holder = cluster_client(&cluster).await;
    let waiter = cluster_client(&cluster).await;
    for name in ["w-a", "w-b", "w-c", "w-d", "w-e", "w-f"] {
        let held = holder.lock(name).unwrap().lock().await.unwrap();
        let lock = waiter.lock(name).unwrap();
        let waiting = tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let at = Instant::now();
            guard.unlock().await.unwrap();
            at
        });
        let channel = format!("{}:released", lock_key(name));
        let master = cluster.master_of(slot_of(&cluster, name));
        assert!(
            testkit::eventually(Duration::from_secs(3), || async {
                master
                    .cli(&["PUBSUB", "SHARDNUMSUB", &channel])
                    .ends_with('1')
            })
            .await,
            "no sharded subscription for {name}"
        );
        let released = Instant::now();
        held.unlock().await.unwrap();
        let woken = waiting.await.unwrap().duration_since(released);
        // The holder's lease is 1.5 s: only the message wakes it this soon.
        assert!(
            woken < Duration::from_millis(700),
            "{name}: woken {woken:?} later"
        );
    }
}

/// multi 19: a lock held and waited on while its slot migrates to another
/// master keeps working: it is renewed there, released there (waking the
/// waiter, whose sharded subscription moved with the slot), and taken again
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_moves_the_lock_with_it() {
    let cluster = RedisCluster::start(3);
    let client = cluster_client(&cluster).await;
    let other = cluster_client(&cluster).await;
    let lock = client.lock("moving").unwrap();
    let guard = lock.lock().await.unwrap();
    let waiter = {
        let lock = other.lock("moving").unwrap();
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let at = Instant::now();
            guard.unlock().await.unwrap();
            at
        })
    };
    let slot = slot_of(&cluster, "moving");
    let from = cluster.master_of(slot).port().unwrap();
    let channel = format!("{}:released", lock_key("moving"));
    assert!(
        testkit::eventually(Duration::from_secs(3), || async {
            cluster
                .node(from)
                .cli(&["PUBSUB", "SHARDNUMSUB", &channel])
                .ends_with('1')
        })
        .await,
        "the waiter never subscribed"
    );
    let to = cluster
        .nodes
        .iter()
        .filter_map(|n| n.port())
        .find(|p| *p != from)
        .unwrap();
    cluster.migrate_slot(slot, to);
    assert_eq!(cluster.master_of(slot).port(), Some(to));
    assert!(
        testkit::eventually(Duration::from_secs(3), || async {
            cluster
                .node(to)
                .cli(&["PUBSUB", "SHARDNUMSUB", &channel])
                .ends_with('1')
        })
        .await,
        "the waiter's subscription did not follow the slot"
    );
    assert_eq!(cluster.node(to).cli(&["EXISTS", &lock_key("moving")]), "1");
    tokio::time::sleep(Duration::from_millis(2_500)).await; // over a lease: renewed on the new master
    assert!(!guard.is_lost(), "the lock was lost in the migration");
    assert!(!waiter.is_finished(), "the waiter got a lock that was held");
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let woken = waiter.await.unwrap().duration_since(released);
    // Woken by the release message on the new node (the subscription
    // followed the slot), not by its own retry at the holder's TTL.
    assert!(
        woken < Duration::from_millis(300),
        "woken {woken:?} after the release"
    );
    assert_eq!(cluster.node(to).cli(&["EXISTS", &lock_key("moving")]), "0");
    let again = lock
        .try_lock()
        .await
        .unwrap()
        .expect("free after the release");
    assert_eq!(cluster.node(to).cli(&["EXISTS", &lock_key("moving")]), "1");
    again.unlock().await.unwrap();
}

/// multi 19: after a master failover inside the cluster (`CLUSTER FAILOVER`
/// on its replica), locks keep working, a replicated hold stays held, and
/// a hold the new master lacks (what an asynchronous replica can miss) is
/// detected by its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_inside_the_cluster_keeps_locks_working() {
    let cluster = RedisCluster::start_with_replicas(3, 1);
    // A lease that outlasts a manual failover on a loaded machine (the old
    // master holds writes back until its replica has caught up): a hold
    // whose renewals cannot be confirmed for a whole lease is lost, and
    // rightly so, but that is not what this test is about.
    let lease = Duration::from_secs(4);
    let client = cluster_client_with_lease(&cluster, lease).await;
    let lock = client.lock("fo").unwrap();
    let guard = lock.lock().await.unwrap();
    let slot = slot_of(&cluster, "fo");
    let master = cluster.master_of(slot);
    // A second lock on the same master.
    let doomed = (0..)
        .map(|i| format!("fo-{i}"))
        .find(|n| cluster.master_of(slot_of(&cluster, n)).port() == master.port())
        .unwrap();
    let doomed_guard = client.lock(&doomed).unwrap().lock().await.unwrap();
    assert_eq!(master.cli(&["WAIT", "1", "2000"]), "1");
    let master_port = master.port().unwrap();
    let replica = cluster
        .nodes
        .iter()
        .find(|n| {
            n.cli(&["ROLE"]).starts_with("slave")
                && n.cli(&["INFO", "replication"])
                    .contains(&format!("master_port:{master_port}"))
        })
        .expect("the master's replica");
    assert!(replica.cli(&["CLUSTER", "FAILOVER"]).contains("OK"));
    let promoted = replica.port();
    assert!(
        testkit::eventually(Duration::from_secs(10), || async {
            cluster.master_of(slot).port() == promoted
        })
        .await,
        "the replica was not promoted"
    );
    cluster.master_of(slot).cli(&["DEL", &lock_key(&doomed)]);
    tokio::time::timeout(lease + Duration::from_secs(1), doomed_guard.lost())
        .await
        .expect("the holder did not learn that the new master lacks its lock");
    assert!(matches!(
        doomed_guard.unlock().await,
        Err(hasp::Error::NotHeld { .. })
    ));
    tokio::time::sleep(lease + Duration::from_millis(500)).await; // renewed on the new master
    assert!(
        !guard.is_lost(),
        "a replicated hold was lost in the failover"
    );
    guard.unlock().await.unwrap();
    let again = lock
        .try_lock()
        .await
        .unwrap()
        .expect("free after the release");
    assert_eq!(
        cluster.master_of(slot).cli(&["EXISTS", &lock_key("fo")]),
        "1"
    );
    again.unlock().await.unwrap();
}

/// multi 17: batches are grouped per node: holding 3,000 locks spread over
/// the three masters costs about one renewal call per 100 locks per node
/// and period (one call per lock would be 3,000), like one server's 30.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_batched_per_node() {
    let cluster = RedisCluster::start(3);
    let urls = cluster.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let period = Duration::from_millis(400);
    let client = Client::open_cluster(&urls, quick().set_watchdog_timeout(period * 3))
        .await
        .unwrap();
    let owner = Owner::new();
    let mut guards = Vec::new();
    for chunk in 0..30 {
        let batch = futures_util::future::join_all((0..100).map(|i| {
            let lock = client
                .lock(&format!("many-{chunk}-{i}"))
                .unwrap()
                .with_owner(owner.clone());
            async move { lock.lock().await.unwrap() }
        }))
        .await;
        guards.extend(batch);
    }
    let before = client.stats().renew_calls;
    tokio::time::sleep(period * 5).await;
    let calls = client.stats().renew_calls - before;
    assert!(guards.iter().all(|g| !g.is_lost()));
    // Five periods × 30 batches × at most 3 nodes each, with slack for a
    // round split by timing.
    assert!(calls <= 5 * 30 * 3 + 60, "{calls} renewal calls");
    assert!(calls >= 5 * 30, "{calls} renewal calls: renewals missing?");
    drop(guards);
}

/// multi 17 and 18, lock 35: a cluster that speaks TLS only, between its
/// nodes too: a client of `rediss://` seeds, trusting a private CA, locks
/// on every master and its waiters are woken through sharded pub/sub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_locks_on_every_master_and_wakes_waiters() {
    let dir = std::env::temp_dir().join(format!("hasp-cluster-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = testkit::TestCa::create(&dir).unwrap();
    let cluster = RedisCluster::try_start_with_tls(3, 0, Some(ca.server_options(false))).unwrap();
    let urls = cluster.urls();
    assert!(urls[0].starts_with("rediss://"), "{urls:?}");
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let settings = quick().set_tls(hasp::Tls::new().with_ca_file(ca.ca_file()).unwrap());
    let holder = Client::open_cluster(&urls, settings.clone()).await.unwrap();
    let waiter = Client::open_cluster(&urls, settings).await.unwrap();
    let names: Vec<String> = (0..30).map(|i| format!("tls-{i}")).collect();
    let guards = futures_util::future::join_all(names.iter().map(|name| {
        let lock = holder.lock(name).unwrap();
        async move { lock.lock().await.unwrap() }
    }))
    .await;
    let masters: std::collections::HashSet<_> = names
        .iter()
        .map(|name| cluster.master_of(slot_of(&cluster, name)).port())
        .collect();
    assert_eq!(masters.len(), 3, "30 names should touch every master");
    let waits: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = waiter.lock(name).unwrap();
            tokio::spawn(async move { lock.lock_within(Duration::from_secs(10)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await; // the waiters subscribe
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    for wait in waits {
        wait.await.unwrap().unwrap().unlock().await.unwrap();
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
}
