//! Lease renewal: one task per client renews every lock held in watchdog
//! mode, `renew_batch` locks per script call, every third of the watchdog
//! timeout.
//!
//! A renewal that finds a lock gone or owned by someone else marks that hold
//! lost (guards observe it through `Guard::lost` / `Guard::is_lost`). A
//! renewal that fails because Redis is unreachable marks nothing: the next
//! period tries again, and if the lease ran out meanwhile, that renewal finds
//! the lock gone.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use futures_util::future::join_all;
use tokio::sync::watch;

use crate::client::Shared;
use crate::holds::HoldState;
use crate::scripts::RENEW;

pub(crate) async fn run(shared: Weak<Shared>, mut shutdown: watch::Receiver<()>) {
    let period = match shared.upgrade() {
        Some(s) => s.settings.renew_period(),
        None => return,
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        renew_all(&shared).await;
    }
}

async fn renew_all(shared: &Shared) {
    let holds = shared.holds.watchdog_holds();
    if holds.is_empty() {
        return;
    }
    let lease_ms = shared.watchdog_lease_ms;
    let batches = holds.chunks(shared.settings.renew_batch).map(|batch| {
        let mut conn = shared.conn.clone();
        async move {
            let mut invocation = RENEW.prepare_invoke();
            invocation.arg(lease_ms);
            for hold in batch {
                invocation.key(&*hold.keys.lock).arg(hold.owner.id());
            }
            shared.stats.renew_calls.fetch_add(1, Ordering::Relaxed);
            match invocation.invoke_async::<Vec<i64>>(&mut conn).await {
                Ok(renewed) => mark_lost(batch, &renewed),
                Err(e) => tracing::warn!(error = %e, locks = batch.len(), "lease renewal failed"),
            }
        }
    });
    join_all(batches).await;
}

fn mark_lost(batch: &[Arc<HoldState>], renewed: &[i64]) {
    for (hold, ok) in batch.iter().zip(renewed) {
        if *ok == 0 {
            hold.mark_lost();
        }
    }
}
