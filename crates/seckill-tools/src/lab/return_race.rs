//! The lab's second walk: giving a unit back. An order that is cancelled
//! by its buyer just as its payment deadline passes is given back by two
//! actors at once, the buyer's request and the expiry sweep. Each unit
//! must come back once; a unit that comes back twice is sold twice.
//!
//! Both rows sell the stock, give every order back with the two actors
//! racing on it, then sell again to new buyers until sold out. The naive
//! return checks the order's state, then writes the new state and adds the
//! unit back: two steps, and both actors pass the check (a barrier holds
//! each between its check and its write, so every run shows the bug). The
//! service's return is one conditional update of the order's row, the state
//! and the stock in one commit, and Redis takes a unit back once per order
//! (`take_back.lua`): the real `OrderLife` and `FastPath`, on a private
//! redis-server and a SQLite file.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use seckill::db::Database;
use seckill::domain::order::OrderRecord;
use seckill::domain::purchase::Purchase;
use seckill::domain::voucher::{SaleTerms, Title};
use seckill::order_life::OrderLife;
use seckill::store::{FastPath, OrderIdGenerator, Redis};

use super::{Row, TempFile};

/// Sells `stock`, gives every order back with two actors racing, sells
/// again; the naive row and the service's row.
pub(super) async fn rows(stock: i64) -> anyhow::Result<Vec<Row>> {
    Ok(vec![naive(stock).await?, service(stock).await?])
}

/// Two steps: the state checked, then written with the unit added back.
async fn naive(stock: i64) -> anyhow::Result<Row> {
    let server = launcher::RedisServer::try_start_with(launcher::ServerOptions::default())?;
    let client = redis::Client::open(server.url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SET")
        .arg("lab:stock")
        .arg(stock)
        .query_async(&mut conn)
        .await?;
    let started = Instant::now();
    // The sale: one order per unit, its state `reserved`.
    for order in 0..stock {
        let _: () = redis::pipe()
            .decr("lab:stock", 1)
            .ignore()
            .hset(format!("lab:order:{order}"), "state", "reserved")
            .ignore()
            .query_async(&mut conn)
            .await?;
    }
    // The buyer cancels as the sweep expires: each checks, then writes.
    let races = (0..stock).map(|order| {
        let conn = conn.clone();
        let both_checked = Arc::new(tokio::sync::Barrier::new(2));
        async move {
            let key = format!("lab:order:{order}");
            let actor = |new_state: &'static str| {
                let (mut conn, key, both_checked) =
                    (conn.clone(), key.clone(), both_checked.clone());
                async move {
                    let state: Option<String> = redis::cmd("HGET")
                        .arg(&key)
                        .arg("state")
                        .query_async(&mut conn)
                        .await?;
                    both_checked.wait().await;
                    if state.as_deref() == Some("reserved") {
                        let _: () = redis::pipe()
                            .hset(&key, "state", new_state)
                            .ignore()
                            .incr("lab:stock", 1)
                            .ignore()
                            .query_async(&mut conn)
                            .await?;
                    }
                    redis::RedisResult::Ok(())
                }
            };
            let (a, b) = tokio::join!(actor("cancelled"), actor("expired"));
            a.and(b)
        }
    });
    for race in futures_util::future::join_all(races).await {
        race?;
    }
    // New buyers take what the stock shows.
    let mut resold = 0;
    loop {
        let left: i64 = redis::cmd("DECR")
            .arg("lab:stock")
            .query_async(&mut conn)
            .await?;
        if left < 0 {
            break;
        }
        resold += 1;
    }
    Ok(row(
        "R1 return: check the order's state, then write it and add the unit back",
        "the buyer's cancellation and the expiry sweep both saw `reserved`: each unit came back twice",
        stock,
        resold,
        started,
    ))
}

/// The service's return: the real order life on SQLite and Redis.
async fn service(stock: i64) -> anyhow::Result<Row> {
    let server = launcher::RedisServer::try_start_with(launcher::ServerOptions::default())?;
    let file = TempFile::new("lab-returns.db");
    let db = Database::connect(&file.sqlite_url()).await?;
    db.migrate().await?;
    let now = SystemTime::now();
    let terms = SaleTerms::new(
        stock,
        now - Duration::from_secs(1),
        now + Duration::from_secs(600),
    )?
    .with_pay_within(Duration::from_secs(1))?;
    let voucher = db.create_voucher(&Title::parse("Returns")?, &terms).await?;
    let redis = Redis::new(seckill::store::connect(&server.url()).await?, "lab");
    let fast = Arc::new(FastPath::new(
        redis.clone(),
        OrderIdGenerator::new(redis, 100)?,
    ));
    fast.load_voucher(voucher, &terms).await?;
    fast.arm(voucher).await?;
    let life = OrderLife::new(
        db.clone(),
        Some(fast.clone()),
        Arc::new(seckill::payments::StandIn::default()),
        seckill::metrics::Metrics::new()?,
    );
    let started = Instant::now();
    // The sale, each order stored as the pipeline would, its deadline past.
    let past = seckill_now_ms() - 60_000;
    let mut orders = Vec::new();
    for user in 1..=stock {
        let Purchase::Accepted(id) = fast.purchase(voucher, user).await? else {
            anyhow::bail!("user {user} could not buy");
        };
        let order = OrderRecord {
            id,
            user_id: user,
            voucher_id: voucher,
            created_ms: past,
        };
        db.record_order(&order).await?;
        orders.push((user, id.as_i64()));
    }
    // The buyer cancels as the sweep expires.
    let life = &life;
    let races = orders.iter().map(|&(user, id)| async move {
        let (cancel, sweep) = tokio::join!(life.cancel(id, user), life.sweep());
        cancel.and(sweep.map(drop))
    });
    for race in futures_util::future::join_all(races).await {
        race?;
    }
    life.sweep().await?; // a return left half done by the race
    let next = AtomicU64::new(stock as u64 + 1);
    let mut resold = 0;
    loop {
        let user = next.fetch_add(1, Ordering::Relaxed) as i64;
        match fast.purchase(voucher, user).await? {
            Purchase::Accepted(_) => resold += 1,
            Purchase::Refused(_) => break,
        }
    }
    Ok(row(
        "R2 return: one conditional update decides, Redis takes each unit back once",
        "the row's state decides who gives the unit back; the returned set lets Redis add it once",
        stock,
        resold,
        started,
    ))
}

fn row(
    strategy: &'static str,
    why: &'static str,
    stock: i64,
    resold: i64,
    started: Instant,
) -> Row {
    Row {
        strategy,
        accepted: resold,
        oversold: (resold - stock).max(0),
        undersold: (stock - resold).max(0),
        stuck: 0,
        errors: 0,
        first_error: None,
        requests_per_second: (2 * stock) as f64 / started.elapsed().as_secs_f64(),
        why,
    }
}

fn seckill_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
