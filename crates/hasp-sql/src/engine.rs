//! What a client runs on: the pools, the registry of holds, the waiters'
//! wake-ups, the lease renewal task and (PostgreSQL) the listener that
//! wakes waiters. The public handles (`client`, `lock`) are thin types
//! over it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[cfg(feature = "postgres")]
use sqlx::postgres::PgListener;
use tokio::sync::{watch, Notify};

use crate::backend::{Backend, HoldKey, Statements, Taken};
use crate::error::{Error, Result};
use crate::hold::SqlHold;
use crate::settings::SqlSettings;

#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) id: Arc<str>,
    pub(crate) db: Backend,
    /// The renewals' own connection: tasks trying a busy lock can keep
    /// every connection of `db` (SQLite's busy handler holds one while it
    /// waits for the write lock), and a renewal queued behind them for
    /// longer than a lease loses every hold (seen in `seckill-tools lab`).
    renewals: Backend,
    pub(crate) sql: Statements,
    pub(crate) settings: SqlSettings,
    holds: Mutex<HashMap<(String, String), Entry>>,
    pub(crate) attempts: AtomicU64,
    pub(crate) probes: AtomicU64,
    wakers: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
    _shutdown: watch::Sender<()>,
}

#[derive(Debug)]
struct Entry {
    count: u32,
    hold: Arc<SqlHold>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update is one insert, remove or increment.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    /// Opens the pools to `url` and starts the background tasks on the
    /// current tokio runtime.
    pub(crate) async fn start(url: &str, settings: SqlSettings) -> Result<Arc<Self>> {
        settings.validate()?;
        let db = Backend::open(url, settings.connections).await?;
        let renewals = Backend::open(url, 1).await?;
        let sql = Statements::new(&settings.table);
        let (shutdown, stop) = watch::channel(());
        let engine = Arc::new(Engine {
            id: format!("s:{}", uuid::Uuid::new_v4()).into(),
            db,
            renewals,
            sql,
            settings,
            holds: Mutex::default(),
            attempts: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            wakers: Mutex::default(),
            _shutdown: shutdown,
        });
        tokio::spawn(renew(Arc::downgrade(&engine), stop.clone()));
        #[cfg(feature = "postgres")]
        if let Some(pool) = engine.db.postgres() {
            let listener = PgListener::connect_with(pool).await?;
            tokio::spawn(listen(Arc::downgrade(&engine), listener, stop));
        }
        Ok(engine)
    }

    /// One attempt for `owner`; a hold taken is registered (re-entries
    /// share the hold of their owner).
    pub(crate) async fn attempt(
        &self,
        name: &str,
        owner: &hasp_owner::Owner,
        lease_ms: u64,
        watchdog: bool,
    ) -> Result<std::result::Result<Arc<SqlHold>, Option<Duration>>> {
        let sent_at = Instant::now();
        let lease = i64::try_from(lease_ms).unwrap_or(i64::MAX);
        self.attempts.fetch_add(1, Ordering::Relaxed);
        match self.sql.acquire(&self.db, name, owner.id(), lease).await? {
            Taken::Yes { token } => Ok(Ok(
                self.register(name, owner, token, lease_ms, watchdog, sent_at)
            )),
            Taken::Busy { left } => Ok(Err(left)),
        }
    }

    /// How long another owner's hold of `name` has left (`None`: the row
    /// looks free or `owner`'s): a waiter's read before a retry, which takes
    /// no write lock (see `Statements::held_by_other`).
    pub(crate) async fn probe(
        &self,
        name: &str,
        owner: &hasp_owner::Owner,
    ) -> Result<Option<Duration>> {
        let left = self.sql.held_by_other(&self.db, name, owner.id()).await?;
        if left.is_some() {
            self.probes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(left)
    }

    fn register(
        &self,
        name: &str,
        owner: &hasp_owner::Owner,
        token: i64,
        lease_ms: u64,
        watchdog: bool,
        sent_at: Instant,
    ) -> Arc<SqlHold> {
        let mut holds = guard(&self.holds);
        let key = (name.to_owned(), owner.id().to_owned());
        if let Some(entry) = holds.get_mut(&key) {
            if entry.hold.token == token && !entry.hold.is_gone() {
                entry.count += 1;
                entry.hold.confirm(sent_at, lease_ms);
                return entry.hold.clone();
            }
        }
        let hold = Arc::new(SqlHold::new(
            name, owner, token, lease_ms, watchdog, sent_at,
        ));
        holds.insert(
            key,
            Entry {
                count: 1,
                hold: hold.clone(),
            },
        );
        hold
    }

    /// Whether `hold` is still in the registry (not released).
    fn is_registered(&self, hold: &SqlHold) -> bool {
        let key = (hold.name.clone(), hold.owner.id().to_owned());
        guard(&self.holds)
            .get(&key)
            .is_some_and(|entry| std::ptr::eq(Arc::as_ptr(&entry.hold), hold))
    }

    /// Gives back one hold in the registry: true if it was registered.
    fn unregister(&self, hold: &SqlHold) -> bool {
        let mut holds = guard(&self.holds);
        let key = (hold.name.clone(), hold.owner.id().to_owned());
        match holds.get_mut(&key) {
            Some(entry) if std::ptr::eq(Arc::as_ptr(&entry.hold), hold) => {
                entry.count -= 1;
                if entry.count == 0 {
                    holds.remove(&key);
                }
                true
            }
            _ => false,
        }
    }

    /// Releases one hold: `NotHeld` if it was lost or the row is not this
    /// owner's any more.
    pub(crate) async fn release(&self, hold: &SqlHold) -> Result<()> {
        let registered = self.unregister(hold);
        let not_held = || Error::NotHeld {
            name: hold.name.clone(),
        };
        if !registered || hold.is_gone() {
            return Err(not_held());
        }
        match self
            .sql
            .release(&self.db, &hold.name, hold.owner.id(), 1)
            .await?
        {
            None => {
                hold.mark_gone();
                Err(not_held())
            }
            Some(freed) => {
                if freed {
                    self.wake(&hold.name);
                }
                Ok(())
            }
        }
    }

    /// Releases one hold in the background (a dropped guard).
    pub(crate) fn release_detached(self: &Arc<Self>, hold: Arc<SqlHold>) {
        let inner = self.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = inner.release(&hold).await {
                    tracing::debug!(error = %e, lock = %hold.name, "background release");
                }
            });
        }
    }

    /// The wake-up of `name`'s waiters in this client, joined, and how many
    /// of its tasks waited for `name` before this one.
    pub(crate) fn waker(&self, name: &str) -> (Arc<Notify>, usize) {
        let mut wakers = guard(&self.wakers);
        let entry = wakers
            .entry(name.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        (entry.0.clone(), entry.1 - 1)
    }

    /// A waiter of `name` left.
    pub(crate) fn leave(&self, name: &str) {
        let mut wakers = guard(&self.wakers);
        if let Some(entry) = wakers.get_mut(name) {
            entry.1 -= 1;
            if entry.1 == 0 {
                wakers.remove(name);
            }
        }
    }

    /// `name` was freed: wakes one of this client's waiters for it (the
    /// longest waiting). Waking all of them sent one acquiring statement
    /// each, all but one in vain, and on SQLite each such write queues for
    /// the single write lock; the others keep their back-off and read the
    /// row when it ends.
    fn wake(&self, name: &str) {
        if let Some((notify, _)) = guard(&self.wakers).get(name) {
            notify.notify_one();
        }
    }

    #[cfg(feature = "postgres")]
    fn wake_all(&self) {
        for (notify, _) in guard(&self.wakers).values() {
            notify.notify_waiters();
        }
    }

    fn watchdog_holds(&self) -> Vec<Arc<SqlHold>> {
        guard(&self.holds)
            .values()
            .filter(|e| e.hold.watchdog && !e.hold.is_lost())
            .map(|e| e.hold.clone())
            .collect()
    }
}

/// Renews every hold in watchdog mode every third of the watchdog
/// timeout, 100 per statement; a renewal that finds the row expired or
/// taken marks the hold lost at once.
async fn renew(inner: std::sync::Weak<Engine>, mut stop: watch::Receiver<()>) {
    let period = match inner.upgrade() {
        Some(inner) => inner.settings.watchdog_timeout / 3,
        None => return,
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let lease_ms = inner.settings.watchdog_lease_ms();
        let lease = i64::try_from(lease_ms).unwrap_or(i64::MAX);
        let holds = inner.watchdog_holds();
        if holds.is_empty() {
            continue;
        }
        let keys: Vec<HoldKey> = holds
            .iter()
            .map(|h| (h.name.clone(), h.owner.id().to_owned(), h.token))
            .collect();
        let sent_at = Instant::now();
        match inner.sql.extend_many(&inner.renewals, &keys, lease).await {
            Ok(renewed) => {
                let renewed: std::collections::HashSet<HoldKey> = renewed.into_iter().collect();
                for (hold, key) in holds.iter().zip(keys) {
                    if renewed.contains(&key) {
                        hold.confirm(sent_at, lease_ms);
                    } else if inner.is_registered(hold) {
                        hold.mark_gone();
                    }
                    // Otherwise released while the statement ran: its row
                    // was freed by its owner, not lost.
                }
            }
            // Nothing is known: each hold is lost at its belief end unless
            // a later round gets through.
            Err(e) => tracing::warn!(error = %e, holds = holds.len(), "lease renewal failed"),
        }
    }
}

/// PostgreSQL: wakes this client's waiters of the name each release
/// notification carries; after a reconnect (notifications sent meanwhile
/// are lost), every waiter.
#[cfg(feature = "postgres")]
async fn listen(
    inner: std::sync::Weak<Engine>,
    mut listener: PgListener,
    mut stop: watch::Receiver<()>,
) {
    let channel = match inner.upgrade() {
        Some(inner) => inner.sql.channel(),
        None => return,
    };
    if let Err(e) = listener.listen(&channel).await {
        tracing::warn!(error = %e, "LISTEN failed; waiters poll");
    }
    loop {
        let received = tokio::select! {
            r = listener.try_recv() => r,
            _ = stop.changed() => return,
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        match received {
            Ok(Some(notification)) => inner.wake(notification.payload()),
            Ok(None) => inner.wake_all(), // reconnected: messages may be lost
            Err(e) => {
                tracing::debug!(error = %e, "listener error");
                inner.wake_all();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
