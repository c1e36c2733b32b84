//! `seckill`: the flash-sale service's command line.

use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use seckill::auth::{Principal, Tokens};

use seckill::http::Limit;
use seckill::service::{Mode, Service, ServiceConfig};

mod demo;

use demo::DemoArgs;

#[derive(Parser)]
#[command(version, about = "A flash-sale service on Redis and hasp")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API and consume the order pipeline.
    Serve(ServeArgs),
    /// Mint a bearer token.
    Token {
        /// User id (omit with --admin).
        #[arg(long, required_unless_present = "admin")]
        user: Option<i64>,
        /// An admin token instead.
        #[arg(long)]
        admin: bool,
        /// Validity in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl: u64,
        /// Signing secret.
        #[arg(long, env = "SECKILL_TOKEN_SECRET", hide_env_values = true)]
        token_secret: String,
    },
    /// Run a whole flash sale on this machine and verify it.
    Demo(DemoArgs),
    /// Compare Redis with the database for every voucher; exit 1 on any
    /// difference.
    Reconcile {
        /// Redis URL.
        #[arg(
            long,
            env = "SECKILL_REDIS_URL",
            default_value = "redis://127.0.0.1:6379/"
        )]
        redis_url: String,
        /// Database URL.
        #[arg(
            long,
            env = "SECKILL_DATABASE_URL",
            default_value = "sqlite://data/seckill.db"
        )]
        database_url: String,
        /// Apply the safe fixes (missing buyers, Redis stock above the database's).
        #[arg(long)]
        repair: bool,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Redis URL.
    #[arg(
        long,
        env = "SECKILL_REDIS_URL",
        default_value = "redis://127.0.0.1:6379/"
    )]
    redis_url: String,
    /// Database URL: sqlite://FILE, postgres://…, mysql://…
    #[arg(
        long,
        env = "SECKILL_DATABASE_URL",
        default_value = "sqlite://data/seckill.db"
    )]
    database_url: String,
    /// Listen address.
    #[arg(long, env = "SECKILL_LISTEN", default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Secret signing bearer tokens (at least 16 bytes).
    #[arg(long, env = "SECKILL_TOKEN_SECRET", hide_env_values = true)]
    token_secret: String,
    /// Purchase path.
    #[arg(long, env = "SECKILL_MODE", value_enum, default_value_t = Mode::Async)]
    mode: Mode,
    /// Consumer name of this instance in the order pipeline.
    #[arg(long, env = "SECKILL_CONSUMER")]
    consumer: Option<String>,
    /// Take over pipeline entries left pending this long by a dead instance.
    #[arg(long, env = "SECKILL_RECLAIM_IDLE_MS", default_value_t = 30_000)]
    reclaim_idle_ms: u64,
    /// Purchases per second per user (burst twice that; 0 = unlimited).
    #[arg(long, env = "SECKILL_USER_RATE", default_value_t = 5)]
    user_rate: u32,
    /// Requests per second per client IP (burst twice that; 0 = unlimited).
    #[arg(long, env = "SECKILL_IP_RATE", default_value_t = 2_000)]
    ip_rate: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "seckill=info,hasp=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Serve(args) => serve(args).await,
        Command::Token {
            user,
            admin,
            ttl,
            token_secret,
        } => {
            let tokens = Tokens::new(token_secret.as_bytes())?;
            let who = match (admin, user) {
                (true, _) => Principal::Admin,
                (false, Some(id)) if id > 0 => Principal::User(id),
                _ => anyhow::bail!("--user must be a positive id"),
            };
            println!("{}", tokens.mint(who, Duration::from_secs(ttl)));
            Ok(())
        }
        Command::Reconcile {
            redis_url,
            database_url,
            repair,
        } => {
            if reconcile_all(&redis_url, &database_url, repair).await? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Command::Demo(args) => {
            if demo::run(args).await? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let consumer = args
        .consumer
        .unwrap_or_else(|| format!("seckill-{}", std::process::id()));
    let service = Service::start(ServiceConfig {
        redis_url: args.redis_url,
        database_url: args.database_url,
        listen: args.listen,
        token_secret: args.token_secret,
        mode: args.mode,
        prefix: "seckill".into(),
        consumer,
        reclaim_idle: Duration::from_millis(args.reclaim_idle_ms),
        user_limit: Limit::per_second(args.user_rate),
        ip_limit: Limit::per_second(args.ip_rate),
    })
    .await?;
    eprintln!("seckill listening on http://{}", service.addr());
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    eprintln!("shutting down: finishing requests and draining the order pipeline");
    service.stop().await
}

/// Reconciles every voucher; true if all agree (after repairs, if asked).
async fn reconcile_all(redis_url: &str, database_url: &str, repair: bool) -> anyhow::Result<bool> {
    use seckill::reconcile;
    let db = seckill::db::Database::connect(database_url).await?;
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(redis_url)?).await?;
    let mut consistent = true;
    for voucher in db.voucher_ids().await? {
        let mut found = reconcile::reconcile(&conn, &db, "seckill", voucher).await?;
        if repair && !found.is_consistent() {
            let changes = reconcile::repair(&conn, "seckill", &found).await?;
            println!("voucher {voucher}: {changes} repairs applied");
            found = reconcile::reconcile(&conn, &db, "seckill", voucher).await?;
        }
        for difference in found.differences() {
            println!("{difference}");
        }
        println!(
            "voucher {voucher}: {} (Redis stock {:?}, database stock {:?}, {} orders, {} in the pipeline)",
            if found.is_consistent() { "consistent" } else { "DIFFERENT" },
            found.redis_stock,
            found.db_stock,
            found.db_orders,
            found.in_stream
        );
        consistent &= found.is_consistent();
    }
    Ok(consistent)
}
