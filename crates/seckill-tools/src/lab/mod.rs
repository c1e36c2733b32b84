//! `seckill-tools lab`: the walk through the oversell bug, runnable.
//!
//! The same flash sale — same stock, same buyers, same concurrency, two
//! simulated service instances with their own Redis connections — runs
//! against each strategy in turn, each on a fresh private redis-server. The
//! faults that expose strategies 3–5 are induced on purpose (a crash, a slow
//! holder, a pause between check and delete) so every run shows the bug, not
//! only lucky ones. The broken strategies live here, never in the service.
//!
//! Then the same walk for giving a unit back (`return_race`): a naive
//! return that a cancellation and the expiry sweep both apply, beside the
//! service's own.

mod return_race;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use redis::aio::MultiplexedConnection;
use serde::Serialize;

use seckill::domain::purchase::Purchase;
use seckill::domain::voucher::SaleTerms;
use seckill::store::{FastPath, OrderIdGenerator, Redis};

/// Options of `seckill-tools lab`.
#[derive(Debug, Clone, clap::Args)]
pub struct LabArgs {
    /// Units for sale.
    #[arg(long, default_value_t = 20)]
    pub stock: i64,
    /// Buyers (each tries once), split over two instances.
    #[arg(long, default_value_t = 100)]
    pub buyers: i64,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One row of the lab's table.
#[derive(Debug, Serialize)]
pub struct Row {
    strategy: &'static str,
    accepted: i64,
    oversold: i64,
    undersold: i64,
    stuck: u64,
    errors: u64,
    /// The first error a buyer got, if any (what `errors` counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    first_error: Option<String>,
    requests_per_second: f64,
    why: &'static str,
}

#[derive(Debug, Clone, Copy)]
enum Strategy {
    ReadModifyWrite,
    LocalMutex,
    SetNxNoExpiry,
    SetNxExNoOwner,
    CheckThenDelete,
    HaspLock,
    AtomicLua,
    TableLock,
}

const ALL: [Strategy; 8] = [
    Strategy::ReadModifyWrite,
    Strategy::LocalMutex,
    Strategy::SetNxNoExpiry,
    Strategy::SetNxExNoOwner,
    Strategy::CheckThenDelete,
    Strategy::HaspLock,
    Strategy::AtomicLua,
    Strategy::TableLock,
];

impl Strategy {
    /// The lock's lease, for the strategies that have one.
    fn lease(self) -> Duration {
        match self {
            Strategy::TableLock => TABLE_LEASE,
            _ => LEASE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Strategy::ReadModifyWrite => "1 read stock, subtract, write back",
            Strategy::LocalMutex => "2 process-local mutex",
            Strategy::SetNxNoExpiry => "3 SETNX, no expiry (holder crashes)",
            Strategy::SetNxExNoOwner => "4 SET NX EX, no owner check (slow holder)",
            Strategy::CheckThenDelete => "5 owner check, then DEL (two commands)",
            Strategy::HaspLock => "6 hasp lock with watchdog",
            Strategy::AtomicLua => "7 atomic Lua fast path",
            Strategy::TableLock => "8 database table lock (hasp-sql, SQLite)",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Strategy::ReadModifyWrite => {
                "buyers read the same stock and each writes back stock - 1"
            }
            Strategy::LocalMutex => "each instance serialises only its own buyers; the two race",
            Strategy::SetNxNoExpiry => {
                "a holder crashed without releasing; nobody can ever acquire"
            }
            Strategy::SetNxExNoOwner => {
                "a slow holder's lock expired; its DEL then freed someone else's"
            }
            Strategy::CheckThenDelete => {
                "the lock expired between GET and DEL; the DEL freed the next holder's"
            }
            Strategy::HaspLock => {
                "owner-checked atomic release; the watchdog keeps a slow holder's lease"
            }
            Strategy::AtomicLua => "check and decrement in one script: nothing can interleave",
            Strategy::TableLock => {
                "a database table lock done properly: one atomic upsert per try, owner-checked release, renewal"
            }
        }
    }
}

/// The critical section's work: long enough that races show.
const WORK: Duration = Duration::from_millis(2);
/// How long a buyer keeps trying for a lock before counting as stuck.
const GIVE_UP: Duration = Duration::from_secs(3);
/// Lease of strategies 4, 5 and 6. A lease must outlast the slowest reply
/// to the call that takes or renews it (a hold whose acquisition comes back
/// after its lease is lost from the start: nobody can say it still holds).
/// Beside two CPU hogs, a debug build with a 50 ms lease lost strategy 6's
/// hold in 1 run of ~30.
const LEASE: Duration = Duration::from_millis(150);
/// Lease of strategy 8. On SQLite every change is a committed write (an
/// fsync), and beside two CPU hogs single statements took up to 250 ms:
/// a 250 ms lease lost a hold in 1 run of ~20 there, a lost lease lets a
/// second holder in, and so the row needs a lease several times that.
const TABLE_LEASE: Duration = Duration::from_secs(1);
/// How long a buyer of strategies 6 and 8 waits for the lock: every slow
/// holder before it included.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Runs every strategy and prints the table; true if rows 6, 7 and 8 held.
pub async fn run(args: LabArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.stock > 0 && args.buyers > 0,
        "--stock and --buyers must be positive"
    );
    let mut rows = Vec::new();
    for strategy in ALL {
        rows.push(run_one(strategy, args.stock, args.buyers).await?);
    }
    let returns = return_race::rows(args.stock).await?;
    if args.json {
        let all: Vec<&Row> = rows.iter().chain(&returns).collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
    } else {
        println!(
            "{} units, {} buyers over 2 instances, critical section {WORK:?}\n",
            args.stock, args.buyers
        );
        println!("| strategy | accepted | oversold | undersold | stuck | errors | req/s | why |");
        println!("|---|---:|---:|---:|---:|---:|---:|---|");
        for r in &rows {
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.0} | {} |",
                r.strategy,
                r.accepted,
                r.oversold,
                r.undersold,
                r.stuck,
                r.errors,
                r.requests_per_second,
                r.why
            );
        }
        println!(
            "\nGiving units back: {} orders, each cancelled by its buyer as its deadline passes, then sold again until sold out\n",
            args.stock
        );
        println!("| return | sold again | oversold | undersold | why |");
        println!("|---|---:|---:|---:|---|");
        for r in &returns {
            println!(
                "| {} | {} | {} | {} | {} |",
                r.strategy, r.accepted, r.oversold, r.undersold, r.why
            );
        }
        for r in rows.iter().filter(|r| r.first_error.is_some()) {
            println!(
                "\n{}: first error: {}",
                r.strategy,
                r.first_error.as_deref().unwrap_or_default()
            );
        }
    }
    let returned_once = returns[1..]
        .iter()
        .all(|row| row.oversold == 0 && row.undersold == 0);
    Ok(rows[5..].iter().all(|row| row.oversold == 0) && returned_once)
}

/// What every buyer task shares.
struct Sale {
    strategy: Strategy,
    accepted: AtomicU64,
    stuck: AtomicU64,
    errors: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
    /// Strategy 3: the first holder "crashes" (never releases).
    crashed: std::sync::atomic::AtomicBool,
    /// Strategy 4: every few holders is slower than the lease.
    holders: AtomicU64,
}

impl Sale {
    /// How long the next holder works: every 4th (strategy 8, with its long
    /// lease: every 10th) outlasts its lease by [`LEASE`] (strategies 4, 5,
    /// 6 and 8; twice the lease for 4, 5 and 6).
    fn next_holder_work(&self) -> Duration {
        let every = match self.strategy {
            Strategy::TableLock => 10,
            _ => 4,
        };
        if self
            .holders
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(every)
        {
            self.strategy.lease() + LEASE
        } else {
            WORK
        }
    }
}

/// One simulated service instance.
struct Instance {
    conn: MultiplexedConnection,
    local: tokio::sync::Mutex<()>,
    hasp: hasp::Client,
    fast: FastPath,
    /// Strategy 8: a client of the sale's database file.
    table: hasp_sql::SqlClient,
}

async fn run_one(strategy: Strategy, stock: i64, buyers: i64) -> anyhow::Result<Row> {
    let server = launcher::RedisServer::try_start_with(launcher::ServerOptions::default())?;
    let database = TempFile::new("lab-locks.db");
    let client = redis::Client::open(server.url())?;
    let mut setup = client.get_multiplexed_async_connection().await?;
    let _: () = redis::cmd("SET")
        .arg("lab:stock")
        .arg(stock)
        .query_async(&mut setup)
        .await?;
    let mut instances = Vec::new();
    for _ in 0..2 {
        let redis = Redis::new(seckill::store::connect(&server.url()).await?, "lab");
        let fast = FastPath::new(redis.clone(), OrderIdGenerator::new(redis, 100)?);
        let now = SystemTime::now();
        fast.load_voucher(
            1,
            &SaleTerms::new(
                stock,
                now - Duration::from_secs(1),
                now + Duration::from_secs(600),
            )?,
        )
        .await?;
        fast.arm(1).await?; // a fresh Redis: nothing to verify
        instances.push(Arc::new(Instance {
            conn: client.get_multiplexed_async_connection().await?,
            local: tokio::sync::Mutex::new(()),
            // The same short lease as strategies 4 and 5: only the
            // watchdog keeps a slow holder's lock.
            hasp: hasp::Client::open_with(
                &server.url(),
                hasp::Settings::default().set_watchdog_timeout(LEASE),
            )
            .await?,
            fast,
            table: {
                let table = hasp_sql::SqlClient::open(
                    &database.sqlite_url(),
                    hasp_sql::SqlSettings::default().set_watchdog_timeout(TABLE_LEASE),
                )
                .await?;
                table.migrate().await?;
                table
            },
        }));
    }
    let sale = Arc::new(Sale {
        strategy,
        accepted: AtomicU64::new(0),
        stuck: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: Default::default(),
        crashed: Default::default(),
        holders: AtomicU64::new(0),
    });
    let started = Instant::now();
    let tasks: Vec<_> = (0..buyers)
        .map(|user| {
            let (sale, instance) = (sale.clone(), instances[(user % 2) as usize].clone());
            tokio::spawn(async move {
                match buy(&sale, &instance, user).await {
                    Ok(Some(true)) => sale.accepted.fetch_add(1, Ordering::Relaxed),
                    Ok(Some(false)) => 0,
                    Ok(None) => sale.stuck.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        if let Ok(mut first) = sale.first_error.lock() {
                            first.get_or_insert_with(|| e.to_string());
                        }
                        sale.errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed();
    let accepted = sale.accepted.load(Ordering::Relaxed) as i64;
    Ok(Row {
        strategy: strategy.name(),
        accepted,
        oversold: (accepted - stock).max(0),
        undersold: (stock.min(buyers) - accepted).max(0),
        stuck: sale.stuck.load(Ordering::Relaxed),
        errors: sale.errors.load(Ordering::Relaxed),
        first_error: sale.first_error.lock().ok().and_then(|mut e| e.take()),
        requests_per_second: buyers as f64 / elapsed.as_secs_f64(),
        why: strategy.why(),
    })
}

/// One buyer's attempt: `Some(true)` bought, `Some(false)` refused (sold
/// out), `None` stuck (never got the lock).
async fn buy(sale: &Sale, instance: &Instance, user: i64) -> redis::RedisResult<Option<bool>> {
    let mut conn = instance.conn.clone();
    match sale.strategy {
        Strategy::ReadModifyWrite => read_modify_write(&mut conn).await.map(Some),
        Strategy::LocalMutex => {
            let _held = instance.local.lock().await;
            read_modify_write(&mut conn).await.map(Some)
        }
        Strategy::SetNxNoExpiry => {
            let deadline = Instant::now() + GIVE_UP;
            loop {
                let got: bool = redis::cmd("SETNX")
                    .arg("lab:lock")
                    .arg(user)
                    .query_async(&mut conn)
                    .await?;
                if got {
                    if !sale.crashed.swap(true, Ordering::AcqRel) {
                        // The induced fault: this holder's process dies here.
                        return Ok(Some(false));
                    }
                    let bought = read_modify_write(&mut conn).await?;
                    release_blindly(&mut conn).await?;
                    return Ok(Some(bought));
                }
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        Strategy::SetNxExNoOwner | Strategy::CheckThenDelete => {
            let deadline = Instant::now() + GIVE_UP;
            loop {
                let got: Option<String> = redis::cmd("SET")
                    .arg("lab:lock")
                    .arg(user)
                    .arg("NX")
                    .arg("PX")
                    .arg(LEASE.as_millis() as u64)
                    .query_async(&mut conn)
                    .await?;
                if got.is_some() {
                    // The induced fault: some holders are slower than their lease.
                    let bought =
                        read_modify_write_taking(&mut conn, sale.next_holder_work()).await?;
                    if matches!(sale.strategy, Strategy::SetNxExNoOwner) {
                        release_blindly(&mut conn).await?;
                    } else {
                        let owner: Option<String> = redis::cmd("GET")
                            .arg("lab:lock")
                            .query_async(&mut conn)
                            .await?;
                        if owner.as_deref() == Some(user.to_string().as_str()) {
                            // The induced fault: a pause (GC, page fault)
                            // between the check and the delete.
                            tokio::time::sleep(LEASE).await;
                            release_blindly(&mut conn).await?;
                        }
                    }
                    return Ok(Some(bought));
                }
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        Strategy::HaspLock => {
            let lock = instance.hasp.lock("lab:lock").map_err(to_redis)?;
            let Some(guard) = lock.try_lock_for(LOCK_WAIT).await.map_err(to_redis)? else {
                return Ok(None);
            };
            // The same slow holders as strategy 4; the watchdog renews.
            let bought = read_modify_write_taking(&mut conn, sale.next_holder_work()).await?;
            guard.unlock().await.map_err(to_redis)?;
            Ok(Some(bought))
        }
        Strategy::TableLock => {
            let lock = instance.table.lock("lab:lock").map_err(to_redis)?;
            let Some(guard) = lock.try_lock_for(LOCK_WAIT).await.map_err(to_redis)? else {
                return Ok(None);
            };
            // The same slow holders as strategy 4; the client renews the row.
            let bought = read_modify_write_taking(&mut conn, sale.next_holder_work()).await?;
            guard.unlock().await.map_err(to_redis)?;
            Ok(Some(bought))
        }
        Strategy::AtomicLua => match instance.fast.purchase(1, user + 1).await {
            Ok(Purchase::Accepted(_)) => Ok(Some(true)),
            Ok(Purchase::Refused(_)) => Ok(Some(false)),
            Err(e) => Err(to_redis(e)),
        },
    }
}

/// A file in the temporary directory, removed (with SQLite's side files)
/// when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!("seckill-{}-{n}-{name}", std::process::id())))
    }

    fn sqlite_url(&self) -> String {
        format!("sqlite://{}?mode=rwc", self.0.display())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

/// DEL of the lock with no owner check: the bug of strategies 3–5.
async fn release_blindly(conn: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let _: i64 = redis::cmd("DEL").arg("lab:lock").query_async(conn).await?;
    Ok(())
}

fn to_redis(e: impl std::fmt::Display) -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::Client, "lab", e.to_string()))
}

async fn read_modify_write(conn: &mut MultiplexedConnection) -> redis::RedisResult<bool> {
    read_modify_write_taking(conn, WORK).await
}

/// GET the stock, work for `work`, SET stock - 1: the naive deduction.
async fn read_modify_write_taking(
    conn: &mut MultiplexedConnection,
    work: Duration,
) -> redis::RedisResult<bool> {
    let stock: i64 = redis::cmd("GET").arg("lab:stock").query_async(conn).await?;
    tokio::time::sleep(work).await;
    if stock <= 0 {
        return Ok(false);
    }
    let _: () = redis::cmd("SET")
        .arg("lab:stock")
        .arg(stock - 1)
        .query_async(conn)
        .await?;
    Ok(true)
}
