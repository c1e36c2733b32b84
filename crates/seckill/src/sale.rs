//! The sales as the API sees them, whichever path decides a purchase: the
//! one place that knows the two paths apart, so handlers never branch on
//! the mode.

use std::sync::Arc;

use crate::db::Database;
use crate::domain::order::{OrderState, StoredOrder};
use crate::domain::purchase::{Purchase, Refusal};
use crate::domain::voucher::SaleTerms;
use crate::error::{Error, Result};
use crate::repair::{SaleRepair, Scope};
use crate::store::{order_in_redis, FastPath};
use crate::sync_path::SyncPath;
use crate::OrderId;

/// A buyer's order as [`Sales::order_of`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderOf {
    /// Stored in the database.
    Stored(StoredOrder),
    /// Known to Redis only: pending (on its way) or failed.
    Unstored(OrderId, OrderState),
}

/// How purchases are decided.
#[derive(Debug, Clone)]
pub enum PurchasePath {
    /// Redis fast path; orders reach the database through the pipeline.
    Async,
    /// Per-user lock around a database transaction.
    Sync(Arc<SyncPath>),
}

/// Purchases, live stock and order status for the API.
#[derive(Debug)]
pub struct Sales {
    path: PurchasePath,
    fast: Arc<FastPath>,
    db: Database,
    repair: Arc<SaleRepair>,
}

impl Sales {
    /// Sales decided by `path`, with the Redis side in `fast` (stock, order
    /// status, repair) and the record in `db`.
    pub fn new(
        path: PurchasePath,
        fast: Arc<FastPath>,
        db: Database,
        repair: Arc<SaleRepair>,
    ) -> Self {
        Self {
            path,
            fast,
            db,
            repair,
        }
    }

    /// What an accepted order is at once: `pending` (on its way to the
    /// database) on the fast path, `reserved` (stored) on the locked path.
    pub fn accepted_state(&self) -> OrderState {
        match self.path {
            PurchasePath::Async => OrderState::Pending,
            PurchasePath::Sync(_) => OrderState::Reserved,
        }
    }

    /// The Redis side of the sale, if purchases are decided there (the
    /// fast path).
    pub fn fast_path(&self) -> Option<&Arc<FastPath>> {
        match self.path {
            PurchasePath::Async => Some(&self.fast),
            PurchasePath::Sync(_) => None,
        }
    }

    /// Puts voucher `id`, just stored in the database, on sale in Redis
    /// (behind a waiting room if `room`: a purchase then needs a pass). A
    /// Redis failure is not the caller's: the voucher exists, and its first
    /// purchase restores the sale (`repair`).
    pub async fn open(&self, id: i64, terms: &SaleTerms, room: bool) {
        if let Err(e) = self.fast.load_voucher_with_room(id, terms, room).await {
            tracing::warn!(voucher = id, error = %e, "voucher created; Redis will get its sale on the first purchase");
        } else if matches!(self.path, PurchasePath::Async) {
            // A Redis that restarted since its state was last verified is
            // verified now, before this sale can be bought from.
            if let Err(e) = self.repair.ensure_verified(Some(id)).await {
                tracing::warn!(voucher = id, error = %e, "sale state not verified; the first purchase will");
            }
        }
    }

    /// Buys voucher `voucher` for `user`.
    ///
    /// # Errors
    /// As the path's purchase; on the fast path [`Error::SaleUnverified`]
    /// also when Redis lost this sale's state (its repair is started).
    pub async fn purchase(&self, voucher: i64, user: i64) -> Result<Purchase> {
        self.purchase_with_pass(voucher, user, false).await
    }

    /// [`Sales::purchase`] by a buyer who showed a valid waiting-room pass
    /// (`passed`): a sale with a room refuses a purchase without one.
    ///
    /// # Errors
    /// As [`Sales::purchase`].
    pub async fn purchase_with_pass(
        &self,
        voucher: i64,
        user: i64,
        passed: bool,
    ) -> Result<Purchase> {
        // The paths a purchase rarely takes are boxed: a future is as large
        // as its largest state, and every request moves it several times
        // on its way through the router.
        if let PurchasePath::Sync(sync) = &self.path {
            return Box::pin(sync.purchase_with_pass(voucher, user, passed)).await;
        }
        match self.fast.purchase_with_pass(voucher, user, passed).await {
            Err(Error::SaleUnverified) => {
                self.repair.start(Scope::Restarted {
                    voucher: Some(voucher),
                });
                Err(Error::SaleUnverified)
            }
            Ok(Purchase::Refused(Refusal::UnknownVoucher))
                if Box::pin(self.db.voucher_window(voucher)).await?.is_some() =>
            {
                // Redis lost this sale's state; the database has it.
                self.repair.start(Scope::Voucher(voucher));
                Err(Error::SaleUnverified)
            }
            outcome => outcome,
        }
    }

    /// The stock left of each of `vouchers` (`(id, database stock)`): on the
    /// fast path Redis' live stock runs ahead of the database's.
    ///
    /// # Errors
    /// [`Error::Redis`] on the fast path if Redis fails.
    pub async fn stock_left(&self, vouchers: &[(i64, i64)]) -> Result<Vec<i64>> {
        Ok(match self.path {
            PurchasePath::Async => {
                let ids: Vec<i64> = vouchers.iter().map(|(id, _)| *id).collect();
                let live = self.fast.remaining_stocks(&ids).await?;
                vouchers
                    .iter()
                    .zip(live)
                    .map(|((_, db), live)| live.unwrap_or(*db))
                    .collect()
            }
            PurchasePath::Sync(_) => vouchers.iter().map(|(_, db)| *db).collect(),
        })
    }

    /// `user`'s latest order for `voucher`, if any: stored, or as Redis
    /// knows it (pending, failed).
    ///
    /// # Errors
    /// [`Error::Redis`] or [`Error::Database`].
    pub async fn order_of(&self, voucher: i64, user: i64) -> Result<Option<OrderOf>> {
        // The database first: most orders asked about are stored.
        let stored = self.db.order_of(user, voucher).await?;
        if let Some(order) = &stored {
            if !order.returned {
                return Ok(stored.map(OrderOf::Stored));
            }
        }
        // Its unit back on sale (or none stored): a newer order may be on
        // its way.
        let unstored = order_in_redis(self.fast.redis(), voucher, user)
            .await?
            .filter(|(id, _)| stored.as_ref().is_none_or(|s| *id > s.record.id));
        Ok(match (unstored, stored) {
            (Some((id, state)), _) => Some(OrderOf::Unstored(id, state)),
            (None, stored) => stored.map(OrderOf::Stored),
        })
    }

    /// The state of order `id` of `user` if it is known to Redis only:
    /// `Pending` (accepted, on its way to the database) or `Failed`. Looks
    /// at the sales open now or in the last ten minutes (an order is
    /// accepted only while its sale is open), one Redis round trip each:
    /// for an order the database does not have, which is rare.
    ///
    /// # Errors
    /// [`Error::Redis`] or [`Error::Database`].
    pub async fn unstored_order(&self, user: i64, id: i64) -> Result<Option<OrderState>> {
        if self.fast_path().is_none() {
            return Ok(None); // the locked path stores before it answers
        }
        let since = crate::domain::now_ms() - 600_000;
        for voucher in self.db.open_voucher_ids(since).await? {
            if let Some((order, state)) = order_in_redis(self.fast.redis(), voucher, user).await? {
                if order.as_i64() == id {
                    return Ok(Some(state));
                }
            }
        }
        Ok(None)
    }

    /// Whether Redis answers.
    ///
    /// # Errors
    /// [`Error::Redis`] if it does not.
    pub async fn ping_redis(&self) -> Result<()> {
        self.fast.ping().await
    }
}
