//! The Redis fast path and order ids, against a real redis-server.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use seckill::domain::purchase::{Purchase, Refusal};
use seckill::domain::voucher::SaleTerms;
use seckill::store::RedisConn;
use seckill::store::{FastPath, OrderIdGenerator, VoucherKeys};
use testkit::RedisServer;

async fn conn(server: &RedisServer) -> RedisConn {
    seckill::store::connect(&server.url()).await.unwrap()
}

/// One service instance's view: its own connection and id generator, on a
/// Redis with nothing to verify (the purchase script loaded at once).
async fn instance(server: &RedisServer) -> FastPath {
    let conn = conn(server).await;
    let ids =
        OrderIdGenerator::new(seckill::store::Redis::new(conn.clone(), "seckill"), 100).unwrap();
    let path = FastPath::new(seckill::store::Redis::new(conn, "seckill"), ids);
    path.arm(0).await.unwrap();
    path
}

fn open_sale(stock: i64) -> SaleTerms {
    let now = SystemTime::now();
    SaleTerms::new(
        stock,
        now - Duration::from_secs(60),
        now + Duration::from_secs(3600),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_purchases_never_oversell_and_give_one_order_per_user() {
    const STOCK: i64 = 100;
    const USERS: i64 = 1_500;
    let server = RedisServer::start();
    let a = Arc::new(instance(&server).await);
    let b = Arc::new(instance(&server).await);
    a.load_voucher(7, &open_sale(STOCK)).await.unwrap();

    // Every user asks twice, once through each instance, all at once.
    let mut calls = Vec::new();
    for user in 0..USERS {
        for path in [&a, &b] {
            let path = path.clone();
            calls.push(tokio::spawn(async move {
                (user, path.purchase(7, user).await.unwrap())
            }));
        }
    }
    let mut accepted = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            (user, Purchase::Accepted(id)) => accepted.push((user, id)),
            (_, Purchase::Refused(Refusal::SoldOut | Refusal::AlreadyBought)) => {}
            (_, other) => panic!("unexpected outcome {other:?}"),
        }
    }
    // No oversell, and no undersell while buyers remained.
    assert_eq!(accepted.len() as i64, STOCK);
    let users: HashSet<i64> = accepted.iter().map(|(u, _)| *u).collect();
    assert_eq!(users.len() as i64, STOCK, "a user got two orders");
    assert_eq!(a.remaining_stock(7).await.unwrap(), Some(0));

    let keys = VoucherKeys::new("seckill", 7);
    let mut raw = conn(&server).await;
    let buyers: i64 = redis::cmd("SCARD")
        .arg(&keys.buyers)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(buyers, STOCK);
    // Every accepted order, and only those, is in the stream.
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&keys.orders)
        .arg("-")
        .arg("+")
        .query_async(&mut raw)
        .await
        .unwrap();
    let streamed: HashSet<i64> = entries
        .ids
        .iter()
        .map(|e| e.get::<i64>("order").unwrap())
        .collect();
    let ids: HashSet<i64> = accepted.iter().map(|(_, id)| id.as_i64()).collect();
    assert_eq!(streamed, ids);
}

#[tokio::test]
async fn refusals_for_the_sale_window_and_unknown_vouchers_change_nothing() {
    let server = RedisServer::start();
    let path = instance(&server).await;
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    path.load_voucher(1, &SaleTerms::new(5, now + hour, now + 2 * hour).unwrap())
        .await
        .unwrap();
    path.load_voucher(2, &SaleTerms::new(5, now - 2 * hour, now - hour).unwrap())
        .await
        .unwrap();
    assert_eq!(
        path.purchase(1, 9).await.unwrap(),
        Purchase::Refused(Refusal::NotStarted)
    );
    assert_eq!(
        path.purchase(2, 9).await.unwrap(),
        Purchase::Refused(Refusal::Ended)
    );
    assert_eq!(
        path.purchase(3, 9).await.unwrap(),
        Purchase::Refused(Refusal::UnknownVoucher)
    );
    assert_eq!(path.remaining_stock(1).await.unwrap(), Some(5));
    assert_eq!(path.remaining_stock(2).await.unwrap(), Some(5));
    assert_eq!(path.remaining_stock(3).await.unwrap(), None);
    let mut raw = conn(&server).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*buyers*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(keys.is_empty(), "a refusal recorded a buyer: {keys:?}");

    path.load_voucher(4, &open_sale(1)).await.unwrap();
    assert!(matches!(
        path.purchase(4, 1).await.unwrap(),
        Purchase::Accepted(_)
    ));
    assert_eq!(
        path.purchase(4, 1).await.unwrap(),
        Purchase::Refused(Refusal::AlreadyBought)
    );
    assert_eq!(
        path.purchase(4, 2).await.unwrap(),
        Purchase::Refused(Refusal::SoldOut)
    );
}

#[tokio::test]
async fn reloading_a_voucher_keeps_its_live_stock() {
    let server = RedisServer::start();
    let path = instance(&server).await;
    path.load_voucher(5, &open_sale(3)).await.unwrap();
    assert!(matches!(
        path.purchase(5, 1).await.unwrap(),
        Purchase::Accepted(_)
    ));
    path.load_voucher(5, &open_sale(3)).await.unwrap(); // e.g. after a restart
    assert_eq!(path.remaining_stock(5).await.unwrap(), Some(2));
}

async fn incrby_calls(raw: &mut RedisConn) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_incrby:calls="))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_ids_are_unique_across_instances_and_restarts_and_cost_one_call_per_block() {
    const PER_GENERATOR: usize = 5_000;
    const BLOCK: u32 = 100;
    let server = RedisServer::start();
    let mut raw = conn(&server).await;
    let mut all = HashSet::new();
    // Two instances at once, then a "restarted" instance.
    for round in 0..2 {
        let generators: Vec<_> = (0..if round == 0 { 2 } else { 1 })
            .map(|_| {
                let server_url = server.url();
                tokio::spawn(async move {
                    let c = seckill::store::connect(&server_url).await.unwrap();
                    let generator = Arc::new(
                        OrderIdGenerator::new(seckill::store::Redis::new(c, "seckill"), BLOCK)
                            .unwrap(),
                    );
                    let tasks: Vec<_> = (0..PER_GENERATOR)
                        .map(|_| {
                            let g = generator.clone();
                            tokio::spawn(async move { g.next_id().await.unwrap() })
                        })
                        .collect();
                    let mut ids = Vec::new();
                    for t in tasks {
                        ids.push(t.await.unwrap());
                    }
                    ids
                })
            })
            .collect();
        for g in generators {
            for id in g.await.unwrap() {
                assert!(id.as_i64() > 0);
                assert!(all.insert(id), "duplicate order id {id}");
            }
        }
    }
    assert_eq!(all.len(), 3 * PER_GENERATOR);
    let calls = incrby_calls(&mut raw).await;
    assert_eq!(
        calls as usize,
        3 * PER_GENERATOR / BLOCK as usize,
        "one INCRBY per block"
    );
    assert!(OrderIdGenerator::new(seckill::store::Redis::new(raw, "seckill"), 0).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_outlasts_a_redis_stall_shorter_than_the_response_timeout() {
    // redis-rs' own default (500 ms) would turn this stall into an error for
    // a purchase that then happens anyway.
    let server = RedisServer::start();
    let shop = Arc::new(instance(&server).await);
    shop.load_voucher(3, &open_sale(5)).await.unwrap();
    shop.purchase(3, 1).await.unwrap(); // ids and scripts warm
    server.pause();
    let buying = tokio::spawn({
        let shop = shop.clone();
        async move { shop.purchase(3, 2).await }
    });
    // The stall is the subject: it must outlast the old default.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!buying.is_finished(), "the purchase did not wait for Redis");
    server.resume();
    let outcome = buying.await.unwrap().expect("no error after a 1.5 s stall");
    assert!(matches!(outcome, Purchase::Accepted(_)), "{outcome:?}");
    assert!(seckill::store::RESPONSE_TIMEOUT > Duration::from_millis(1_500));
}

/// The fast path on a 3-master Redis Cluster (`redis+cluster://`): vouchers
/// spread over the masters by their hash tags, each sells exactly its stock,
/// one order per user, and the remaining stocks read across slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_vouchers_spread_and_never_oversell() {
    const STOCK: i64 = 20;
    const USERS: i64 = 200;
    let cluster = testkit::RedisCluster::start(3);
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .filter_map(|n| n.port())
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!("{}{}", seckill::store::CLUSTER_SCHEME, nodes.join(","));
    let conn = seckill::store::connect(&url).await.unwrap();
    assert!(matches!(conn, RedisConn::Cluster(_)));
    let ids =
        OrderIdGenerator::new(seckill::store::Redis::new(conn.clone(), "seckill"), 100).unwrap();
    let path = Arc::new(FastPath::new(
        seckill::store::Redis::new(conn, "seckill"),
        ids,
    ));
    let vouchers: Vec<i64> = (1..=6).collect();
    for v in &vouchers {
        path.load_voucher(*v, &open_sale(STOCK)).await.unwrap();
        path.arm(*v).await.unwrap(); // on each voucher's node
    }
    let mut masters = HashSet::new();
    for v in &vouchers {
        let key = VoucherKeys::new("seckill", *v).voucher;
        let slot: u16 = cluster.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", &key])
            .parse()
            .unwrap();
        masters.insert(cluster.master_of(slot).port());
    }
    assert!(
        masters.len() >= 2,
        "six vouchers should use several masters"
    );

    let mut calls = Vec::new();
    for v in vouchers.clone() {
        for user in 0..USERS {
            let path = path.clone();
            calls.push(tokio::spawn(async move {
                (v, user, path.purchase(v, user).await.unwrap())
            }));
        }
    }
    let mut accepted = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            (v, user, Purchase::Accepted(id)) => accepted.push((v, user, id.as_i64())),
            (_, _, Purchase::Refused(Refusal::SoldOut)) => {}
            (_, _, other) => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(accepted.len() as i64, STOCK * vouchers.len() as i64);
    let orders: HashSet<i64> = accepted.iter().map(|(_, _, id)| *id).collect();
    assert_eq!(orders.len(), accepted.len(), "order ids repeat");
    for v in &vouchers {
        let sold = accepted.iter().filter(|(w, _, _)| w == v).count() as i64;
        assert_eq!(sold, STOCK, "voucher {v}");
    }
    let left = path.remaining_stocks(&vouchers).await.unwrap();
    assert!(left.iter().all(|s| *s == Some(0)), "{left:?}");
}

/// Redis losing the day's counter (restart without data) does not
/// make ids repeat, even for an instance still using a block it took
/// before the loss: the counter starts again at the day's time floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_ids_stay_unique_when_redis_loses_the_sequence() {
    let server = RedisServer::start();
    let before = OrderIdGenerator::new(
        seckill::store::Redis::new(conn(&server).await, "seckill"),
        1_000,
    )
    .unwrap();
    let after = OrderIdGenerator::new(
        seckill::store::Redis::new(conn(&server).await, "seckill"),
        1_000,
    )
    .unwrap();
    let mut all = HashSet::new();
    all.insert(before.next_id().await.unwrap()); // takes a block of 1,000
    server.cli(&["FLUSHALL"]);
    // The floor moves 49,710 a second: 100 ms puts it past that block (a
    // real restart takes far longer).
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..3_000 {
        assert!(all.insert(after.next_id().await.unwrap()), "repeated id");
    }
    for _ in 0..999 {
        assert!(all.insert(before.next_id().await.unwrap()), "repeated id");
    }
}

/// With replica confirmation on, `accepted`
/// means a replica has the order; a replica that does not confirm in time
/// makes the purchase `NotReplicated` (it stands on the primary: an
/// unknown outcome for the buyer), not `Accepted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_replica_ack_accepted_means_a_replica_has_the_order() {
    use seckill::store::ReplicaAck;
    let primary = RedisServer::start_tcp();
    let replica = RedisServer::start_replica_of(&primary);
    let conn = conn(&primary).await;
    let ack = ReplicaAck {
        replicas: 1,
        timeout: Duration::from_millis(200),
    };
    let path = FastPath::new(
        seckill::store::Redis::new(conn.clone(), "seckill"),
        OrderIdGenerator::new(seckill::store::Redis::new(conn.clone(), "seckill"), 100).unwrap(),
    )
    .with_replica_ack(ack, conn.clone())
    .unwrap();
    path.load_voucher(1, &open_sale(10)).await.unwrap();
    // Armed without a recorded verification: no server and history to tie
    // a confirmation to, so none counts.
    path.arm(0).await.unwrap();
    assert!(matches!(
        path.purchase(1, 100).await,
        Err(seckill::Error::NotReplicated { acked: 0, .. })
    ));
    let history = path.history().await.unwrap();
    path.arm_all(history.as_ref()).await.unwrap();
    assert!(matches!(
        path.purchase(1, 1).await.unwrap(),
        Purchase::Accepted(_)
    ));
    let key = VoucherKeys::new("seckill", 1);
    assert_eq!(
        replica.cli(&["XLEN", &key.orders]),
        "2",
        "the replica has both"
    );

    replica.pause();
    let unconfirmed = path.purchase(1, 2).await;
    replica.resume();
    assert!(
        matches!(
            unconfirmed,
            Err(seckill::Error::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{unconfirmed:?}"
    );
    assert_eq!(
        primary.cli(&["XLEN", &key.orders]),
        "3",
        "they stand on the primary"
    );
    // A refusal is answered as it is: it changed nothing to confirm.
    assert_eq!(
        path.purchase(1, 1).await.unwrap(),
        Purchase::Refused(Refusal::AlreadyBought)
    );

    let bad = |replicas, ms| {
        FastPath::new(
            seckill::store::Redis::new(conn.clone(), "seckill"),
            OrderIdGenerator::new(seckill::store::Redis::new(conn.clone(), "seckill"), 1).unwrap(),
        )
        .with_replica_ack(
            ReplicaAck {
                replicas,
                timeout: Duration::from_millis(ms),
            },
            conn.clone(),
        )
        .is_err()
    };
    assert!(bad(0, 100) && bad(1, 0));
}

/// Replica confirmation counts only on the master that took the purchase
/// (`docs/guarantees.md`, service 7): a confirmation asked on another
/// server, whose replica does acknowledge (as the new master's does once
/// the master left behind follows it), does not confirm a purchase made
/// on the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_from_another_master_does_not_count() {
    use seckill::store::ReplicaAck;
    let took = RedisServer::start_tcp();
    let _its_replica = RedisServer::start_replica_of(&took);
    let other = RedisServer::start_tcp();
    let _other_replica = RedisServer::start_replica_of(&other);
    let ack = ReplicaAck {
        replicas: 1,
        timeout: Duration::from_secs(2),
    };
    let on = |server: &RedisServer| {
        let url = server.url();
        async move { seckill::store::connect(&url).await.unwrap() }
    };
    let main = on(&took).await;
    let path = FastPath::new(
        seckill::store::Redis::new(main.clone(), "seckill"),
        OrderIdGenerator::new(seckill::store::Redis::new(main, "seckill"), 100).unwrap(),
    )
    .with_replica_ack(ack, on(&other).await)
    .unwrap();
    let history = path.history().await.unwrap();
    path.arm_all(history.as_ref()).await.unwrap();
    path.load_voucher(1, &open_sale(10)).await.unwrap();
    // The other master's replica acknowledges everything asked there.
    let confirmed_there = redis::cmd("WAIT")
        .arg(1)
        .arg(2_000)
        .query_async::<u32>(&mut on(&other).await)
        .await
        .unwrap();
    assert_eq!(confirmed_there, 1);
    let answer = path.purchase(1, 1).await;
    assert!(
        matches!(
            answer,
            Err(seckill::Error::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{answer:?}"
    );
    assert_eq!(
        took.cli(&["XLEN", &VoucherKeys::new("seckill", 1).orders]),
        "1",
        "it stands on the master that took it"
    );
}
