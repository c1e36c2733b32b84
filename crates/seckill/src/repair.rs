//! Self-repair of a sale's Redis state after Redis lost it.
//!
//! Redis can lose or roll back the fast path's state: a restart without
//! persistence, a restart from an older snapshot, a failover to a replica
//! that had not seen the last writes, an eviction. Left alone, the sale
//! answers `unknown_voucher` for a voucher that exists, or sells again units
//! and buyers the database already has. Two signs reach the service:
//!
//! * a purchase answered `NOSCRIPT`: Redis restarted (it does not persist
//!   scripts), so every open sale is verified ([`Scope::Restarted`]);
//! * a purchase of a voucher Redis does not know while the database does:
//!   that sale is verified ([`Scope::Voucher`]).
//!
//! * a Sentinel switch to a master whose data was not verified for its
//!   replication history (`store::verification`): its scripts are flushed,
//!   so its purchases answer `NOSCRIPT` too.
//!
//! After a switch, the orders still in the streams of the master left
//! behind are stored first ([`OrderPipeline::take_over_left_master`]): it
//! took purchases until the switch, and its data is replaced when it is
//! demoted. Verifying a sale, under the `hasp` lock `<prefix>:repair` so
//! that one instance does it at a time:
//!
//! * its hash missing: restored from the database, buyers first (users with
//!   a stored order that holds their one order of the voucher, and those
//!   still in the stream), the orders the database gave back marked as
//!   taken back, then the terms, with stock = database stock − orders in
//!   the stream the database does not have yet ([`FastPath::restore_sale`]);
//! * its hash present: [`reconcile`]'s safe repairs (buyers the database
//!   knows added, a stock above what the database allows lowered).
//!
//! Then the purchase script is loaded again ([`FastPath::arm_all`]), with
//! the replication history the verification was for: the script's
//! presence is what tells every instance that the state was verified for
//! the data the server holds. Purchases answer 503 `sale_repairing` until
//! then.
//!
//! What no repair can bring back: orders Redis accepted and lost before the
//! pipeline stored them (their stream entries are gone). How many a crash
//! can lose depends on Redis' persistence (README, "Durability").
//!
//! No buyer has to find out first: [`keep_verified_until_stopped`] looks at
//! Redis every [`CHECK_EVERY`] ([`FastPath::check`]) and starts a repair
//! when the script is missing or the data changed hands, so a sale is
//! usually verified again before the first purchase after an outage; and
//! purchases refused while Redis was unreachable go on as soon as a look
//! finds it back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::db::Database;
use crate::domain::now_ms;
use crate::error::Result;
use crate::pipeline::OrderPipeline;
use crate::reconcile::{reconcile, repair};
use crate::store::{FastPath, SaleHash};

/// How long an instance waits for another's repair before giving up this
/// attempt (the next purchase that needs one starts another).
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// How long after its end a sale's stream on a master left behind is still
/// read for orders (an order is accepted only while its sale is open).
const LEFT_MASTER_SALES: Duration = Duration::from_secs(600);

/// How often the service looks at Redis in the background while it
/// answers: one `SCRIPT EXISTS`, and on one server or a Sentinel master
/// `INFO replication` and one `GET`.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How often it looks while Redis does not answer.
pub const CHECK_EVERY_WHILE_DOWN: Duration = crate::store::PROBE_INTERVAL;

/// Which sales to verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Redis restarted: every sale not yet ended, and `voucher` (the one a
    /// purchase was refused for, open or not).
    Restarted {
        /// The voucher that revealed the restart.
        voucher: Option<i64>,
    },
    /// One voucher Redis no longer knows.
    Voucher(i64),
}

/// What a repair did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RepairReport {
    /// Sales checked.
    pub verified: usize,
    /// Sales whose Redis state was missing and was restored.
    pub restored: usize,
    /// Sales whose Redis state was behind and was repaired.
    pub repaired: usize,
}

/// Verifies and repairs sale state in Redis against the database.
#[derive(Debug)]
pub struct SaleRepair {
    fast: Arc<FastPath>,
    db: Database,
    locks: hasp::Client,
    running: AtomicBool,
    repairs: Option<prometheus::IntCounterVec>,
    pipeline: Option<Arc<OrderPipeline>>,
}

impl SaleRepair {
    /// Repairs for `fast`'s sales from `db`, one instance at a time by a
    /// lock of `locks`; each repaired sale counted in `repairs` (label
    /// `kind`: `restored` or `repaired`) when given.
    pub fn new(
        fast: Arc<FastPath>,
        db: Database,
        locks: hasp::Client,
        repairs: Option<prometheus::IntCounterVec>,
    ) -> Self {
        Self {
            fast,
            db,
            locks,
            running: AtomicBool::new(false),
            repairs,
            pipeline: None,
        }
    }

    /// Stores the orders left on a master the connection moved away from
    /// through `pipeline` before verifying (see the module docs); without
    /// it they are left there.
    pub fn with_pipeline(mut self, pipeline: Arc<OrderPipeline>) -> Self {
        self.pipeline = Some(pipeline);
        self
    }

    /// Starts a repair of `scope` in the background unless one is running
    /// on this instance; returns at once.
    pub fn start(self: &Arc<Self>, scope: Scope) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.run(scope).await {
                tracing::warn!(error = %e, ?scope, "sale repair failed; the next purchase that needs it retries");
            }
            this.running.store(false, Ordering::Release);
        });
    }

    /// Whether a repair started by [`SaleRepair::start`] is running.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Verifies every open sale, and `voucher`, unless Redis has the
    /// purchase script (then someone did since Redis started). For a
    /// service starting, or a voucher just put on sale.
    ///
    /// # Errors
    /// As [`SaleRepair::run`].
    pub async fn ensure_verified(&self, voucher: Option<i64>) -> Result<Option<RepairReport>> {
        if self.fast.is_armed().await? {
            return Ok(None);
        }
        Ok(Some(self.run(Scope::Restarted { voucher }).await?))
    }

    /// Verifies `scope` now (see the module docs), under the repair lock.
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Database`](crate::Error::Database) if either fails,
    /// [`Error::Lock`](crate::Error::Lock) if the lock cannot be taken within 30 s.
    #[tracing::instrument(skip(self))]
    pub async fn run(&self, scope: Scope) -> Result<RepairReport> {
        let lock = self
            .locks
            .lock(&format!("{}:repair", self.fast.redis().prefix()))?;
        let guard = lock.lock_within(LOCK_WAIT).await?;
        let outcome = self.run_locked(scope).await;
        if let Err(e) = guard.unlock().await {
            tracing::debug!(error = %e, "repair lock release failed; it expires");
        }
        outcome
    }

    async fn run_locked(&self, scope: Scope) -> Result<RepairReport> {
        let scope = match scope {
            // Arming after one sale's verification would let every sale
            // sell on a server whose data was not verified (one that a
            // switch or a restart left without the script meanwhile).
            Scope::Voucher(id) if !self.fast.is_armed().await? => {
                Scope::Restarted { voucher: Some(id) }
            }
            scope => scope,
        };
        let mut history = None;
        let vouchers = match scope {
            Scope::Voucher(id) => vec![id],
            Scope::Restarted { voucher } => {
                // Another instance may have verified while we waited.
                if self.fast.is_armed().await? {
                    return Ok(RepairReport::default());
                }
                history = self.fast.history().await?;
                self.take_over_left_master().await?;
                let mut ids = self.db.open_voucher_ids(now_ms()).await?;
                ids.extend(voucher.filter(|v| !ids.contains(v)));
                ids
            }
        };
        let mut report = RepairReport::default();
        for &id in &vouchers {
            self.verify(id, &mut report).await?;
        }
        // Purchases go on only now (see the module docs). After a restart
        // every open sale is verified: the script goes on every server, also
        // when no sale is open (a purchase of a voucher Redis does not know
        // is then a 404, or the repair of a sale the database has).
        if let Scope::Restarted { .. } = scope {
            self.fast.arm_all(history.as_ref()).await?;
        }
        for &id in &vouchers {
            self.fast.arm(id).await?;
        }
        if report.restored + report.repaired > 0 {
            // Units of lost orders may be back on sale.
            self.fast.forget_sold_out();
        }
        // Only a sale that had to be restored or repaired is worth a warning;
        // a clean check happens at every voucher creation and start-up.
        if report.restored + report.repaired > 0 {
            tracing::warn!(
                ?scope,
                verified = report.verified,
                restored = report.restored,
                repaired = report.repaired,
                "sale state restored from the database"
            );
        } else {
            tracing::debug!(
                ?scope,
                verified = report.verified,
                "sale state verified against the database"
            );
        }
        Ok(report)
    }

    /// Stores what the master left at the last switch still holds.
    async fn take_over_left_master(&self) -> Result<()> {
        let Some(pipeline) = &self.pipeline else {
            return Ok(());
        };
        let Some(left) = self.fast.redis().connection().take_left_master() else {
            return Ok(());
        };
        let since = now_ms() - LEFT_MASTER_SALES.as_millis() as i64;
        let sales = self.db.open_voucher_ids(since).await?;
        let report = pipeline.take_over_left_master(left, &sales).await?;
        if report.handled() > 0 {
            tracing::warn!(
                stored = report.created,
                already_stored = report.already_stored,
                dead_lettered = report.dead_lettered,
                "orders taken over from the Redis master left behind"
            );
        }
        Ok(())
    }

    async fn verify(&self, id: i64, report: &mut RepairReport) -> Result<()> {
        let Some(voucher) = self.db.voucher(id).await? else {
            return Ok(()); // unknown to the database too: nothing to restore
        };
        let found = reconcile(self.fast.redis(), &self.db, id).await?;
        report.verified += 1;
        if found.redis_stock.is_none() {
            // Redis lost its returns with the sale: every unit the database
            // took back is in the database's stock.
            let pending = found.pending_returns.len() as i64;
            let stock = found.expected_redis_stock.map_or(0, |s| s + pending).max(0);
            // Read after the stock: a return committed since is marked taken
            // back without being in the stock (an unsold unit, never one
            // sold twice).
            let returned: Vec<i64> = self
                .db
                .returned_orders(id)
                .await?
                .into_iter()
                .map(|o| o.order_id)
                .collect();
            let mut buyers: Vec<(i64, i64)> = self
                .db
                .voucher_orders(id)
                .await?
                .into_iter()
                .map(|o| (o.user_id, o.order_id))
                .collect();
            buyers.extend(found.in_stream_orders.iter().copied());
            if self
                .fast
                .restore_sale(
                    id,
                    &SaleHash {
                        stock,
                        begin_ms: voucher.begin_ms,
                        end_ms: voucher.end_ms,
                        rebuy: voucher.rebuy_after_cancel,
                        room: voucher.room.is_some(),
                    },
                    &buyers,
                    &returned,
                )
                .await?
            {
                report.restored += 1;
                self.count("restored");
                tracing::warn!(
                    voucher = id,
                    stock,
                    buyers = buyers.len(),
                    "sale state was missing in Redis; restored from the database"
                );
            }
        } else if !found.is_consistent() {
            let changes = repair(self.fast.redis(), &found).await?;
            if changes > 0 {
                report.repaired += 1;
                self.count("repaired");
                tracing::warn!(voucher = id, changes, differences = ?found.differences(), "sale state in Redis was behind the database; repaired");
            }
        }
        Ok(())
    }

    fn count(&self, kind: &str) {
        if let Some(repairs) = &self.repairs {
            repairs.with_label_values(&[kind]).inc();
        }
    }
}

/// Looks at Redis every [`CHECK_EVERY`] (see the module docs) and starts a
/// repair of every open sale when purchases could not run there, until
/// `stop`.
pub(crate) async fn keep_verified_until_stopped(
    repair: Arc<SaleRepair>,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = CHECK_EVERY;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(every) => {}
        }
        every = match repair.fast.check().await {
            Ok(true) => CHECK_EVERY,
            Ok(false) => {
                repair.start(Scope::Restarted { voucher: None });
                CHECK_EVERY
            }
            Err(e) => {
                tracing::debug!(error = %e, "Redis did not answer the background check");
                CHECK_EVERY_WHILE_DOWN
            }
        };
    }
}
