//! Lease renewal and hold checks: one task per client, the client's single
//! scheduler.
//!
//! Every third of the watchdog timeout the task extends the lease of every
//! hold in watchdog mode (locks, read and write holds, semaphore permits),
//! as `extend` operations through the batcher (so they share its calls: at
//! most `renew_batch` per call). When a connection to
//! Redis is made again after it broke, it checks every hold at once, fixed
//! leases included (faults 5). Holds with a learned lease (`adaptive`)
//! are not renewed every period: each is renewed when its remaining lease
//! falls below its lead, from a schedule ordered by that instant (`holds`),
//! so the task works only for the holds that are due.
//!
//! A renewal that Redis confirms moves the hold's belief end to the instant
//! the round started plus the lease; one that finds the lock gone or held by
//! another owner marks the hold gone at once and re-creates nothing (faults
//! 6); one that fails (Redis unreachable) changes nothing, and the hold
//! is lost when its belief ends.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::{oneshot, watch, Notify};

use super::adaptive::Classes;
use super::batcher::Queue;
use super::holds::{HoldState, Holds, Lease};
use super::wire::{Op, Reply};

/// What the watchdog task works with.
pub(crate) struct Watchdog {
    pub(crate) holds: Arc<Holds>,
    pub(crate) queue: Queue,
    /// The lease of a hold in watchdog mode.
    pub(crate) lease_ms: u64,
    pub(crate) period: Duration,
    /// Notified when a connection to Redis was made again.
    pub(crate) recheck: Arc<Notify>,
    /// Changes (closes) when the client is gone.
    pub(crate) shutdown: watch::Receiver<()>,
    /// The classes of adaptive holds: their current leases.
    pub(crate) classes: Arc<Classes>,
}

impl Watchdog {
    pub(crate) async fn run(mut self) {
        let mut ticker = tokio::time::interval(self.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await; // the first tick is immediate
        loop {
            let next_due = self.holds.next_due();
            let all = tokio::select! {
                _ = ticker.tick() => false,
                () = self.recheck.notified() => true,
                () = sleep_until(next_due) => {
                    self.renew_due();
                    continue;
                }
                () = self.holds.due_sooner.notified() => continue,
                _ = self.shutdown.changed() => return,
            };
            self.round(all).await;
        }
    }

    /// Renews the adaptive holds whose remaining lease fell below their
    /// lead, by their class's current lease; they share the batcher's calls
    /// with everything else. Nothing waits for the replies here: each
    /// reschedules its hold.
    fn renew_due(&self) {
        for hold in self.holds.take_due(Instant::now()) {
            let Lease::Adaptive(class) = hold.lease else {
                continue;
            };
            let lease_ms = self.classes.lease_ms(class);
            let sent_at = Instant::now();
            let op = Op::extend(&hold, Some(lease_ms));
            let holds = self.holds.clone();
            let retry_in = self.classes.learning.renew_floor / 4;
            self.queue.send(
                op,
                Box::new(move |reply| match reply {
                    Ok(Reply::Extended) => {
                        hold.confirm(sent_at, lease_ms);
                        hold.renewed.store(true, Ordering::Release);
                        holds.schedule(&hold, lease_ms);
                    }
                    Ok(_) => hold.mark_gone(),
                    Err(e) => {
                        tracing::warn!(error = %e, lock = %hold.keys.name, "lease renewal failed");
                        // Try again soon while the belief lasts.
                        let again = Instant::now() + retry_in;
                        if again < hold.valid_until() {
                            holds.schedule_at(&hold, again);
                        }
                    }
                }),
            );
        }
    }

    /// Renews the holds in watchdog mode; with `all`, checks the others too.
    async fn round(&self, all: bool) {
        let holds = self.holds.to_renew(all);
        if holds.is_empty() {
            return;
        }
        let sent_at = Instant::now();
        let replies = holds.into_iter().map(|hold| self.extend(hold, sent_at));
        join_all(replies).await;
    }

    fn extend(&self, hold: Arc<HoldState>, sent_at: Instant) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let lease_ms = match hold.lease {
            Lease::Watchdog => Some(self.lease_ms),
            // Checked, not extended (an adaptive hold is extended when due).
            Lease::Fixed(_) | Lease::Adaptive(_) => None,
        };
        let op = Op::extend(&hold, lease_ms);
        self.queue.send(
            op,
            Box::new(move |reply| {
                match reply {
                    Ok(Reply::Extended) => {
                        if let Some(ms) = lease_ms {
                            hold.confirm(sent_at, ms);
                        }
                    }
                    Ok(_) => hold.mark_gone(),
                    Err(e) => {
                        tracing::warn!(error = %e, lock = %hold.keys.name, "lease renewal failed");
                    }
                }
                let _ = tx.send(());
            }),
        );
        rx
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
