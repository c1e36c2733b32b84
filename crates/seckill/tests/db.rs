//! The SQL layer on each supported backend: SQLite (a file), and private
//! PostgreSQL and MariaDB servers started by the test.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use seckill::db::{Backend, Database, OrderRecord, Recorded, StateCounts};
use seckill::domain::voucher::{SaleTerms, Title};
use seckill::OrderId;
use testkit::{MariaDbServer, PostgresServer};

/// Runs `scenario` against a fresh database of every backend.
async fn on_every_backend<F, Fut>(scenario: F)
where
    F: Fn(Database) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = std::env::temp_dir().join(format!(
        "seckill-db-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let sqlite = Database::connect(&format!("sqlite://{}/test.db", dir.display()))
        .await
        .unwrap();
    assert_eq!(sqlite.backend(), Backend::Sqlite);
    scenario(sqlite).await;
    let _ = std::fs::remove_dir_all(&dir);

    let pg = PostgresServer::start();
    let db = Database::connect(&pg.url()).await.unwrap();
    assert_eq!(db.backend(), Backend::Postgres);
    scenario(db).await;

    let maria = MariaDbServer::start();
    let db = Database::connect(&maria.url()).await.unwrap();
    assert_eq!(db.backend(), Backend::MySql);
    scenario(db).await;
}

fn terms(stock: i64) -> SaleTerms {
    let now = SystemTime::now();
    SaleTerms::new(stock, now, now + Duration::from_secs(3600)).unwrap()
}

fn order(seq: u32, user_id: i64, voucher_id: i64) -> OrderRecord {
    OrderRecord {
        id: OrderId::compose(1_000, seq).unwrap(),
        user_id,
        voucher_id,
        created_ms: 1,
    }
}

#[tokio::test]
async fn every_outcome_is_decided_by_the_constraints_on_every_backend() {
    on_every_backend(|db| async move {
        db.migrate().await.unwrap();
        db.migrate().await.unwrap(); // idempotent
        let v = db
            .create_voucher(&Title::parse("火锅 Hotpot").unwrap(), &terms(2))
            .await
            .unwrap();
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(2));
        assert_eq!(
            db.record_order(&order(1, 10, v)).await.unwrap(),
            Recorded::Created
        );
        assert_eq!(
            db.record_order(&order(1, 10, v)).await.unwrap(),
            Recorded::AlreadyStored
        );
        assert_eq!(
            db.record_order(&order(2, 10, v)).await.unwrap(),
            Recorded::UserAlreadyOrdered
        );
        assert_eq!(
            db.record_order(&order(3, 11, v)).await.unwrap(),
            Recorded::Created
        );
        assert_eq!(
            db.record_order(&order(4, 12, v)).await.unwrap(),
            Recorded::OutOfStock
        );
        assert_eq!(
            db.record_order(&order(5, 12, v + 1000)).await.unwrap(),
            Recorded::UnknownVoucher
        );
        // Refusals changed nothing.
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(0));
        assert_eq!(db.order_count(v).await.unwrap(), 2);
        // Any title the rule accepts is stored as sent, on every backend.
        assert_eq!(db.voucher(v).await.unwrap().unwrap().title, "火锅 Hotpot");
    })
    .await;
}

#[tokio::test]
async fn a_batch_commits_once_or_gives_each_order_its_own_outcome_on_every_backend() {
    on_every_backend(|db| async move {
        db.migrate().await.unwrap();
        let v = db
            .create_voucher(&Title::parse("Batch").unwrap(), &terms(4))
            .await
            .unwrap();
        // All storable: one commit, all created.
        let first = db.record_orders(&[order(1, 1, v), order(2, 2, v)]).await;
        assert!(
            first.iter().all(|o| matches!(o, Ok(Recorded::Created))),
            "{first:?}"
        );
        // A re-delivery and a second order of user 1 in the middle: the
        // batch falls back to one transaction per order, and nothing of the
        // failed batch is kept twice.
        let mixed = db
            .record_orders(&[
                order(3, 3, v),
                order(1, 1, v),
                order(4, 1, v),
                order(5, 5, v),
            ])
            .await;
        let mixed: Vec<Recorded> = mixed.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            mixed,
            [
                Recorded::Created,
                Recorded::AlreadyStored,
                Recorded::UserAlreadyOrdered,
                Recorded::Created
            ]
        );
        assert_eq!(db.order_count(v).await.unwrap(), 4);
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(0));
        // Past the stock, in a batch.
        let late = db.record_orders(&[order(6, 6, v), order(7, 7, v)]).await;
        assert!(
            late.iter().all(|o| matches!(o, Ok(Recorded::OutOfStock))),
            "{late:?}"
        );
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(0));
    })
    .await;
}

#[tokio::test]
async fn concurrent_writers_never_take_more_than_the_stock_on_every_backend() {
    on_every_backend(|db| async move {
        db.migrate().await.unwrap();
        let v = db
            .create_voucher(&Title::parse("Contended").unwrap(), &terms(25))
            .await
            .unwrap();
        let db = Arc::new(db);
        let writers: Vec<_> = (0..100u32)
            .map(|i| {
                let db = db.clone();
                tokio::spawn(
                    async move { db.record_order(&order(i, i64::from(i), v)).await.unwrap() },
                )
            })
            .collect();
        let mut created = 0;
        for w in writers {
            match w.await.unwrap() {
                Recorded::Created => created += 1,
                Recorded::OutOfStock => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(created, 25);
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(0));
        assert_eq!(db.order_count(v).await.unwrap(), 25);
    })
    .await;
}

/// Several instances started at once on a fresh database each migrate it:
/// every one of them starts (SQLite has no migration lock: a run that
/// finds a table another has just created is rolled back and tried again;
/// PostgreSQL and MariaDB serialise the runs).
#[tokio::test]
async fn instances_migrating_a_fresh_database_at_once_all_start() {
    async fn all_migrate(url: &str) {
        let runs = (0..6).map(|_| async {
            let db = Database::connect(url).await.unwrap();
            db.migrate().await
        });
        for (i, outcome) in futures_util::future::join_all(runs)
            .await
            .into_iter()
            .enumerate()
        {
            assert!(outcome.is_ok(), "{url}: instance {i}: {outcome:?}");
        }
        let db = Database::connect(url).await.unwrap();
        db.create_voucher(&Title::parse("after").unwrap(), &terms(1))
            .await
            .unwrap();
    }
    for round in 0..3 {
        let dir =
            std::env::temp_dir().join(format!("seckill-migrate-{}-{round}", std::process::id()));
        all_migrate(&format!("sqlite://{}/fresh.db", dir.display())).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    let pg = PostgresServer::start();
    all_migrate(&pg.url()).await;
    let maria = MariaDbServer::start();
    all_migrate(&maria.url()).await;
}

/// Service 8 and 11 on every backend: only a reserved order changes, once,
/// by its row; the deadline is the database's clock's; a give-back raises
/// the stock with the state in one commit and releases the buyer's claim
/// when the voucher allows buying again.
#[tokio::test]
async fn an_order_changes_once_by_its_row_on_every_backend() {
    use seckill::db::{GiveBack, Transition};
    use seckill::domain::order::OrderState;
    on_every_backend(|db| async move {
        db.migrate().await.unwrap();
        let window = Duration::from_secs(60);
        let rebuy = terms(5).with_pay_within(window).unwrap();
        let v = db
            .create_voucher(&Title::parse("Life").unwrap(), &rebuy)
            .await
            .unwrap();
        let now = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let at = |seq: u32, user: i64, created_ms: i64| OrderRecord {
            created_ms,
            ..order(seq, user, v)
        };
        for o in [
            at(1, 1, now),
            at(2, 2, now),
            at(3, 3, now - 61_000),
            at(4, 4, now),
        ] {
            assert_eq!(db.record_order(&o).await.unwrap(), Recorded::Created);
        }
        let id = |seq| OrderId::compose(1_000, seq).unwrap().as_i64();
        let state = |t: &Transition| match t {
            Transition::Done(o)
            | Transition::Already(o)
            | Transition::Refused(o)
            | Transition::Pending(o) => Some(o.state),
            Transition::NotFound => None,
        };
        // Payment: by its buyer only; once per key; final.
        assert_eq!(
            db.pay_order(id(1), 2, "k", "ref-1", "CODE1-k")
                .await
                .unwrap(),
            Transition::NotFound
        );
        let paid = db
            .pay_order(id(1), 1, "k", "ref-1", "CODE1-k")
            .await
            .unwrap();
        assert!(matches!(paid, Transition::Done(_)), "{paid:?}");
        assert!(matches!(
            db.pay_order(id(1), 1, "k", "ref-1", "CODE1-k")
                .await
                .unwrap(),
            Transition::Already(_)
        ));
        let other = db
            .pay_order(id(1), 1, "k2", "ref-1", "CODE1-k2")
            .await
            .unwrap();
        assert!(matches!(other, Transition::Refused(_)) && state(&other) == Some(OrderState::Paid));
        let (t, r) = db
            .give_back(id(1), Some(1), GiveBack::Cancel)
            .await
            .unwrap();
        assert!(
            matches!(t, Transition::Refused(_)) && r.is_none(),
            "a paid order is not cancelled (it is refunded instead)"
        );
        // Cancellation: once; the unit back with it; then no payment.
        let (t, r) = db
            .give_back(id(2), Some(1), GiveBack::Cancel)
            .await
            .unwrap();
        assert_eq!(
            (t, r),
            (Transition::NotFound, None),
            "another buyer's order"
        );
        let (t, r) = db
            .give_back(id(2), Some(2), GiveBack::Cancel)
            .await
            .unwrap();
        assert!(matches!(t, Transition::Done(_)) && r.is_some_and(|r| r.rebuy));
        let (t, r) = db
            .give_back(id(2), Some(2), GiveBack::Cancel)
            .await
            .unwrap();
        assert!(matches!(t, Transition::Already(_)) && r.is_none());
        assert_eq!(
            state(
                &db.pay_order(id(2), 2, "k", "ref-2", "CODE2-k")
                    .await
                    .unwrap()
            ),
            Some(OrderState::Cancelled)
        );
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(2));
        // Expiry: only past the deadline, by the database's clock.
        let (t, _) = db.give_back(id(4), None, GiveBack::Expire).await.unwrap();
        assert!(matches!(t, Transition::Refused(_)) && state(&t) == Some(OrderState::Reserved));
        assert_eq!(
            state(
                &db.pay_order(id(3), 3, "k", "ref-3", "CODE3-k")
                    .await
                    .unwrap()
            ),
            Some(OrderState::Reserved)
        );
        let due = db.due_orders(10).await.unwrap();
        let due: Vec<i64> = due.iter().map(|o| o.record.id.as_i64()).collect();
        assert!(
            due.contains(&id(2)) && due.contains(&id(3)) && !due.contains(&id(4)),
            "{due:?}"
        );
        let (t, r) = db.give_back(id(3), None, GiveBack::Expire).await.unwrap();
        assert!(matches!(t, Transition::Done(_)) && r.is_some(), "{t:?}");
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(3));
        assert_eq!(
            db.order_states(v).await.unwrap(),
            StateCounts {
                reserved: 1,
                paid: 1,
                cancelled: 1,
                expired: 1,
                claims: 2,
                ..Default::default()
            }
        );
        for returned in [id(2), id(3)] {
            db.finish_return(returned).await.unwrap();
        }
        assert!(db.due_orders(10).await.unwrap().is_empty());
        // A buyer whose order went back buys again (a new order); the
        // returned orders are listed for the Redis side.
        assert_eq!(
            db.record_order(&at(5, 2, now)).await.unwrap(),
            Recorded::Created
        );
        assert_eq!(db.returned_orders(v).await.unwrap().len(), 2);
        assert_eq!(
            db.order_of(2, v).await.unwrap().unwrap().record.id.as_i64(),
            id(5)
        );
        // Without rebuy the claim stays.
        let strict = terms(2).with_rebuy_after_cancel(false);
        let s = db
            .create_voucher(&Title::parse("Strict").unwrap(), &strict)
            .await
            .unwrap();
        let first = OrderRecord {
            created_ms: now,
            ..order(10, 7, s)
        };
        assert_eq!(db.record_order(&first).await.unwrap(), Recorded::Created);
        let (t, r) = db
            .give_back(first.id.as_i64(), Some(7), GiveBack::Cancel)
            .await
            .unwrap();
        assert!(matches!(t, Transition::Done(_)) && r.is_some_and(|r| !r.rebuy));
        let second = OrderRecord {
            created_ms: now,
            ..order(11, 7, s)
        };
        assert_eq!(
            db.record_order(&second).await.unwrap(),
            Recorded::UserAlreadyOrdered
        );
        assert_eq!(db.voucher_stock(s).await.unwrap(), Some(2));
    })
    .await;
}

/// Shop 1: what rows stored before vouchers had prices become: free
/// vouchers (0, in `XXX`, "no currency involved") of no named shop, with
/// empty texts, and orders of amount 0 `XXX`, read back as such.
#[tokio::test]
async fn rows_stored_before_prices_existed_become_free() {
    use seckill::domain::money::Money;
    use seckill::domain::voucher::RefundRestock;
    let dir = std::env::temp_dir().join(format!("seckill-before-prices-{}", std::process::id()));
    let early = dir.join("early-migrations");
    std::fs::create_dir_all(&early).unwrap();
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
    for file in ["0001_init.sql", "0002_order_life.sql"] {
        std::fs::copy(all.join(file), early.join(file)).unwrap();
    }
    let file = dir.join("old.db");
    {
        // A database as the service left it before prices existed.
        let url = format!("sqlite://{}?mode=rwc", file.display());
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        let migrator = sqlx::migrate::Migrator::new(early.as_path()).await.unwrap();
        migrator.run(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO seckill_voucher (title, stock, begin_ms, end_ms, created_ms) \
             VALUES ('Old sale', 4, 1, 2, 1)",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO voucher_order (id, user_id, voucher_id, created_ms, state, pay_by_ms) \
             VALUES (77, 5, 1, 1, 'paid', 2)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let db = Database::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    db.migrate().await.unwrap();
    let voucher = db.voucher(1).await.unwrap().unwrap();
    assert_eq!(voucher.title, "Old sale");
    assert_eq!(
        (voucher.price, voucher.face_value),
        (Money::zero(), Money::zero())
    );
    assert_eq!(voucher.price.currency().code(), "XXX");
    assert_eq!(voucher.shop, None);
    assert_eq!(
        (voucher.subtitle.as_str(), voucher.rules.as_str()),
        ("", "")
    );
    assert_eq!(voucher.refund_restock, RefundRestock::WhileOpen);
    let order = db.order(77).await.unwrap().unwrap();
    assert_eq!(order.amount, Money::zero());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Shop 4, 5: a paid order is redeemed once by its code, or refunded once
/// (refunding, then refunded), never both; a refunded unit goes back on
/// sale, in the same commit, only while the sale is open and the voucher
/// says so; the stock still accounts for every unit.
#[tokio::test]
async fn a_paid_order_is_used_or_refunded_once_on_every_backend() {
    use seckill::db::{GiveBack, Transition};
    use seckill::domain::order::OrderState;
    use seckill::domain::voucher::{Offer, RefundRestock};
    on_every_backend(|db| async move {
        db.migrate().await.unwrap();
        let state = |t: &Transition| match t {
            Transition::Done(o)
            | Transition::Already(o)
            | Transition::Refused(o)
            | Transition::Pending(o) => Some(o.state),
            Transition::NotFound => None,
        };
        let now = SystemTime::now();
        let open = terms(4);
        let ended = SaleTerms::new(
            2,
            now - Duration::from_secs(7200),
            now - Duration::from_secs(3600),
        )
        .unwrap();
        let title = Title::parse("Refunds").unwrap();
        let free = Offer::free();
        let keep = Offer::free().with_refund_restock(RefundRestock::Never);
        let v = db.publish_voucher(&title, &free, &open).await.unwrap();
        let never = db.publish_voucher(&title, &keep, &open).await.unwrap();
        let over = db.publish_voucher(&title, &free, &ended).await.unwrap();
        let mut seq = 100;
        let mut buy = |voucher: i64, user: i64| {
            seq += 1;
            let created_ms = SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            let o = OrderRecord {
                created_ms,
                ..order(seq, user, voucher)
            };
            let db = db.clone();
            async move {
                assert_eq!(db.record_order(&o).await.unwrap(), Recorded::Created);
                let id = o.id.as_i64();
                let code = format!("C{id}");
                let paid = db.pay_order(id, user, "pay", "ref", &code).await.unwrap();
                assert!(matches!(paid, Transition::Done(_)), "{paid:?}");
                id
            }
        };
        let (used, refunded) = (buy(v, 1).await, buy(v, 2).await);
        // Redemption: once, by the code; then no refund.
        let code = |id: i64| format!("C{id}");
        let t = db.redeem(&code(used)).await.unwrap();
        assert!(
            matches!(t, Transition::Done(_)) && state(&t) == Some(OrderState::Used),
            "{t:?}"
        );
        let again = db.redeem(&code(used)).await.unwrap();
        assert!(
            matches!(again, Transition::Refused(_)),
            "a code is used once: {again:?}"
        );
        assert_eq!(db.redeem("nobody's").await.unwrap(), Transition::NotFound);
        let (t, _) = db.start_refund(used, 1, "r").await.unwrap();
        assert_eq!(state(&t), Some(OrderState::Used));
        assert!(matches!(t, Transition::Refused(_)));
        // Refund: by its buyer, once per key; the unit back while open.
        assert_eq!(
            db.start_refund(refunded, 1, "r").await.unwrap().0,
            Transition::NotFound
        );
        let (t, reference) = db.start_refund(refunded, 2, "r").await.unwrap();
        assert!(matches!(t, Transition::Done(_)) && state(&t) == Some(OrderState::Refunding));
        assert_eq!(reference.as_deref(), Some("ref"));
        assert!(matches!(
            db.start_refund(refunded, 2, "r").await.unwrap().0,
            Transition::Already(_)
        ));
        assert!(matches!(
            db.start_refund(refunded, 2, "other").await.unwrap().0,
            Transition::Refused(_)
        ));
        assert!(matches!(
            db.redeem(&code(refunded)).await.unwrap(),
            Transition::Refused(_)
        ));
        let due: Vec<i64> = db
            .due_orders(10)
            .await
            .unwrap()
            .iter()
            .map(|o| o.record.id.as_i64())
            .collect();
        assert!(
            due.contains(&refunded),
            "a refund under way is due: {due:?}"
        );
        let (t, returned) = db.finish_refund(refunded).await.unwrap();
        assert!(
            matches!(t, Transition::Done(_)) && state(&t) == Some(OrderState::Refunded),
            "{t:?}"
        );
        assert!(returned.is_some_and(|r| r.rebuy && r.voucher_id == v));
        let (t, returned) = db.finish_refund(refunded).await.unwrap();
        assert!(matches!(t, Transition::Already(_)) && returned.is_none());
        assert_eq!(db.voucher_stock(v).await.unwrap(), Some(3));
        assert!(db.order(refunded).await.unwrap().unwrap().returned);
        assert_eq!(db.returned_orders(v).await.unwrap().len(), 1);
        db.finish_return(refunded).await.unwrap();
        // A buyer whose refunded unit went back may buy again.
        buy(v, 2).await;
        let counts = db.order_states(v).await.unwrap();
        assert_eq!(
            (
                counts.used,
                counts.refunded,
                counts.refunded_returned,
                counts.paid
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(
            db.voucher_stock(v).await.unwrap().unwrap() + counts.holding_units(),
            4
        );
        // Kept: the voucher says never, or the sale has ended.
        for voucher in [never, over] {
            let id = buy(voucher, 3).await;
            let stock = db.voucher_stock(voucher).await.unwrap();
            db.start_refund(id, 3, "r").await.unwrap();
            let (t, returned) = db.finish_refund(id).await.unwrap();
            assert!(
                matches!(t, Transition::Done(_)) && returned.is_none(),
                "{t:?}"
            );
            assert_eq!(
                db.voucher_stock(voucher).await.unwrap(),
                stock,
                "the unit stays sold"
            );
            assert!(!db.order(id).await.unwrap().unwrap().returned);
            let counts = db.order_states(voucher).await.unwrap();
            assert_eq!((counts.refunded, counts.refunded_returned), (1, 0));
            assert!(!db
                .due_orders(10)
                .await
                .unwrap()
                .iter()
                .any(|o| o.record.id.as_i64() == id));
        }
        // A refund the provider declined: paid again, nothing due.
        let declined = buy(v, 4).await;
        db.start_refund(declined, 4, "r").await.unwrap();
        db.abandon_refund(declined).await.unwrap();
        let order = db.order(declined).await.unwrap().unwrap();
        assert_eq!(order.state, OrderState::Paid);
        let (t, _) = db
            .give_back(declined, Some(4), GiveBack::Cancel)
            .await
            .unwrap();
        assert!(
            matches!(t, Transition::Refused(_)),
            "a paid order is not cancelled"
        );
    })
    .await;
}
