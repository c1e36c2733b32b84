//! The order pipeline against a real redis-server and a real SQLite file.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use seckill::db::Database;
use seckill::domain::order::OrderState;
use seckill::domain::purchase::Purchase;
use seckill::domain::voucher::{SaleTerms, Title};
use seckill::pipeline::{OrderPipeline, PipelineSettings, StepReport};
use seckill::store::RedisConn;
use seckill::store::{FastPath, OrderIdGenerator, VoucherKeys};
use testkit::RedisServer;

struct Sale {
    server: RedisServer,
    db: Database,
    fast: Arc<FastPath>,
    voucher: i64,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn conn(server: &RedisServer) -> RedisConn {
    seckill::store::connect(&server.url()).await.unwrap()
}

/// A voucher with `stock` in both the database and Redis.
async fn sale(stock: i64) -> Sale {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "seckill-pipeline-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let db = Database::connect(&format!("sqlite://{}/orders.db", dir.display()))
        .await
        .unwrap();
    db.migrate().await.unwrap();
    let now = SystemTime::now();
    let terms = SaleTerms::new(
        stock,
        now - Duration::from_secs(60),
        now + Duration::from_secs(3600),
    )
    .unwrap();
    let voucher = db
        .create_voucher(&Title::parse("Half-price hotpot").unwrap(), &terms)
        .await
        .unwrap();
    let server = RedisServer::start();
    let c = conn(&server).await;
    let fast = FastPath::new(
        seckill::store::Redis::new(c.clone(), "seckill"),
        OrderIdGenerator::new(seckill::store::Redis::new(c, "seckill"), 100).unwrap(),
    );
    fast.load_voucher(voucher, &terms).await.unwrap();
    fast.arm(voucher).await.unwrap();
    Sale {
        server,
        db,
        fast: Arc::new(fast),
        voucher,
        _dir: TempDir(dir),
    }
}

async fn pipeline(sale: &Sale, consumer: &str, reclaim_idle: Duration) -> OrderPipeline {
    let mut settings = PipelineSettings::new(consumer);
    settings.reclaim_idle = reclaim_idle;
    settings.max_deliveries = 3;
    let p = OrderPipeline::new(
        seckill::store::Redis::new(conn(&sale.server).await, "seckill"),
        sale.db.clone(),
        settings,
    )
    .unwrap();
    p.ensure_group(sale.voucher).await.unwrap();
    p
}

async fn buy(sale: &Sale, users: std::ops::Range<i64>) -> Vec<i64> {
    let mut accepted = Vec::new();
    for user in users {
        if let Purchase::Accepted(id) = sale.fast.purchase(sale.voucher, user).await.unwrap() {
            accepted.push(id.as_i64());
        }
    }
    accepted
}

async fn drain(p: &OrderPipeline, voucher: i64) -> StepReport {
    let mut total = StepReport::default();
    loop {
        let r = p.step(voucher).await.unwrap();
        if r.handled() == 0 && r.reclaimed == 0 {
            return total;
        }
        total.created += r.created;
        total.already_stored += r.already_stored;
        total.dead_lettered += r.dead_lettered;
        total.reclaimed += r.reclaimed;
    }
}

async fn stream_state(sale: &Sale) -> (i64, i64) {
    let keys = VoucherKeys::new("seckill", sale.voucher);
    let mut c = conn(&sale.server).await;
    let len: i64 = redis::cmd("XLEN")
        .arg(&keys.orders)
        .query_async(&mut c)
        .await
        .unwrap();
    let pending: (i64, Option<String>, Option<String>, redis::Value) = redis::cmd("XPENDING")
        .arg(&keys.orders)
        .arg("orders")
        .query_async(&mut c)
        .await
        .unwrap();
    (len, pending.0)
}

#[tokio::test]
async fn every_accepted_order_reaches_the_database_once_and_the_stream_empties() {
    let sale = sale(50).await;
    let accepted = buy(&sale, 0..80).await;
    assert_eq!(accepted.len(), 50);
    let p = pipeline(&sale, "instance-a", Duration::from_secs(30)).await;
    let report = drain(&p, sale.voucher).await;
    assert_eq!(report.created, 50);
    assert_eq!(report.dead_lettered, 0);
    assert_eq!(sale.db.order_count(sale.voucher).await.unwrap(), 50);
    assert_eq!(sale.db.voucher_stock(sale.voucher).await.unwrap(), Some(0));
    assert_eq!(
        sale.fast.remaining_stock(sale.voucher).await.unwrap(),
        Some(0)
    );
    assert_eq!(
        stream_state(&sale).await,
        (0, 0),
        "stream trimmed, nothing pending"
    );
    // Creating the group again (another instance starting) is harmless.
    p.ensure_group(sale.voucher).await.unwrap();
}

#[tokio::test]
async fn orders_left_by_a_dead_consumer_are_taken_over_and_stored_exactly_once() {
    let sale = sale(20).await;
    let accepted = buy(&sale, 0..20).await;
    assert_eq!(accepted.len(), 20);
    // Consumer "a" reads everything, stores half, then dies before any ack.
    let a = pipeline(&sale, "a", Duration::from_secs(30)).await;
    let keys = VoucherKeys::new("seckill", sale.voucher);
    let mut c = conn(&sale.server).await;
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("orders")
        .arg("a")
        .arg("COUNT")
        .arg(100)
        .arg("STREAMS")
        .arg(&keys.orders)
        .arg(">")
        .query_async(&mut c)
        .await
        .unwrap();
    let entries = &read.keys[0].ids;
    assert_eq!(entries.len(), 20);
    for e in entries.iter().take(10) {
        let order = seckill::db::OrderRecord {
            id: seckill::OrderId::from_i64(e.get("order").unwrap()).unwrap(),
            user_id: e.get("user").unwrap(),
            voucher_id: e.get("voucher").unwrap(),
            created_ms: 0,
        };
        sale.db.record_order(&order).await.unwrap();
    }
    drop(a);

    // Consumer "b" leaves them alone while "a" might still be working...
    let b = pipeline(&sale, "b", Duration::from_millis(300)).await;
    assert_eq!(b.step(sale.voucher).await.unwrap(), StepReport::default());
    // ...and takes them over once they have been idle long enough.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = drain(&b, sale.voucher).await;
    assert_eq!(report.reclaimed, 20);
    assert_eq!((report.created, report.already_stored), (10, 10));
    assert_eq!(sale.db.order_count(sale.voucher).await.unwrap(), 20);
    assert_eq!(sale.db.voucher_stock(sale.voucher).await.unwrap(), Some(0));
    assert_eq!(stream_state(&sale).await, (0, 0));
}

#[tokio::test]
async fn entries_that_cannot_succeed_or_keep_failing_are_dead_lettered_and_counted() {
    let sale = sale(5).await;
    let keys = VoucherKeys::new("seckill", sale.voucher);
    let mut c = conn(&sale.server).await;
    let p = pipeline(&sale, "p", Duration::from_millis(200)).await;
    // Malformed, and an order for a voucher the database does not know.
    let _: String = redis::cmd("XADD")
        .arg(&keys.orders)
        .arg("*")
        .arg("junk")
        .arg("1")
        .query_async(&mut c)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&keys.orders)
        .arg("*")
        .arg("order")
        .arg(1i64 << 32)
        .arg("user")
        .arg(9)
        .arg("voucher")
        .arg(999_999)
        .query_async(&mut c)
        .await
        .unwrap();
    let report = p.step(sale.voucher).await.unwrap();
    assert_eq!(report.dead_lettered, 2);

    // An entry a dying consumer keeps taking: past 3 deliveries it is dead.
    buy(&sale, 0..1).await;
    for consumer in ["x", "y", "z"] {
        let _: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("orders")
            .arg(consumer)
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg(&keys.orders)
            .arg(if consumer == "x" { ">" } else { "0" })
            .query_async(&mut c)
            .await
            .unwrap();
        let _: redis::Value = redis::cmd("XAUTOCLAIM")
            .arg(&keys.orders)
            .arg("orders")
            .arg(consumer)
            .arg(0)
            .arg("0-0")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = p.step(sale.voucher).await.unwrap();
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(p.dead_letters(), 3);
    // Its buyer reads `failed` in one lookup, no stream scanned
    // (the order-of and failed hashes).
    let scans = || sale.server.cli(&["INFO", "commandstats"]);
    let calls = |stats: &str, cmd: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|r| r.split(',').next())
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    let before = scans();
    let status = seckill::store::order_in_redis(
        &seckill::store::Redis::new(c.clone(), "seckill"),
        sale.voucher,
        0,
    )
    .await
    .unwrap();
    assert!(
        matches!(status, Some((_, OrderState::Failed))),
        "{status:?}"
    );
    let after = scans();
    for scan in ["xrange", "xrevrange"] {
        assert_eq!(calls(&before, scan), calls(&after, scan), "{scan}");
    }
    let dead: i64 = redis::cmd("XLEN")
        .arg(p.dead_letter_stream())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(dead, 3);
    assert_eq!(sale.db.order_count(sale.voucher).await.unwrap(), 0);
    assert_eq!(stream_state(&sale).await, (0, 0));
}

#[tokio::test]
async fn reconcile_sees_agreement_mid_pipeline_and_repairs_what_is_safe() {
    use seckill::reconcile::{reconcile, repair};
    let sale = sale(10).await;
    buy(&sale, 0..6).await;
    let store = seckill::store::Redis::new(conn(&sale.server).await, "seckill");
    // Orders still in the stream count as on their way: consistent.
    let before = reconcile(&store, &sale.db, sale.voucher).await.unwrap();
    assert!(before.is_consistent(), "{:?}", before.differences());
    assert_eq!(
        (before.in_stream, before.db_orders, before.redis_buyers),
        (6, 0, 6)
    );
    let p = pipeline(&sale, "p", Duration::from_secs(30)).await;
    drain(&p, sale.voucher).await;
    let after = reconcile(&store, &sale.db, sale.voucher).await.unwrap();
    assert!(after.is_consistent(), "{:?}", after.differences());
    assert_eq!((after.redis_stock, after.db_stock), (Some(4), Some(4)));

    // Break it three ways.
    let keys = VoucherKeys::new("seckill", sale.voucher);
    let mut raw = conn(&sale.server).await;
    let _: i64 = redis::cmd("SREM")
        .arg(&keys.buyers)
        .arg(3)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: i64 = redis::cmd("SADD")
        .arg(&keys.buyers)
        .arg(77)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: i64 = redis::cmd("HSET")
        .arg(&keys.voucher)
        .arg("stock")
        .arg(9)
        .query_async(&mut raw)
        .await
        .unwrap();
    let broken = reconcile(&store, &sale.db, sale.voucher).await.unwrap();
    assert_eq!(broken.missing_buyers, vec![3]);
    assert_eq!(broken.lost_orders, vec![77]);
    assert_eq!(
        (broken.redis_stock, broken.expected_redis_stock),
        (Some(9), Some(4))
    );
    assert_eq!(broken.differences().len(), 3);

    assert_eq!(repair(&store, &broken).await.unwrap(), 2);
    let repaired = reconcile(&store, &sale.db, sale.voucher).await.unwrap();
    assert!(repaired.missing_buyers.is_empty());
    assert_eq!(repaired.redis_stock, Some(4));
    assert_eq!(
        repaired.lost_orders,
        vec![77],
        "a lost order is for a person to decide"
    );
    // User 3 cannot buy again now that the set is repaired.
    assert_eq!(
        sale.fast.purchase(sale.voucher, 3).await.unwrap(),
        Purchase::Refused(seckill::domain::purchase::Refusal::AlreadyBought)
    );
}

/// A stream id names an entry on one server only: after a Sentinel switch
/// the new master numbers its entries from the same last id as the master
/// left behind. Entries read on the master left behind (a reader still
/// there when the switch came) and acknowledged on the new one must not
/// delete the new master's entry under the same id, another buyer's
/// accepted order (`docs/guarantees.md`, service 7): both orders are
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_read_on_a_master_left_behind_never_acknowledges_another_order() {
    let sale = sale(10).await;
    let p = pipeline(&sale, "a", Duration::from_secs(30)).await;
    let keys = VoucherKeys::new("seckill", sale.voucher);
    // The new master's accepted order (sale.server).
    let kept = buy(&sale, 2..3).await;
    assert_eq!(kept.len(), 1);
    let mut new_master = conn(&sale.server).await;
    let ids: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&keys.orders)
        .arg("-")
        .arg("+")
        .query_async(&mut new_master)
        .await
        .unwrap();
    let id = ids.ids[0].id.clone();
    // The master left behind holds another order under the same id.
    let left = RedisServer::start();
    let mut left_conn = conn(&left).await;
    let other_order = kept[0] + 1;
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&keys.orders)
        .arg("orders")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut left_conn)
        .await
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&keys.orders)
        .arg(&id)
        .arg("order")
        .arg(other_order)
        .arg("user")
        .arg(1)
        .arg("voucher")
        .arg(sale.voucher)
        .query_async(&mut left_conn)
        .await
        .unwrap();

    // Read there, stored, acknowledged through the pipeline's connection
    // (the new master).
    let report = p
        .step_blocking(&mut left_conn, &[sale.voucher], Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(report.created, 1);
    assert_eq!(
        stream_state(&sale).await.0,
        1,
        "the new master's entry under the same id is still there"
    );
    let report = drain(&p, sale.voucher).await;
    assert_eq!(report.created, 1);
    let mut stored = sale.db.order_ids(sale.voucher).await.unwrap();
    stored.sort_unstable();
    assert_eq!(stored, vec![kept[0], other_order]);
    assert_eq!(stream_state(&sale).await.0, 0);
}
