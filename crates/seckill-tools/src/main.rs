//! `seckill-tools`: the flash-sale service's demo, load tester, chaos run
//! and oversell lab — kept out of the `seckill` service binary, which
//! depends on nothing it does not serve with.

use clap::{Parser, Subcommand};

mod bench;
mod chaos;
mod demo;
mod lab;
mod payments;
mod watch;

#[derive(Parser)]
#[command(
    version,
    about = "Demo, load tester, chaos run, oversell lab and watchers of the seckill service"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole flash sale on this machine and verify it.
    Demo(demo::DemoArgs),
    /// Load-test running service instances: report, charts, invariants.
    Bench(Box<bench::BenchArgs>),
    /// A private deployment under load while faults strike (instances
    /// killed, Redis and the database restarted, Redis paused); then
    /// nothing may be lost, duplicated or oversold.
    Chaos(chaos::ChaosArgs),
    /// The oversell walk: the same sale against eight strategies, from the naive to the safe.
    Lab(lab::LabArgs),
    /// Many pages watching an instance's live stream at once.
    Watch(watch::WatchArgs),
    /// A payment provider to test against: takes charges and calls the
    /// service back, signed, with switches for duplicates, reordering,
    /// lost callbacks, declines and forged signatures.
    Payments(payments::PaymentsArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "seckill=info,hasp=warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let passed = match cli.command {
        Command::Demo(args) => demo::run(args).await?,
        Command::Bench(args) => bench::run(*args).await?,
        Command::Chaos(args) => chaos::run(args).await?,
        Command::Lab(args) => lab::run(args).await?,
        Command::Watch(args) => watch::run(args).await?,
        Command::Payments(args) => payments::run(args).await?,
    };
    if !passed {
        // The report says which invariant failed.
        std::process::exit(1);
    }
    Ok(())
}
