//! hasp under faults: every line of the "Faults" section of
//! `docs/guarantees.md` (cited as "faults N"), and the
//! regressions of the four defects the faults exposed, against
//! real redis-server processes with real faults: a TCP proxy that delays,
//! holds or closes connections, SIGSTOP/SIGKILL of servers and of client
//! processes, restarts with and without persistence, `DEBUG SLEEP`,
//! `CLIENT KILL`, lease truncation and replica promotion.
//!
//! Every scenario is bounded: it runs inside [`bounded`] (a few seconds, 60
//! at most) and its servers and child processes stop when it ends (faults
//! 3).

use hasp_testkit as helpers;

mod child;
mod defects;
mod detection;
mod fencing;
mod harness;
mod mix;
mod outcomes;
mod plain;

use std::future::Future;
use std::time::Duration;

use hasp::{Client, Settings};
use testkit::FaultProxy;

/// Runs a scenario with a hard time limit (faults 3).
pub async fn bounded<T>(limit: Duration, scenario: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, scenario)
        .await
        .unwrap_or_else(|_| panic!("the scenario ran past its bound of {limit:?}"))
}

/// A client whose connections go through a fault proxy in front of the
/// scenario's server, with short time-outs and the given watchdog timeout,
/// its connections made (the batch connection is made on first use).
pub async fn through_proxy(ctx: &helpers::Ctx, watchdog: Duration) -> (FaultProxy, Client) {
    let proxy = FaultProxy::start(ctx.server());
    let settings = Settings::default()
        .set_watchdog_timeout(watchdog)
        .set_response_timeout(Duration::from_millis(300))
        .set_connection_timeout(Duration::from_millis(300));
    let client = Client::open_with(&proxy.url(), settings).await.unwrap();
    let warm = client.lock("warm-up").unwrap();
    warm.lock().await.unwrap().unlock().await.unwrap();
    (proxy, client)
}
