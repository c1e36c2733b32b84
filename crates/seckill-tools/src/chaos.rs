//! `seckill-tools chaos`: a private deployment under load while faults strike,
//! then the store checks with lost answers treated as unknown outcomes.
//!
//! The deployment: Redis with the append-only file synced on every write,
//! PostgreSQL (or SQLite), and `--instances` `seckill serve` processes, all
//! private to the run (`launcher`). The run is cut into phases of equal
//! length, one per fault kind, each selling its own voucher under an
//! open-loop load spread over the instances; a quarter into the phase the
//! fault strikes and is then repaired:
//!
//! | fault | what is done |
//! |---|---|
//! | `none` | nothing (the baseline) |
//! | `kill-instance` | one instance SIGKILLed, started again 1 s later |
//! | `restart-redis` | Redis SIGKILLed and started again on its data |
//! | `restart-database` | the database SIGKILLed, started again 1 s later |
//! | `pause-redis` | Redis frozen (SIGSTOP) for 2 s |
//! | `order-life` | nothing during the load; then the buyer model (a share pays, a share cancels, the rest let a 2 s deadline pass; of those who pay, a share has it refunded and a share redeems it; units sold again) while an instance is killed, Redis and the database restarted |
//!
//! Then a waiting-room phase ([`room`]): 200 people join a sale's room
//! before it opens and each tries to buy without a pass; after the draw an
//! instance is killed and Redis restarted on its data; every ticket must
//! be as it was, no purchase without a pass may have been accepted, and
//! the line then sells out with passes.
//!
//! The instances pay through `seckill-tools payments`, which confirms each
//! charge and refund by a signed callback, up to 0.4 s late, out of order,
//! 30% of them twice and 5% beside a forged copy, delivered again to the
//! other instance while one is down. The order-life phase then checks the
//! money against the provider's own ledger: every order kept exactly its
//! amount if it ends paid or used and nothing otherwise, the totals agree,
//! and no forged callback was taken.
//!
//! Each phase's stock is about 60% of the phase's requests, so it sells out
//! after the fault. Per phase: requests, accepted, unknown (answer lost),
//! stored, then what must be 0: lost (accepted, not stored), duplicated (a
//! user with two live orders), oversold (live orders beyond the stock),
//! 5xx other than 503, and in the order-life phase units taken back twice.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde::Serialize;

use seckill::auth::{Principal, Tokens};

mod room;

use crate::bench::checks::{self, Sale, Stores};
use crate::bench::load::{self, Arrival, Plan, Progress, Record, Until};

/// Options of `seckill-tools chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// Length of the whole run (cut into one phase per fault kind).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub duration: Duration,
    /// Service instances (separate processes).
    #[arg(long, default_value_t = 2)]
    pub instances: usize,
    /// Purchases per second (open loop), spread over the instances.
    #[arg(long, default_value_t = 500.0)]
    pub rate: f64,
    /// The database.
    #[arg(long, value_enum, default_value_t = ChaosDatabase::Postgres)]
    pub database: ChaosDatabase,
    /// Directory for `chaos-report.json` and the instances' logs.
    #[arg(long, default_value = "bench-report/chaos")]
    pub out: PathBuf,
    /// Redis and PostgreSQL speak TLS only (certificates of a private CA
    /// made for the run, verified by the instances and the checks).
    #[arg(long)]
    pub tls: bool,
    /// The `seckill` service binary to run [default: `seckill` beside this
    /// program, as cargo builds them].
    #[arg(long, env = "SECKILL_BIN")]
    pub seckill_bin: Option<PathBuf>,
}

/// The service binary: `explicit`, else `seckill` in this program's
/// directory (cargo puts a workspace's binaries side by side).
fn service_binary(explicit: Option<&std::path::Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_owned());
    }
    let exe = std::env::current_exe().context("locating this program")?;
    let beside = exe.with_file_name("seckill");
    anyhow::ensure!(
        beside.is_file(),
        "no seckill binary at {} (build it: cargo build -p seckill; or pass --seckill-bin)",
        beside.display()
    );
    Ok(beside)
}

/// The database a chaos run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosDatabase {
    /// A private PostgreSQL server (restartable).
    Postgres,
    /// A SQLite file (the `restart-database` phase then has nothing to
    /// restart and runs as a baseline).
    Sqlite,
}

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Nothing.
    None,
    /// One instance SIGKILLed and started again.
    KillInstance,
    /// Redis SIGKILLed and started again on its data.
    RestartRedis,
    /// The database SIGKILLed and started again.
    RestartDatabase,
    /// Redis frozen for 2 s.
    PauseRedis,
    /// After the load, buyers pay, cancel or let their orders expire while
    /// an instance is killed, then Redis and the database are restarted.
    OrderLife,
}

const FAULTS: [Fault; 6] = [
    Fault::None,
    Fault::KillInstance,
    Fault::RestartRedis,
    Fault::RestartDatabase,
    Fault::PauseRedis,
    Fault::OrderLife,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::KillInstance => "kill-instance",
            Fault::RestartRedis => "restart-redis",
            Fault::RestartDatabase => "restart-database",
            Fault::PauseRedis => "pause-redis",
            Fault::OrderLife => "order-life",
        }
    }
}

/// One phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The fault of the phase.
    pub fault: Fault,
    /// The voucher sold.
    pub voucher: i64,
    /// Its stock.
    pub stock: i64,
    /// Purchases sent.
    pub requests: u64,
    /// Answered `accepted`.
    pub accepted: u64,
    /// Answered 503 (a dependency down or repairing: retry later).
    pub unavailable: u64,
    /// Never reached an instance (connection refused: a killed instance).
    pub not_sent: u64,
    /// Answer lost (timeout, broken connection, 5xx): may or may not have
    /// bought.
    pub unknown: u64,
    /// Orders in the database.
    pub stored: u64,
    /// Of the unknown, how many turned out stored.
    pub unknown_stored: u64,
    /// Accepted but not stored (must be 0).
    pub lost: u64,
    /// Users with more than one order (must be 0).
    pub duplicated: u64,
    /// Orders beyond the stock (must be 0).
    pub oversold: u64,
    /// 5xx answers other than 503 (must be 0).
    pub other_5xx: u64,
    /// The order-life phase: orders given back (cancelled, expired).
    pub given_back: u64,
    /// The order-life phase: units Redis took back beyond the orders given
    /// back, or Redis' stock above the database's (must be 0).
    pub returned_twice: u64,
    /// Every store check held.
    pub checks_hold: bool,
    /// The checks that failed, if any.
    pub failed_checks: Vec<String>,
}

impl Row {
    fn clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.oversold == 0
            && self.other_5xx == 0
            && self.returned_twice == 0
            && self.checks_hold
    }
}

/// The private deployment.
struct Deployment {
    redis: Arc<std::sync::Mutex<launcher::RedisServer>>,
    postgres: Option<Arc<std::sync::Mutex<launcher::PostgresServer>>>,
    redis_url: String,
    database_url: String,
    instances: Vec<Instance>,
    secret: String,
    /// With `--tls`: the run's CA, which the instances trust.
    ca: Option<Arc<launcher::TestCa>>,
    _sqlite_dir: Option<TempDir>,
    _ca_dir: Option<TempDir>,
    /// The `seckill` binary the instances run.
    seckill: PathBuf,
    /// The payment provider the instances pay through: it calls them back,
    /// late, out of order and often twice.
    provider: crate::payments::Simulator,
    webhook_secret: String,
}

/// The API key the chaos run's instances present to its provider.
const PROVIDER_API_KEY: &str = "sk_chaos";

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One `seckill serve` process.
struct Instance {
    port: u16,
    log: PathBuf,
    child: Option<tokio::process::Child>,
}

impl Deployment {
    async fn start(args: &ChaosArgs) -> anyhow::Result<Self> {
        let (ca, ca_dir) = if args.tls {
            let dir = std::env::temp_dir().join(format!("seckill-chaos-ca-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            let ca = launcher::TestCa::create(&dir)?;
            (Some(Arc::new(ca)), Some(TempDir(dir)))
        } else {
            (None, None)
        };
        let mut options = launcher::ServerOptions::default().with_aof("always");
        if let Some(ca) = &ca {
            options.transport = launcher::Transport::Tcp;
            options.tls = Some(ca.server_options(false));
        }
        let redis = blocking(move || launcher::RedisServer::try_start_with(options)).await?;
        let (postgres, database_url, sqlite_dir) = match args.database {
            ChaosDatabase::Postgres => {
                let pg = match &ca {
                    Some(ca) => {
                        let ca = ca.clone();
                        blocking(move || launcher::PostgresServer::try_start_with_tls(&ca)).await?
                    }
                    None => blocking(launcher::PostgresServer::try_start).await?,
                };
                let url = pg.tls_url().unwrap_or_else(|| pg.url());
                (Some(Arc::new(std::sync::Mutex::new(pg))), url, None)
            }
            ChaosDatabase::Sqlite => {
                let dir =
                    std::env::temp_dir().join(format!("seckill-chaos-{}", std::process::id()));
                std::fs::create_dir_all(&dir)?;
                let url = format!("sqlite://{}/chaos.db", dir.display());
                (None, url, Some(TempDir(dir)))
            }
        };
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
        let webhook_secret = format!("whsec-chaos-{:x}", nanos);
        let provider = crate::payments::Simulator::spawn(
            PROVIDER_API_KEY,
            &webhook_secret,
            &[
                "--delay-ms",
                "100",
                "--reorder-ms",
                "300",
                "--duplicate",
                "0.3",
                "--forge",
                "0.05",
            ],
        )
        .await?;
        let mut deployment = Self {
            redis_url: redis.url(),
            redis: Arc::new(std::sync::Mutex::new(redis)),
            postgres,
            database_url,
            instances: Vec::new(),
            secret: format!("chaos-{:x}-{:x}", std::process::id(), nanos),
            ca,
            _sqlite_dir: sqlite_dir,
            _ca_dir: ca_dir,
            seckill: service_binary(args.seckill_bin.as_deref())?,
            provider,
            webhook_secret,
        };
        for i in 0..args.instances {
            deployment.instances.push(Instance {
                port: launcher::free_tcp_port(),
                log: args.out.join(format!("instance-{i}.log")),
                child: None,
            });
            deployment.spawn(i)?;
        }
        for i in 0..args.instances {
            deployment.wait_healthy(i).await?;
        }
        let bases: Vec<String> = (0..args.instances).map(|i| deployment.base(i)).collect();
        deployment.provider.call_back(&bases).await?;
        Ok(deployment)
    }

    fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.instances[i].port)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let exe = self.seckill.clone();
        let instance = &self.instances[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&instance.log)
            .with_context(|| format!("opening {}", instance.log.display()))?;
        let mut command = tokio::process::Command::new(exe);
        command.args(["serve", "--redis-url", &self.redis_url]);
        if let Some(ca) = &self.ca {
            command.arg("--redis-tls-ca-file").arg(ca.ca_file());
        }
        let child = command
            .args(["--database-url", &self.database_url])
            .args(["--listen", &format!("127.0.0.1:{}", instance.port)])
            .args(["--consumer", &format!("chaos-{i}")])
            .args([
                "--reclaim-idle-ms",
                "1000",
                "--ip-rate",
                "0",
                "--max-connections-per-address",
                "10000",
                "--user-rate",
                "0",
            ])
            .args(["--payment-provider", &self.provider.base])
            .env("SECKILL_TOKEN_SECRET", &self.secret)
            .env("SECKILL_PAYMENT_API_KEY", PROVIDER_API_KEY)
            .env("SECKILL_PAYMENT_WEBHOOK_SECRET", &self.webhook_secret)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting seckill serve")?;
        self.instances[i].child = Some(child);
        Ok(())
    }

    async fn wait_healthy(&self, i: usize) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http
                .get(format!("{}/healthz", self.base(i)))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "instance {i} did not answer /healthz within 60 s (see {})",
                self.instances[i].log.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Strikes `fault` and repairs it; `phase` picks the instance to kill.
    async fn strike(&mut self, fault: Fault, phase: usize) -> anyhow::Result<String> {
        Ok(match fault {
            Fault::None => "nothing".into(),
            Fault::KillInstance => {
                let i = phase % self.instances.len();
                if let Some(mut child) = self.instances[i].child.take() {
                    child.start_kill()?;
                    child.wait().await?;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.spawn(i)?;
                self.wait_healthy(i).await?;
                format!("instance {i} SIGKILLed, back after 1 s")
            }
            Fault::RestartRedis => {
                let redis = self.redis.clone();
                blocking(move || lock(&redis).try_restart()).await?;
                "Redis SIGKILLed and restarted on its append-only file".into()
            }
            Fault::RestartDatabase => match &self.postgres {
                Some(pg) => {
                    let pg = pg.clone();
                    blocking(move || {
                        lock(&pg).stop(true);
                        std::thread::sleep(Duration::from_secs(1));
                        lock(&pg).try_restart()
                    })
                    .await?;
                    "PostgreSQL SIGKILLed, restarted 1 s later".into()
                }
                None => "nothing (SQLite is a file)".into(),
            },
            Fault::PauseRedis => {
                lock(&self.redis).pause();
                tokio::time::sleep(Duration::from_secs(2)).await;
                lock(&self.redis).resume();
                "Redis frozen for 2 s".into()
            }
            // Struck after the load (see `order_life_phase`).
            Fault::OrderLife => "nothing during the load".into(),
        })
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a blocking launcher call off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, launcher::LaunchError> + Send + 'static,
) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f).await??)
}

/// Runs the chaos; `Ok(false)` if anything was lost, duplicated, oversold
/// or answered with a 5xx other than 503.
///
/// # Errors
/// Bad options, a deployment that does not start, a report that cannot be
/// written.
pub async fn run(args: ChaosArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        (1..=16).contains(&args.instances),
        "--instances must be between 1 and 16"
    );
    anyhow::ensure!(
        args.rate.is_finite() && (1.0..=100_000.0).contains(&args.rate),
        "--rate must be between 1 and 100,000"
    );
    let phase_len = args.duration / FAULTS.len() as u32;
    anyhow::ensure!(
        phase_len >= Duration::from_secs(4),
        "--duration must give each of the {} phases at least 4 s",
        FAULTS.len()
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    println!(
        "chaos: {} instance(s), Redis (AOF always), {:?}{}, {} purchases/s, {} phases of {}",
        args.instances,
        args.database,
        if args.tls { ", both over TLS only" } else { "" },
        args.rate,
        FAULTS.len(),
        humantime::format_duration(phase_len)
    );
    let mut deployment = Deployment::start(&args).await?;
    let tokens = Tokens::new(deployment.secret.as_bytes())?;
    let redis_tls = seckill::store::RedisTls {
        ca_file: deployment.ca.as_ref().map(|ca| ca.ca_file()),
        ..seckill::store::RedisTls::default()
    };
    let stores = Stores::connect(
        Some(&deployment.redis_url),
        &redis_tls,
        Some(&deployment.database_url),
        "seckill",
    )
    .await?;
    let phase_requests = (args.rate * phase_len.as_secs_f64()) as i64;
    let stock = (phase_requests * 6 / 10).max(1);
    let users = (phase_requests as u64 * 2).max(1);
    let user_tokens: Arc<Vec<String>> = Arc::new(
        (1..=users as i64)
            .map(|u| tokens.mint(Principal::User(u), Duration::from_secs(24 * 3600)))
            .collect(),
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut rows = Vec::new();
    for (phase, &fault) in FAULTS.iter().enumerate() {
        let pay_within = (fault == Fault::OrderLife).then_some(ORDER_LIFE_WINDOW);
        let voucher = create_voucher(&http, &deployment, &tokens, stock, pay_within).await?;
        let dead_letters_before = stores.dead_letters().await.unwrap_or(0);
        let plan = Plan {
            targets: (0..args.instances)
                .map(|i| format!("{}/api/vouchers/{voucher}/seckill", deployment.base(i)))
                .collect(),
            user_tokens: user_tokens.clone(),
            arrival: Arrival::Open {
                rate: args.rate,
                max_in_flight: 4_096,
            },
            until: Until::Elapsed(phase_len),
        };
        let load = tokio::spawn(load::run(http.clone(), plan, Arc::new(Progress::default())));
        tokio::time::sleep(phase_len / 4).await;
        let struck = Instant::now();
        let what = deployment.strike(fault, phase).await?;
        let repaired_in = struck.elapsed();
        let record = load.await?;
        let mut row = account(
            &stores,
            Sale {
                voucher,
                stock,
                record: &record,
                returned: 0,
            },
            fault,
            dead_letters_before,
        )
        .await;
        let what = if fault == Fault::OrderLife {
            let life = OrderLifePhase {
                voucher,
                stock,
                first_new_user: users as i64 + 1,
                concurrency: 64,
            };
            order_life_phase(
                &mut deployment,
                &http,
                &tokens,
                &stores,
                &record,
                &life,
                &mut row,
            )
            .await?
        } else {
            what
        };
        println!(
            "phase {} ({}): {what} (done in {:.1?}); {} requests, {} accepted, {} unknown, {} stored",
            phase + 1,
            fault.name(),
            repaired_in,
            row.requests,
            row.accepted,
            row.unknown,
            row.stored
        );
        rows.push(row);
    }
    print_table(&rows);
    let room = room::run(&mut deployment, &http, &tokens).await?;
    println!(
        "waiting room: {} people ticketed, {} places lost after {}; {} purchases without a pass sent, {} accepted; {} units bought with a pass",
        room.ticketed, room.lost_places, room.struck, room.passless_sent, room.passless_accepted, room.bought
    );
    let clean = rows.iter().all(Row::clean) && room.clean();
    let path = args.out.join("chaos-report.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&serde_json::json!({
            "instances": args.instances,
            "rate": args.rate,
            "database": format!("{:?}", args.database),
            "phase_s": phase_len.as_secs_f64(),
            "phases": rows,
            "waiting_room": room,
            "clean": clean,
        }))?,
    )
    .with_context(|| format!("writing {}", path.display()))?;
    println!("report: {}", path.display());
    println!(
        "{}",
        if clean {
            "nothing lost, duplicated or oversold; no 5xx but 503"
        } else {
            "CHAOS FOUND A FAULT"
        }
    );
    Ok(clean)
}

/// The payment window of the order-life phase's voucher.
const ORDER_LIFE_WINDOW: Duration = Duration::from_secs(2);

/// What the order-life phase sells and to whom.
struct OrderLifePhase {
    voucher: i64,
    stock: i64,
    first_new_user: i64,
    concurrency: usize,
}

/// The order-life phase after its load: the buyer model on the accepted
/// orders while an instance is killed, then Redis and the database are
/// restarted; its checks go into `row`. What was struck.
async fn order_life_phase(
    deployment: &mut Deployment,
    http: &reqwest::Client,
    tokens: &Tokens,
    stores: &Stores,
    record: &Record,
    phase: &OrderLifePhase,
    row: &mut Row,
) -> anyhow::Result<String> {
    let plan = crate::bench::after_sale::AfterSalePlan {
        bases: (0..deployment.instances.len())
            .map(|i| deployment.base(i))
            .collect(),
        voucher: phase.voucher,
        model: crate::bench::after_sale::BuyerModel::new(0.5, 0.2)?.with_after_payment(0.1, 0.2)?,
        rounds: 3,
        pay_within: ORDER_LIFE_WINDOW,
        concurrency: phase.concurrency,
        first_new_user: phase.first_new_user,
    };
    let strikes = async {
        let mut done = Vec::new();
        for fault in [
            Fault::KillInstance,
            Fault::RestartRedis,
            Fault::RestartDatabase,
        ] {
            tokio::time::sleep(Duration::from_millis(700)).await;
            done.push(deployment.strike(fault, 0).await?);
        }
        anyhow::Ok(done.join("; "))
    };
    let (outcome, struck) = tokio::join!(
        crate::bench::after_sale_run(http, tokens, &plan, record, stores, phase.stock),
        strikes
    );
    let struck = struck?;
    if let Some(figures) = outcome.figures {
        row.given_back = figures.states.returned() as u64;
        if let Some((redis_stock, redis_returned)) = figures.redis {
            row.returned_twice = (redis_returned as u64).saturating_sub(row.given_back)
                + (redis_stock - figures.db_stock).max(0) as u64;
        }
    }
    // The money, against the provider's own ledger, once its last
    // callbacks are acknowledged.
    let mut checks = outcome.checks;
    let ledger = deployment
        .provider
        .settled_ledger(Duration::from_secs(60))
        .await?;
    if let Some(orders) = stores.order_money(phase.voucher).await? {
        let (money, lines) = crate::bench::checks::money_checks(&ledger, &orders);
        for line in lines {
            println!("{line}");
        }
        checks.extend(money);
    }
    // Answers lost to the faults were asked again; what is left is what
    // the stores show.
    let failed: Vec<String> = checks
        .into_iter()
        .filter(|c| !c.held)
        .map(|c| c.name)
        .collect();
    row.checks_hold &= failed.is_empty();
    row.failed_checks.extend(failed);
    Ok(format!(
        "after the load, while buyers paid (by callback), cancelled, let orders expire, had them refunded and redeemed: {struck}"
    ))
}

/// Creates the phase's voucher, retrying while the deployment recovers
/// from the previous phase's fault.
async fn create_voucher(
    http: &reqwest::Client,
    deployment: &Deployment,
    tokens: &Tokens,
    stock: i64,
    pay_within: Option<Duration>,
) -> anyhow::Result<i64> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match crate::bench::create_voucher(http, &deployment.base(0), tokens, stock, pay_within)
            .await
        {
            Ok(id) => return Ok(id),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "creating the voucher failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The phase's row: answers against the stores.
async fn account(stores: &Stores, sale: Sale<'_>, fault: Fault, dead_letters_before: i64) -> Row {
    let record: &Record = sale.record;
    let verified = stores
        .verify_or_report(sale, Duration::from_secs(60), dead_letters_before)
        .await;
    let stored = stores.orders(sale.voucher).await.unwrap_or_default();
    let stored_ids: std::collections::HashSet<i64> = stored.iter().map(|(id, ..)| *id).collect();
    // Orders given back (not paid in time, cancelled) hold no unit.
    let live: Vec<i64> = stored
        .iter()
        .filter(|(.., given_back)| !given_back)
        .map(|(_, user, _)| *user)
        .collect();
    let users: std::collections::HashSet<i64> = live.iter().copied().collect();
    let sale = Sale {
        returned: verified.returned,
        ..sale
    };
    let mut failed_checks: Vec<String> = checks::from_answers(sale)
        .into_iter()
        .chain(verified.checks)
        // Requests fail under faults by design; what they did is what counts.
        .filter(|c| !c.held && c.name != "no request failed")
        .map(|c| c.name)
        .collect();
    failed_checks.dedup();
    let other_5xx = record
        .outcomes
        .iter()
        .filter(|(k, _)| k.starts_with("error: HTTP 5") && k.as_str() != "error: HTTP 503")
        .map(|(_, n)| n)
        .sum();
    Row {
        fault,
        voucher: sale.voucher,
        stock: sale.stock,
        requests: record.requests(),
        accepted: record.orders.len() as u64,
        unavailable: record.count("error: HTTP 503"),
        not_sent: record.count("error: connect"),
        unknown: record.unknown_users.len() as u64,
        stored: stored.len() as u64,
        unknown_stored: verified.unknown_stored.unwrap_or(0),
        lost: record
            .orders
            .iter()
            .filter(|o| !stored_ids.contains(&o.order_id))
            .count() as u64,
        duplicated: (live.len() - users.len()) as u64,
        oversold: (live.len() as i64 - sale.stock).max(0) as u64,
        other_5xx,
        given_back: 0,
        returned_twice: 0,
        checks_hold: failed_checks.is_empty(),
        failed_checks,
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "\n{:<17} {:>8} {:>8} {:>6} {:>8} {:>8} {:>7} {:>7} {:>5} {:>5} {:>8} {:>9} {:>6} {:>6} {:>6}",
        "fault",
        "requests",
        "accepted",
        "503",
        "not sent",
        "unknown",
        "stored",
        "unk.st",
        "lost",
        "dup",
        "oversold",
        "other 5xx",
        "back",
        "twice",
        "checks"
    );
    for r in rows {
        println!(
            "{:<17} {:>8} {:>8} {:>6} {:>8} {:>8} {:>7} {:>7} {:>5} {:>5} {:>8} {:>9} {:>6} {:>6} {:>6}",
            r.fault.name(),
            r.requests,
            r.accepted,
            r.unavailable,
            r.not_sent,
            r.unknown,
            r.stored,
            r.unknown_stored,
            r.lost,
            r.duplicated,
            r.oversold,
            r.other_5xx,
            r.given_back,
            r.returned_twice,
            if r.checks_hold { "ok" } else { "FAILED" }
        );
        for c in &r.failed_checks {
            println!("  failed: {c}");
        }
    }
}
