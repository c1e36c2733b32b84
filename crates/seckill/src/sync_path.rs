//! The locked purchase path: a per-user lock around a database
//! transaction. The lock is a `hasp` lock in Redis, or a `hasp-sql` lock in
//! the service's own database ([`UserLocks::Table`]), for a deployment with
//! no Redis lock server.
//!
//! Slower than the [fast path](crate::store::FastPath) — every purchase is a
//! lock round trip plus a transaction on the voucher's row — but it needs no
//! Redis copy of the stock and no pipeline: the order is durable when the
//! call returns. The per-user lock serialises one user's attempts across all
//! instances, so the existing-order check and the insert are not raced by
//! the same user; `stock > 0` in the `UPDATE` and the unique (user, voucher)
//! index stay the final guards.

use std::time::Duration;

use crate::db::{Database, OrderRecord, Recorded, VoucherWindow};
use crate::domain::now_ms;
use crate::domain::purchase::{Purchase, Refusal};
use crate::error::Result;
use crate::store::OrderIdGenerator;

/// Where a sync path keeps its per-user locks.
#[derive(Debug, Clone)]
pub enum UserLocks {
    /// `hasp` locks in Redis.
    Redis(hasp::Client),
    /// `hasp-sql` locks in a database table (its table must exist:
    /// `SqlClient::migrate`).
    Table(hasp_sql::SqlClient),
}

/// A held per-user lock, of either store.
enum UserGuard {
    Redis(hasp::Guard),
    Table(hasp_sql::SqlGuard),
}

impl UserLocks {
    /// The lock `name`, if it can be had within `wait`.
    async fn try_lock(&self, name: &str, wait: Duration) -> Result<Option<UserGuard>> {
        Ok(match self {
            UserLocks::Redis(client) => client
                .lock(name)?
                .try_lock_for(wait)
                .await?
                .map(UserGuard::Redis),
            UserLocks::Table(client) => client
                .lock(name)?
                .try_lock_for(wait)
                .await?
                .map(UserGuard::Table),
        })
    }
}

impl UserGuard {
    async fn unlock(self) -> Result<()> {
        match self {
            UserGuard::Redis(guard) => guard.unlock().await?,
            UserGuard::Table(guard) => guard.unlock().await?,
        }
        Ok(())
    }
}

/// Purchases through a per-user lock and one database transaction.
#[derive(Debug)]
pub struct SyncPath {
    db: Database,
    locks: UserLocks,
    ids: OrderIdGenerator,
    lock_wait: Duration,
    prefix: String,
}

impl SyncPath {
    /// A sync path; a user's concurrent attempts wait at most `lock_wait`
    /// for each other, then are refused [`Refusal::InProgress`].
    pub fn new(db: Database, locks: UserLocks, ids: OrderIdGenerator, lock_wait: Duration) -> Self {
        Self {
            db,
            locks,
            ids,
            lock_wait,
            prefix: "seckill".into(),
        }
    }

    /// This path with its per-user locks under `prefix` (the service's key
    /// prefix; `seckill` by default): `<prefix>:user:<id>`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Tries to buy voucher `voucher_id` for `user_id`.
    ///
    /// A user's own second attempt (a double click) waits for the first up
    /// to `lock_wait`, then hears [`Refusal::InProgress`]: a busy user is a
    /// refusal, not a server error.
    ///
    /// # Errors
    /// [`Error::Lock`](crate::Error::Lock) if Redis fails;
    /// [`Error::Database`](crate::Error::Database) on database failure
    /// (nothing committed).
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn purchase(&self, voucher_id: i64, user_id: i64) -> Result<Purchase> {
        self.purchase_with_pass(voucher_id, user_id, false).await
    }

    /// [`SyncPath::purchase`] by a buyer who showed a valid waiting-room
    /// pass (`passed`): a sale with a room refuses a purchase without one
    /// ([`Refusal::PassRequired`]).
    ///
    /// # Errors
    /// As [`SyncPath::purchase`].
    pub async fn purchase_with_pass(
        &self,
        voucher_id: i64,
        user_id: i64,
        passed: bool,
    ) -> Result<Purchase> {
        let Some(VoucherWindow {
            begin_ms,
            end_ms,
            room,
            ..
        }) = self.db.voucher_window(voucher_id).await?
        else {
            return Ok(Purchase::Refused(Refusal::UnknownVoucher));
        };
        let now = now_ms();
        if now < begin_ms {
            return Ok(Purchase::Refused(Refusal::NotStarted));
        }
        if now >= end_ms {
            return Ok(Purchase::Refused(Refusal::Ended));
        }
        if room && !passed {
            return Ok(Purchase::Refused(Refusal::PassRequired));
        }
        let name = format!("{}:user:{user_id}", self.prefix);
        // Release before reporting, whatever the outcome; a failed release
        // only delays the user's next attempt until the lease ends.
        let Some(guard) = self.locks.try_lock(&name, self.lock_wait).await? else {
            return Ok(Purchase::Refused(Refusal::InProgress));
        };
        let outcome = self.purchase_locked(voucher_id, user_id).await;
        if let Err(e) = guard.unlock().await {
            tracing::warn!(error = %e, user_id, "releasing the user lock failed");
        }
        outcome
    }

    async fn purchase_locked(&self, voucher_id: i64, user_id: i64) -> Result<Purchase> {
        let id = self.ids.next_id().await?;
        let order = OrderRecord {
            id,
            user_id,
            voucher_id,
            created_ms: now_ms(),
        };
        Ok(match self.db.record_order(&order).await? {
            Recorded::Created => Purchase::Accepted(id),
            Recorded::AlreadyStored | Recorded::UserAlreadyOrdered => {
                Purchase::Refused(Refusal::AlreadyBought)
            }
            Recorded::OutOfStock => Purchase::Refused(Refusal::SoldOut),
            Recorded::UnknownVoucher => Purchase::Refused(Refusal::UnknownVoucher),
        })
    }
}
