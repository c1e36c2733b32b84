//! `seckill`: the flash-sale service's command line.

use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use seckill::auth::{Principal, SigningKey, Tokens};

use seckill::service::Service;
use seckill::settings::Storage;

mod config;

use config::ServeArgs;

#[derive(Parser)]
#[command(version, about = "A flash-sale service on Redis and hasp")]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "SECKILL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per event (for log shippers).
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API and consume the order pipeline.
    Serve(ServeArgs),
    /// Mint a development bearer token: a JWT signed with the shared
    /// secret (HS256, issuer `seckill`), or with a local key (ES256 or
    /// EdDSA) under a key id a JWKS the service reads can name.
    Token {
        /// User id (omit with --admin).
        #[arg(long, required_unless_present = "admin")]
        user: Option<i64>,
        /// An operator's token instead.
        #[arg(long)]
        admin: bool,
        /// Validity in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl: u64,
        /// Signing secret (HS256).
        #[arg(long, env = "SECKILL_TOKEN_SECRET", hide_env_values = true, value_parser = seckill::settings::secret, required_unless_present = "signing_key_file")]
        token_secret: Option<secrecy::SecretString>,
        /// Sign with this PKCS#8 PEM private key (P-256 or Ed25519) instead.
        #[arg(long, requires_all = ["kid", "issuer"])]
        signing_key_file: Option<std::path::PathBuf>,
        /// The key id (kid) of --signing-key-file in the service's JWKS.
        #[arg(long)]
        kid: Option<String>,
        /// The issuer (iss) the service expects (--jwt-issuer).
        #[arg(long)]
        issuer: Option<String>,
        /// The audience (aud) the service expects of a provider's token (--jwt-audience) [default: seckill].
        #[arg(long, default_value = "seckill")]
        audience: String,
        /// The first format (v1.<role>.<user>.<expiry>.<hmac>) instead, for a change-over.
        #[arg(long)]
        legacy: bool,
    },
    /// Apply the database migrations and exit.
    Migrate(ServeArgs),
    /// Compare Redis with the database for every voucher; exit 1 on any
    /// difference.
    Reconcile {
        /// Apply the safe fixes (missing buyers, Redis stock above the database's).
        #[arg(long)]
        repair: bool,
        #[command(flatten)]
        settings: ServeArgs,
    },
}

/// See the `mimalloc` feature in Cargo.toml.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "seckill=info,hasp=warn".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Token {
            user,
            admin,
            ttl,
            token_secret,
            signing_key_file,
            kid,
            issuer,
            audience,
            legacy,
        } => {
            let who = match (admin, user) {
                (true, _) => Principal::Admin,
                (false, Some(id)) if id > 0 => Principal::User(id),
                _ => anyhow::bail!("--user must be a positive id"),
            };
            let ttl = Duration::from_secs(ttl);
            let token = match (signing_key_file, token_secret) {
                (Some(file), _) => {
                    let pem = std::fs::read(&file)
                        .with_context(|| format!("reading {}", file.display()))?;
                    let key = SigningKey::from_pem(&pem, kid.unwrap_or_default())?;
                    key.mint(who, ttl, &issuer.unwrap_or_default(), &audience)?
                }
                (None, Some(secret)) => {
                    let tokens =
                        Tokens::new(secrecy::ExposeSecret::expose_secret(&secret).as_bytes())?;
                    match legacy {
                        true => tokens.mint_legacy(who, ttl)?,
                        false => tokens.try_mint(who, ttl)?,
                    }
                }
                (None, None) => anyhow::bail!("give --token-secret or --signing-key-file"),
            };
            println!("{token}");
            Ok(())
        }
        Command::Migrate(args) => {
            let database_url = args.storage()?.database_url;
            seckill::db::Database::connect(&database_url)
                .await?
                .migrate()
                .await?;
            eprintln!("migrations applied to {database_url}");
            Ok(())
        }
        Command::Reconcile { repair, settings } => {
            let storage = settings.storage()?;
            if reconcile_all(&storage, repair).await? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let service = Service::start(args.resolve()?).await?;
    eprintln!("seckill listening on http://{}", service.addr());
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    eprintln!("shutting down: finishing requests and draining the order pipeline");
    service.stop().await
}

/// Reconciles every voucher; true if all agree (after repairs, if asked).
async fn reconcile_all(storage: &Storage, repair: bool) -> anyhow::Result<bool> {
    let (redis_url, database_url, prefix) = (
        &storage.redis_url,
        &storage.database_url,
        storage.prefix.as_str(),
    );
    use seckill::reconcile;
    use seckill::repair::{SaleRepair, Scope};
    use seckill::store::{FastPath, OrderIdGenerator, Redis};
    let db = seckill::db::Database::connect(database_url).await?;
    let redis = Redis::new(
        seckill::store::connect_with(redis_url, &storage.redis_tls).await?,
        prefix,
    );
    // The service's own repair: restores a sale Redis lost, repairs one
    // behind the database, under the lock the instances use.
    let repairs = SaleRepair::new(
        std::sync::Arc::new(FastPath::new(
            redis.clone(),
            OrderIdGenerator::new(redis.clone(), 1)?,
        )),
        db.clone(),
        seckill::store::lock_client(redis_url, &storage.redis_tls, hasp::Settings::default())
            .await?,
        None,
    );
    let mut consistent = true;
    for voucher in db.voucher_ids().await? {
        let mut found = reconcile::reconcile(&redis, &db, voucher).await?;
        if repair && !found.is_consistent() {
            let done = repairs.run(Scope::Voucher(voucher)).await?;
            println!(
                "voucher {voucher}: {} restored, {} repaired",
                done.restored, done.repaired
            );
            found = reconcile::reconcile(&redis, &db, voucher).await?;
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
