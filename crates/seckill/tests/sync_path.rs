//! The locked purchase path: real Redis (for the locks), real databases.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use seckill::db::Database;
use seckill::domain::purchase::{Purchase, Refusal};
use seckill::domain::voucher::{SaleTerms, Title};
use seckill::store::OrderIdGenerator;
use seckill::sync_path::{SyncPath, UserLocks};
use testkit::{PostgresServer, RedisServer};

async fn instance(redis: &RedisServer, db: &Database) -> SyncPath {
    let locks = hasp::Client::open(&redis.url()).await.unwrap();
    instance_with(redis, db, UserLocks::Redis(locks)).await
}

async fn instance_with(redis: &RedisServer, db: &Database, locks: UserLocks) -> SyncPath {
    let conn = seckill::store::connect(&redis.url()).await.unwrap();
    let ids = OrderIdGenerator::new(seckill::store::Redis::new(conn, "seckill"), 100).unwrap();
    SyncPath::new(db.clone(), locks, ids, Duration::from_secs(10))
}

/// An instance whose per-user locks are kept in the database at `url`
/// (`user_locks = "database"`).
async fn instance_with_table_locks(redis: &RedisServer, db: &Database, url: &str) -> SyncPath {
    let table = hasp_sql::SqlClient::open(url, hasp_sql::SqlSettings::default())
        .await
        .unwrap();
    table.migrate().await.unwrap();
    instance_with(redis, db, UserLocks::Table(table)).await
}

async fn two_instances_sell_exactly_the_stock(db: Database) {
    two_instances_sell_exactly_the_stock_with(db, None).await;
}

/// As above; with `table_locks`, the user locks live in that database.
async fn two_instances_sell_exactly_the_stock_with(db: Database, table_locks: Option<&str>) {
    const STOCK: i64 = 40;
    const USERS: i64 = 150;
    db.migrate().await.unwrap();
    let now = SystemTime::now();
    let terms = SaleTerms::new(
        STOCK,
        now - Duration::from_secs(1),
        now + Duration::from_secs(3600),
    )
    .unwrap();
    let voucher = db
        .create_voucher(&Title::parse("Locked path").unwrap(), &terms)
        .await
        .unwrap();
    let redis = RedisServer::start();
    let (a, b) = match table_locks {
        Some(url) => (
            Arc::new(instance_with_table_locks(&redis, &db, url).await),
            Arc::new(instance_with_table_locks(&redis, &db, url).await),
        ),
        None => (
            Arc::new(instance(&redis, &db).await),
            Arc::new(instance(&redis, &db).await),
        ),
    };
    let mut calls = Vec::new();
    for user in 0..USERS {
        for path in [&a, &b] {
            let path = path.clone();
            calls.push(tokio::spawn(async move {
                // A database too busy to answer (its pool's wait ran out:
                // nothing was sent, so nothing bought) is what the service
                // answers 503 with `Retry-After`; a buyer asks again.
                for _ in 0..100 {
                    match path.purchase(voucher, user).await {
                        Err(e) if e.is_unavailable() => {
                            tokio::time::sleep(Duration::from_millis(100)).await
                        }
                        outcome => return (user, outcome.unwrap()),
                    }
                }
                panic!("user {user}: the database stayed unavailable for 100 tries");
            }));
        }
    }
    let mut buyers = HashSet::new();
    for call in calls {
        match call.await.unwrap() {
            (user, Purchase::Accepted(_)) => {
                assert!(buyers.insert(user), "user {user} bought twice")
            }
            (_, Purchase::Refused(Refusal::SoldOut | Refusal::AlreadyBought)) => {}
            (_, other) => panic!("{other:?}"),
        }
    }
    assert_eq!(buyers.len() as i64, STOCK);
    assert_eq!(db.voucher_stock(voucher).await.unwrap(), Some(0));
    assert_eq!(db.order_count(voucher).await.unwrap(), STOCK);
    assert_eq!(
        a.purchase(voucher + 1000, 1).await.unwrap(),
        Purchase::Refused(Refusal::UnknownVoucher)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sell_exactly_the_stock_one_per_user_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("seckill-sync-{}", std::process::id()));
    let db = Database::connect(&format!("sqlite://{}/sync.db", dir.display()))
        .await
        .unwrap();
    two_instances_sell_exactly_the_stock(db).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sell_exactly_the_stock_one_per_user_on_postgres() {
    let pg = PostgresServer::start();
    let db = Database::connect(&pg.url()).await.unwrap();
    two_instances_sell_exactly_the_stock(db).await;
}

/// The table lock in the service: the sync path with its user locks in the
/// database (no Redis lock) sells exactly the stock, one per user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_locks_sell_exactly_the_stock_one_per_user_on_sqlite_and_postgres() {
    let dir = std::env::temp_dir().join(format!("seckill-sync-table-{}", std::process::id()));
    let url = format!("sqlite://{}/sync.db", dir.display());
    std::fs::create_dir_all(&dir).unwrap();
    let db = Database::connect(&url).await.unwrap();
    two_instances_sell_exactly_the_stock_with(db, Some(&url)).await;
    let _ = std::fs::remove_dir_all(dir);

    let pg = PostgresServer::start();
    let db = Database::connect(&pg.url()).await.unwrap();
    two_instances_sell_exactly_the_stock_with(db, Some(&pg.url())).await;
}

#[tokio::test]
async fn the_sale_window_is_enforced() {
    let dir = std::env::temp_dir().join(format!("seckill-sync-window-{}", std::process::id()));
    let db = Database::connect(&format!("sqlite://{}/w.db", dir.display()))
        .await
        .unwrap();
    db.migrate().await.unwrap();
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    let future = db
        .create_voucher(
            &Title::parse("Later").unwrap(),
            &SaleTerms::new(5, now + hour, now + 2 * hour).unwrap(),
        )
        .await
        .unwrap();
    let past = db
        .create_voucher(
            &Title::parse("Over").unwrap(),
            &SaleTerms::new(5, now - 2 * hour, now - hour).unwrap(),
        )
        .await
        .unwrap();
    let redis = RedisServer::start();
    let path = instance(&redis, &db).await;
    assert_eq!(
        path.purchase(future, 1).await.unwrap(),
        Purchase::Refused(Refusal::NotStarted)
    );
    assert_eq!(
        path.purchase(past, 1).await.unwrap(),
        Purchase::Refused(Refusal::Ended)
    );
    assert_eq!(db.voucher_stock(future).await.unwrap(), Some(5));
    let _ = std::fs::remove_dir_all(dir);
}

/// A user whose lock stays busy (another purchase of theirs is
/// being decided) is refused `InProgress` after the bounded wait: a 409,
/// not the server error a lock timeout used to become.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_user_is_refused_in_progress_not_an_error() {
    let dir = std::env::temp_dir().join(format!("seckill-sync-busy-{}", std::process::id()));
    let db = Database::connect(&format!("sqlite://{}/busy.db", dir.display()))
        .await
        .unwrap();
    db.migrate().await.unwrap();
    let now = SystemTime::now();
    let voucher = db
        .create_voucher(
            &Title::parse("Busy").unwrap(),
            &SaleTerms::new(
                5,
                now - Duration::from_secs(1),
                now + Duration::from_secs(600),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let redis = RedisServer::start();
    let locks = hasp::Client::open(&redis.url()).await.unwrap();
    let conn = seckill::store::connect(&redis.url()).await.unwrap();
    let path = SyncPath::new(
        db.clone(),
        UserLocks::Redis(locks.clone()),
        OrderIdGenerator::new(seckill::store::Redis::new(conn, "seckill"), 100).unwrap(),
        Duration::from_millis(300),
    );
    // Another purchase of user 7 holds the user's lock (another owner: a
    // lock's default owner is the task, and this one buys below).
    let held = locks
        .lock("seckill:user:7")
        .unwrap()
        .with_owner(hasp::Owner::new())
        .lock()
        .await
        .unwrap();
    let started = std::time::Instant::now();
    assert_eq!(
        path.purchase(voucher, 7).await.unwrap(),
        Purchase::Refused(Refusal::InProgress)
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    held.unlock().await.unwrap();
    assert!(matches!(
        path.purchase(voucher, 7).await.unwrap(),
        Purchase::Accepted(_)
    ));
    let _ = std::fs::remove_dir_all(dir);
}
