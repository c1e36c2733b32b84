//! An order's life after the purchase (`docs/guarantees.md`, service 8 to
//! 13): payment, cancellation and expiry decided by the database row, and
//! every given-back unit on sale again exactly once in both stores, against
//! a real redis-server and a real SQLite file.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use seckill::db::{Database, GiveBack, StateCounts, Transition};
use seckill::domain::money::{Currency, Money};
use seckill::domain::order::{OrderRecord, OrderState};
use seckill::domain::purchase::{Purchase, Refusal};
use seckill::domain::voucher::{Offer, SaleTerms, Title};
use seckill::metrics::Metrics;
use seckill::order_life::OrderLife;
use seckill::payments::StandIn;
use seckill::reconcile::reconcile;
use seckill::repair::{SaleRepair, Scope};
use seckill::store::{FastPath, OrderIdGenerator, TakeBack};
use testkit::RedisServer;

struct Sale {
    redis: RedisServer,
    db: Database,
    fast: Arc<FastPath>,
    life: OrderLife,
    payments: Arc<StandIn>,
    voucher: i64,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cny() -> Currency {
    Currency::parse("currency", "CNY").unwrap()
}

/// Every test sale's price: 19.90 CNY.
fn price() -> Money {
    Money::new("price", 1990, cny()).unwrap()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A voucher of `stock` units on sale in the database and in Redis, whose
/// buyers have `pay_within` to pay.
async fn sale(stock: i64, pay_within: Duration, rebuy: bool) -> Sale {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "seckill-order-life-{}-{}",
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
    .unwrap()
    .with_pay_within(pay_within)
    .unwrap()
    .with_rebuy_after_cancel(rebuy);
    let offer = Offer::priced(price(), Money::new("face", 5000, cny()).unwrap(), false).unwrap();
    let voucher = db
        .publish_voucher(&Title::parse("Hotpot, pay soon").unwrap(), &offer, &terms)
        .await
        .unwrap();
    let redis = RedisServer::start();
    let conn = seckill::store::connect(&redis.url()).await.unwrap();
    let fast = Arc::new(FastPath::new(
        seckill::store::Redis::new(conn.clone(), "shop"),
        OrderIdGenerator::new(seckill::store::Redis::new(conn, "shop"), 100).unwrap(),
    ));
    fast.load_voucher(voucher, &terms).await.unwrap();
    fast.arm(voucher).await.unwrap();
    let payments = Arc::new(StandIn::default());
    let life = OrderLife::new(
        db.clone(),
        Some(fast.clone()),
        payments.clone(),
        Metrics::new().unwrap(),
    );
    Sale {
        redis,
        db,
        fast,
        life,
        payments,
        voucher,
        _dir: TempDir(dir),
    }
}

impl Sale {
    /// `user` buys in Redis and the order is stored (as the pipeline
    /// would); its id.
    async fn buy_and_store(&self, user: i64) -> i64 {
        let Purchase::Accepted(id) = self.fast.purchase(self.voucher, user).await.unwrap() else {
            panic!("user {user} could not buy");
        };
        let order = OrderRecord {
            id,
            user_id: user,
            voucher_id: self.voucher,
            created_ms: now_ms(),
        };
        let recorded = self.db.record_order(&order).await.unwrap();
        assert_eq!(recorded, seckill::db::Recorded::Created);
        id.as_i64()
    }

    async fn redis_stock(&self) -> i64 {
        self.fast
            .remaining_stock(self.voucher)
            .await
            .unwrap()
            .unwrap()
    }

    async fn db_stock(&self) -> i64 {
        self.db.voucher_stock(self.voucher).await.unwrap().unwrap()
    }

    /// Both stores agree (nothing in flight: every order is stored).
    async fn assert_consistent(&self) {
        let found = reconcile(self.fast.redis(), &self.db, self.voucher)
            .await
            .unwrap();
        assert!(found.is_consistent(), "{:?}", found.differences());
    }
}

fn state(t: &Transition) -> Option<OrderState> {
    match t {
        Transition::Done(o)
        | Transition::Already(o)
        | Transition::Refused(o)
        | Transition::Pending(o) => Some(o.state),
        Transition::NotFound => None,
    }
}

/// Service 10: a give-back committed in the database whose Redis step was
/// cut short (a crash between the two) is finished by the sweep, once; a
/// take-back repeated changes nothing; a cancellation does both at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_back_unit_comes_back_once_whatever_repeats_or_crashes() {
    let sale = sale(3, Duration::from_secs(600), true).await;
    let orders = [
        sale.buy_and_store(1).await,
        sale.buy_and_store(2).await,
        sale.buy_and_store(3).await,
    ];
    assert_eq!((sale.redis_stock().await, sale.db_stock().await), (0, 0));
    assert_eq!(
        sale.fast.purchase(sale.voucher, 4).await.unwrap(),
        Purchase::Refused(Refusal::SoldOut)
    );

    // The database gives order 1 back; the process dies before Redis hears.
    let (cancelled, returned) = sale
        .db
        .give_back(orders[0], Some(1), GiveBack::Cancel)
        .await
        .unwrap();
    assert_eq!(state(&cancelled), Some(OrderState::Cancelled));
    assert!(returned.is_some());
    assert_eq!((sale.redis_stock().await, sale.db_stock().await), (0, 1));
    sale.assert_consistent().await; // a pending return is no difference
    let report = sale.life.sweep().await.unwrap();
    assert_eq!((report.expired, report.taken_back), (0, 1));
    assert_eq!(sale.redis_stock().await, 1);
    assert!(sale.db.due_orders(10).await.unwrap().is_empty());
    assert_eq!(sale.life.sweep().await.unwrap().taken_back, 0);
    let again = sale
        .fast
        .take_back(sale.voucher, 1, orders[0])
        .await
        .unwrap();
    assert_eq!(again, TakeBack::Already);
    assert_eq!(sale.redis_stock().await, 1);

    // A cancellation through the order life does both; repeated, nothing.
    let first = sale.life.cancel(orders[1], 2).await.unwrap();
    assert!(matches!(first, Transition::Done(_)), "{first:?}");
    let second = sale.life.cancel(orders[1], 2).await.unwrap();
    assert!(matches!(second, Transition::Already(_)), "{second:?}");
    assert_eq!((sale.redis_stock().await, sale.db_stock().await), (2, 2));
    sale.assert_consistent().await;

    // Both units sell again, once each: to a buyer who cancelled (allowed
    // by default) and to a new one; then the sale is sold out again.
    sale.buy_and_store(1).await;
    sale.buy_and_store(4).await;
    assert_eq!(
        sale.fast.purchase(sale.voucher, 5).await.unwrap(),
        Purchase::Refused(Refusal::SoldOut)
    );
    assert_eq!((sale.redis_stock().await, sale.db_stock().await), (0, 0));
    sale.assert_consistent().await;
    assert_eq!(
        sale.db.order_states(sale.voucher).await.unwrap(),
        StateCounts {
            reserved: 3,
            paid: 0,
            cancelled: 2,
            expired: 0,
            // The cancelled orders let go of their buyers' claims.
            claims: 3,
            ..Default::default()
        }
    );
}

/// Service 8 and 10: orders not paid within the window expire in the
/// sweep's batches (by the database's clock), each unit comes back once and
/// sells again; a paid order never expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpaid_orders_expire_in_batches_and_every_unit_sells_again() {
    const UNITS: i64 = 230; // more than two of the sweep's batches
    let sale = sale(UNITS, Duration::from_millis(300), true).await;
    let mut orders = vec![sale.buy_and_store(1).await];
    // One buyer pays in time.
    let paid = sale.life.pay(orders[0], 1, "pay-1").await.unwrap();
    assert!(matches!(paid, Transition::Done(_)), "{paid:?}");
    for user in 2..=UNITS {
        orders.push(sale.buy_and_store(user).await);
    }
    let expired = testkit::eventually(Duration::from_secs(30), || async {
        sale.life.sweep().await.unwrap();
        sale.db.order_states(sale.voucher).await.unwrap()
            == StateCounts {
                reserved: 0,
                paid: 1,
                cancelled: 0,
                expired: UNITS - 1,
                claims: 1,
                ..Default::default()
            }
    })
    .await;
    assert!(
        expired,
        "{:?}",
        sale.db.order_states(sale.voucher).await.unwrap()
    );
    assert_eq!(
        (sale.redis_stock().await, sale.db_stock().await),
        (UNITS - 1, UNITS - 1)
    );
    sale.assert_consistent().await;
    // A late payment is refused; the charge is voided.
    let late = sale.life.pay(orders[1], 2, "pay-2").await.unwrap();
    assert_eq!(state(&late), Some(OrderState::Expired));
    assert!(matches!(late, Transition::Refused(_)));
    assert_eq!(
        sale.payments.counts(),
        (1, 0),
        "no charge for an expired order"
    );
    // Every unit sells again, once.
    for user in UNITS + 1..2 * UNITS {
        sale.buy_and_store(user).await;
    }
    assert_eq!(
        sale.fast.purchase(sale.voucher, 3 * UNITS).await.unwrap(),
        Purchase::Refused(Refusal::SoldOut)
    );
    assert_eq!((sale.redis_stock().await, sale.db_stock().await), (0, 0));
}

/// Service 8: payments, cancellations and the sweep racing on the same
/// orders past their deadline: each order ends in one state, and the
/// stock accounts for every unit (stock = available + reserved + paid, no
/// unit taken back twice). Shop 3: the money adds up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_payments_cancellations_and_expiry_leave_each_order_one_state() {
    const UNITS: i64 = 60;
    let sale = sale(UNITS, Duration::from_millis(200), true).await;
    let mut orders = Vec::new();
    for user in 1..=UNITS {
        orders.push((user, sale.buy_and_store(user).await));
    }
    let life = &sale.life;
    let races = orders.iter().map(|&(user, id)| async move {
        let key = format!("key-{user}");
        // Around the deadline: some pay before it, some after.
        tokio::time::sleep(Duration::from_millis(3 * user as u64)).await;
        let (pay, cancel, sweep) = tokio::join!(
            life.pay(id, user, &key),
            life.cancel(id, user),
            life.sweep()
        );
        sweep.unwrap();
        let (pay, cancel) = (pay.unwrap(), cancel.unwrap());
        // At most one of them changed the order.
        assert!(
            !(matches!(pay, Transition::Done(_)) && matches!(cancel, Transition::Done(_))),
            "paid and cancelled: {pay:?} {cancel:?}"
        );
    });
    futures_util::future::join_all(races).await;
    let swept = testkit::eventually(Duration::from_secs(30), || async {
        sale.life.sweep().await.unwrap();
        sale.db.due_orders(1).await.unwrap().is_empty()
            && sale.db.order_states(sale.voucher).await.unwrap().reserved == 0
    })
    .await;
    assert!(swept, "orders left due");
    let StateCounts {
        reserved,
        paid,
        cancelled,
        expired,
        ..
    } = sale.db.order_states(sale.voucher).await.unwrap();
    assert_eq!(reserved + paid + cancelled + expired, UNITS);
    let available = sale.db_stock().await;
    assert_eq!(
        available,
        cancelled + expired,
        "a unit lost or given back twice"
    );
    assert_eq!(sale.redis_stock().await, available);
    let (charges, voids) = sale.payments.counts();
    assert_eq!(
        charges - voids,
        paid as u64,
        "a paid order without its charge"
    );
    // Shop 3: the money the provider kept is what the paid orders add up
    // to, each at its voucher's price.
    let kept = sale.payments.ledger()[&cny()].kept_minor();
    assert_eq!(kept, paid * price().minor());
    let revenue = sale.db.revenue(sale.voucher).await.unwrap();
    assert_eq!(revenue.get(&cny()).copied().unwrap_or(0), kept);
    sale.assert_consistent().await;
}

/// Service 11: a voucher that does not let a buyer buy again keeps the
/// buyer's claim when their order is given back, in both stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rebuy_a_buyer_whose_order_was_given_back_cannot_buy_again() {
    let sale = sale(2, Duration::from_secs(600), false).await;
    let order = sale.buy_and_store(1).await;
    assert!(matches!(
        sale.life.cancel(order, 1).await.unwrap(),
        Transition::Done(_)
    ));
    assert_eq!(
        sale.fast.purchase(sale.voucher, 1).await.unwrap(),
        Purchase::Refused(Refusal::AlreadyBought)
    );
    let again = OrderRecord {
        id: seckill::OrderId::compose(99, 1).unwrap(),
        user_id: 1,
        voucher_id: sale.voucher,
        created_ms: now_ms(),
    };
    assert_eq!(
        sale.db.record_order(&again).await.unwrap(),
        seckill::db::Recorded::UserAlreadyOrdered
    );
    sale.buy_and_store(2).await;
    sale.buy_and_store(3).await;
    assert_eq!((sale.redis_stock().await, sale.db_stock().await), (0, 0));
    sale.assert_consistent().await;
}

/// Service 13: Redis loses the sale after units came back, one of them
/// not yet taken back in Redis: the repair restores the stock with every
/// given-back unit once, and the sweep does not add it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_restored_after_returns_counts_each_returned_unit_once() {
    let sale = sale(3, Duration::from_secs(600), true).await;
    let first = sale.buy_and_store(1).await;
    let second = sale.buy_and_store(2).await;
    sale.buy_and_store(3).await;
    sale.life.cancel(first, 1).await.unwrap();
    // The second's Redis step never happens before Redis loses everything.
    sale.db
        .give_back(second, Some(2), GiveBack::Cancel)
        .await
        .unwrap();
    sale.redis.cli(&["FLUSHALL"]);
    let locks = seckill::store::lock_client(
        &sale.redis.url(),
        &seckill::store::RedisTls::default(),
        hasp::Settings::default(),
    )
    .await
    .unwrap();
    let repair = SaleRepair::new(sale.fast.clone(), sale.db.clone(), locks, None);
    let report = repair.run(Scope::Voucher(sale.voucher)).await.unwrap();
    assert_eq!(report.restored, 1);
    assert_eq!((sale.redis_stock().await, sale.db_stock().await), (2, 2));
    let swept = sale.life.sweep().await.unwrap();
    assert_eq!(swept.taken_back, 1, "the pending return is finished");
    assert_eq!(sale.redis_stock().await, 2, "and not taken back twice");
    sale.assert_consistent().await;
    let buyers: HashSet<i64> = [4, 5, 6].into_iter().collect();
    let mut sold = 0;
    for user in buyers {
        if matches!(
            sale.fast.purchase(sale.voucher, user).await.unwrap(),
            Purchase::Accepted(_)
        ) {
            sold += 1;
        }
    }
    assert_eq!(sold, 2);
}

/// Service 12: with 10,000 reserved orders none of which is due, the
/// service's expiry sweep sends Redis nothing (its lock is taken only once
/// an order is due), and its one query reads the deadline index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sweep_reads_one_index_and_sends_redis_nothing() {
    use sqlx::Connection;
    const ORDERS: u32 = 10_000;
    let sale = sale(i64::from(ORDERS) + 1, Duration::from_secs(3600), true).await;
    let now = now_ms();
    let orders: Vec<OrderRecord> = (1..=ORDERS)
        .map(|seq| OrderRecord {
            id: seckill::OrderId::compose(50, seq).unwrap(),
            user_id: i64::from(seq),
            voucher_id: sale.voucher,
            created_ms: now,
        })
        .collect();
    for chunk in orders.chunks(500) {
        for outcome in sale.db.record_orders(chunk).await {
            assert_eq!(outcome.unwrap(), seckill::db::Recorded::Created);
        }
    }
    let database = format!("sqlite://{}/orders.db", sale._dir.0.display());
    let service = seckill::service::Service::start(seckill::settings::Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        sweep_every: Duration::from_millis(50),
        prefix: "shop".into(),
        ..seckill::settings::Settings::new(sale.redis.url(), &database, "idle-sweep-secret-0001")
    })
    .await
    .unwrap();
    let calls = |command: &str| -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        sale.redis
            .cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let locking = || calls("set") + calls("evalsha") + calls("fcall") + calls("eval");
    // The service verifies the sale state it finds (the purchase script
    // was loaded without recording what it was verified for): measured
    // once that is done.
    let settled = testkit::eventually(Duration::from_secs(30), || async {
        let mark = sale.redis.cli(&["GET", "shop:verified-history"]);
        let purchase = redis::Script::new(include_str!("../src/scripts/purchase.lua"));
        let armed = sale.redis.cli(&["SCRIPT", "EXISTS", purchase.get_hash()]);
        !mark.trim().is_empty() && armed.trim() == "1"
    })
    .await;
    assert!(settled, "the service never verified the sale state");
    let before = locking();
    // Time is the subject: at least 20 sweep periods.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(locking(), before, "the idle sweep sent Redis a command");

    let plan_of = |sql: &'static str| {
        let url = format!("{database}?mode=ro");
        async move {
            let mut conn = sqlx::sqlite::SqliteConnection::connect(&url).await.unwrap();
            let rows: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(sql).fetch_all(&mut conn).await.unwrap();
            rows.into_iter().map(|r| r.3).collect::<Vec<_>>().join("; ")
        }
    };
    let plan = plan_of(
        "EXPLAIN QUERY PLAN SELECT id FROM voucher_order WHERE due_ms <= 5 ORDER BY due_ms LIMIT 100",
    )
    .await;
    assert!(
        plan.contains("voucher_order_due"),
        "the due query scans: {plan}"
    );

    // One order due: the sweep takes its lock and expires it.
    let late = OrderRecord {
        id: seckill::OrderId::compose(51, 1).unwrap(),
        user_id: i64::from(ORDERS) + 1,
        voucher_id: sale.voucher,
        created_ms: now - 3_700_000,
    };
    sale.db.record_order(&late).await.unwrap();
    let expired = testkit::eventually(Duration::from_secs(30), || async {
        let order = sale.db.order(late.id.as_i64()).await.unwrap().unwrap();
        order.state == OrderState::Expired
    })
    .await;
    assert!(expired, "the due order expires");
    assert!(locking() > before, "the sweep took its lock");
    service.stop().await.unwrap();
}

/// Shop 5, 6: refunds racing with redemptions of the same paid orders:
/// each order ends used or refunded, never both; a refunded unit comes
/// back on sale once, in both stores; a refund cut short after it was
/// recorded (a crash before the provider was asked) is finished by the
/// sweep, once; and the provider keeps what the paid and used orders cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_and_redemptions_race_and_the_money_adds_up() {
    const UNITS: i64 = 30;
    let sale = sale(UNITS, Duration::from_secs(600), true).await;
    let mut orders = Vec::new();
    for user in 1..=UNITS {
        let id = sale.buy_and_store(user).await;
        let paid = sale
            .life
            .pay(id, user, &format!("pay-{user}"))
            .await
            .unwrap();
        let Transition::Done(paid) = paid else {
            panic!("{paid:?}")
        };
        orders.push((user, id, paid.redeem_code.expect("a paid order has a code")));
    }
    let life = &sale.life;
    let races = orders.iter().map(|(user, id, code)| async move {
        let key = format!("refund-{user}");
        let (refund, redeem) = tokio::join!(life.refund(*id, *user, &key), life.redeem(code));
        let (refund, redeem) = (refund.unwrap(), redeem.unwrap());
        let refunded = matches!(refund, Transition::Done(_));
        let used = matches!(redeem, Transition::Done(_));
        assert!(refunded != used, "{refund:?} {redeem:?}");
        // Asked again: the same answer, nothing changes.
        let again = life.refund(*id, *user, &key).await.unwrap();
        assert_eq!(
            state(&again),
            Some(if used {
                OrderState::Used
            } else {
                OrderState::Refunded
            })
        );
    });
    futures_util::future::join_all(races).await;
    let counts = sale.db.order_states(sale.voucher).await.unwrap();
    assert_eq!(counts.used + counts.refunded, UNITS, "{counts:?}");
    assert_eq!(
        counts.refunded_returned, counts.refunded,
        "the sale is open: units come back"
    );
    assert_eq!(
        (sale.db_stock().await, sale.redis_stock().await),
        (counts.refunded, counts.refunded),
        "a refunded unit back once in both stores"
    );
    sale.assert_consistent().await;

    // A refund recorded, then the instance crashed before the provider
    // was asked: the sweep finishes it.
    let user = 100;
    let id = sale.buy_and_store(user).await;
    assert!(matches!(
        sale.life.pay(id, user, "pay").await.unwrap(),
        Transition::Done(_)
    ));
    let (started, _) = sale.db.start_refund(id, user, "cut-short").await.unwrap();
    assert_eq!(state(&started), Some(OrderState::Refunding));
    let refunds_before = sale.payments.ledger()[&cny()].refunds;
    let stock_before = sale.redis_stock().await;
    let report = sale.life.sweep().await.unwrap();
    assert_eq!(report.refunds_finished, 1, "{report:?}");
    assert_eq!(
        sale.redis_stock().await,
        stock_before + 1,
        "its unit back in Redis"
    );
    assert_eq!(
        sale.life.sweep().await.unwrap().refunds_finished,
        0,
        "finished once"
    );
    let order = sale.db.order(id).await.unwrap().unwrap();
    assert_eq!((order.state, order.returned), (OrderState::Refunded, true));
    assert_eq!(sale.payments.ledger()[&cny()].refunds, refunds_before + 1);
    sale.assert_consistent().await;

    // The money: kept = what the paid and used orders cost.
    let totals = sale.payments.ledger()[&cny()];
    let revenue = sale.db.revenue(sale.voucher).await.unwrap();
    assert_eq!(
        revenue.get(&cny()).copied().unwrap_or(0),
        totals.kept_minor()
    );
    assert_eq!(totals.kept_minor(), counts.used * price().minor());
    assert_eq!(totals.refunds as i64, counts.refunded + 1);
}
