//! A named reentrant lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::client::Client;
use crate::config::validate_lease;
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::handoff::Offer;
use crate::holds::Lease;
use crate::keys::LockKeys;
use crate::owner::Owner;
use crate::scripts::{FORCE_RELEASE, RENEW};

/// A handle on one named, reentrant distributed lock.
///
/// Made by [`Client::lock`]; cheap to clone. The handle itself holds
/// nothing: acquiring returns a [`Guard`], and the lock is held until the
/// guard is released.
///
/// * **Owner.** By default the owner is the current task (see [`Owner`]);
///   [`with_owner`](Self::with_owner) picks an explicit one.
/// * **Lease.** By default the lock has the client's watchdog timeout
///   (30 s) as lease and the client's watchdog renews it every third of
///   that for as long as it is held, so it never expires under a live
///   holder and frees itself within one timeout when the holder's process
///   dies. [`with_lease`](Self::with_lease) sets a fixed lease instead, never
///   renewed: the lock expires after it even if still in use.
/// * **Reentrancy.** The owner that holds the lock acquires it again at
///   once; it is free for others after as many releases as acquisitions.
///   A re-entry keeps the lease mode of the first acquisition; with a fixed
///   lease it re-arms that lease.
/// * **Waiting.** [`lock`](Self::lock) and [`try_lock_for`](Self::try_lock_for)
///   subscribe to the lock's release channel (one subscription per name per
///   client) and retry when woken, or when the holder's lease runs out; they
///   never poll. Tasks of one client are served in the order they started
///   waiting: a task that releases the lock hands it to the first of them
///   in the same call to Redis, one round trip sooner than a wake-up would,
///   unless a task of another client waits too; then the lock is freed for
///   that client, and this client's waiter tries again only 10 ms later.
/// * **Fencing.** Each acquisition of a free lock gets a token greater than
///   every token issued before for the name ([`Guard::fencing_token`]); pass
///   it to the resource you protect so that it can reject a stale holder.
///
/// # When not to use it
/// To exclude tasks of one process only, `tokio::sync::Mutex` is cheaper by
/// orders of magnitude. A single Redis server is a single point of truth:
/// if it loses data (restart without persistence, failover to a lagging
/// replica) two holders can overlap; use fencing tokens where that matters.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// use std::time::Duration;
///
/// let lock = client.lock("order:1001")?;
/// // Wait at most 100 ms; hold for at most 10 s, no renewal.
/// let lock = lock.with_lease(Duration::from_secs(10))?;
/// match lock.try_lock_for(Duration::from_millis(100)).await? {
///     Some(guard) => {
///         let token = guard.fencing_token();
///         // ... write, tagged with `token` ...
///         # assert!(token >= 1);
///         guard.unlock().await?;
///     }
///     None => println!("busy, try later"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// Handing a lock to another task with an explicit owner:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> hasp::Result<()> {
/// # let server = testkit::RedisServer::start();
/// # let client = hasp::Client::open(&server.url()).await?;
/// let job = client.lock("job:7")?.with_owner(hasp::Owner::new());
/// let guard = job.lock().await?;
/// let worker = {
///     let job = job.clone();
///     tokio::spawn(async move {
///         // Same owner: a re-entry, not a wait.
///         let inner = job.lock().await?;
///         assert_eq!(job.hold_count(), 2);
///         inner.unlock().await
///     })
/// };
/// worker.await.expect("worker panicked")?;
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Lock {
    client: Client,
    keys: Arc<LockKeys>,
    lease: Lease,
    owner: Option<Owner>,
}

/// Longest first wait of a task that queued behind local waiters without
/// asking Redis (so without knowing the lock's TTL).
const QUEUED_RECHECK: Duration = Duration::from_secs(1);

enum Attempt {
    Acquired(Guard),
    /// Held by another owner; remaining TTL if it has one.
    Held(Option<Duration>),
}

impl Lock {
    pub(crate) fn new(client: Client, name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::invalid("name", "must not be empty"));
        }
        let max = client.shared.settings.max_name_len;
        if name.len() > max {
            return Err(Error::invalid(
                "name",
                format!("{} bytes exceeds the limit of {max}", name.len()),
            ));
        }
        let keys = Arc::new(LockKeys::new(&client.shared.settings.prefix, name));
        Ok(Self {
            client,
            keys,
            lease: Lease::Watchdog,
            owner: None,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.keys.name
    }

    /// This handle with a fixed lease: acquisitions expire after `lease`
    /// unless released, and are never renewed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `lease` is zero or above the client's
    /// `max_lease`.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self> {
        self.lease = Lease::Fixed(validate_lease(&self.client.shared.settings, lease)?);
        Ok(self)
    }

    /// This handle in watchdog mode (the default): leases renewed while held.
    pub fn with_watchdog(mut self) -> Self {
        self.lease = Lease::Watchdog;
        self
    }

    /// This handle acting for `owner` instead of the current task.
    pub fn with_owner(mut self, owner: Owner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// The owner this handle acts for, resolved now (the current task unless
    /// an explicit owner was set).
    pub fn owner(&self) -> Owner {
        match &self.owner {
            Some(owner) => owner.clone(),
            None => Owner::current(&self.client.shared.id),
        }
    }

    /// Acquires the lock, waiting as long as it takes.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached (the wait ends with the
    /// error; it is never reported as acquired).
    ///
    /// # Cancel safety
    /// Cancel safe. Dropping the future leaves no lock held (an acquisition
    /// racing the drop is released in the background), no renewal and no
    /// subscription; the task loses its place in the queue of waiters.
    pub async fn lock(&self) -> Result<Guard> {
        self.acquire(None, true)
            .await?
            .ok_or_else(|| Error::Protocol("an unbounded wait ended without the lock".to_owned()))
    }

    /// Tries once, never waiting for a holder: `Ok(None)` if another owner
    /// holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock(&self) -> Result<Option<Guard>> {
        self.acquire(Some(Instant::now()), false).await
    }

    /// Tries for at most `wait`: `Ok(None)` if the lock was still held by
    /// another owner when the wait ran out. A zero `wait` is
    /// [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `wait` is too large to represent as a
    /// deadline; [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn try_lock_for(&self, wait: Duration) -> Result<Option<Guard>> {
        let deadline = Instant::now()
            .checked_add(wait)
            .ok_or_else(|| Error::invalid("wait", format!("{wait:?} is too large")))?;
        self.acquire(Some(deadline), !wait.is_zero()).await
    }

    /// As [`try_lock_for`](Self::try_lock_for), but running out of time is
    /// an [`Error::TimedOut`].
    ///
    /// # Errors
    /// [`Error::TimedOut`], and those of `try_lock_for`.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    pub async fn lock_within(&self, wait: Duration) -> Result<Guard> {
        self.try_lock_for(wait)
            .await?
            .ok_or_else(|| Error::TimedOut {
                name: self.name().to_owned(),
                waited: wait,
            })
    }

    async fn acquire(&self, deadline: Option<Instant>, wait: bool) -> Result<Option<Guard>> {
        let owner = self.owner();
        if let Some(guard) = self.reenter(&owner).await? {
            return Ok(Some(guard));
        }
        let shared = &self.client.shared;
        // Queue behind local waiters rather than barge past them.
        let mut behind_local_waiters = wait && shared.pubsub.has_waiters(&self.keys.channel);
        let mut ttl = None;
        if !behind_local_waiters {
            match self.attempt(&owner, wait).await? {
                Attempt::Acquired(guard) => return Ok(Some(guard)),
                Attempt::Held(t) => ttl = t,
            }
            if !wait || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }

        let subscription = shared.pubsub.subscribe(&self.keys.channel);
        let _queued = subscription.enter_queue();
        // A task of this client that releases the lock hands it straight to
        // the first waiter that asked (see `handoff`).
        let undo = shared.batcher.undo(&self.keys, &owner);
        let (offer, mut grant) = Offer::new(owner.clone(), self.lease_ms(), undo);
        subscription.offer(offer);
        // Wait for the server to confirm the subscription (a release before
        // that would be missed), but no longer than the lock's TTL: past it
        // the next attempt is due anyway.
        let confirm_limit = remaining(deadline)
            .min(shared.settings.response_timeout)
            .min(ttl.unwrap_or(QUEUED_RECHECK));
        subscription.ready(confirm_limit).await;
        loop {
            let notified = subscription.state().notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(Some(handed)) = (&mut grant).now_or_never() {
                return Ok(Some(self.hold(&owner, handed.token, handed.sent_at)));
            }
            if !behind_local_waiters {
                match self.attempt(&owner, true).await? {
                    Attempt::Acquired(guard) => return Ok(Some(guard)),
                    Attempt::Held(t) => ttl = t,
                }
            }
            let queued_blind = std::mem::take(&mut behind_local_waiters);
            let left = remaining(deadline);
            if left.is_zero() {
                return Ok(None);
            }
            // Unknown TTL: a key without expiry is re-checked once per
            // watchdog timeout; a task queued behind local waiters (it has
            // not asked yet) re-checks after a second at most, in case the
            // lock expired silently while the waiter ahead gave up.
            let unknown_ttl = if queued_blind {
                QUEUED_RECHECK
            } else {
                shared.settings.watchdog_timeout
            };
            let slice = ttl.unwrap_or(unknown_ttl).min(left);
            let woken = tokio::select! {
                biased;
                handed = &mut grant, if !grant.is_done() => match handed {
                    Some(handed) => {
                        return Ok(Some(self.hold(&owner, handed.token, handed.sent_at)));
                    }
                    None => true, // no hand-off will come (shutting down): ask Redis
                },
                notified = tokio::time::timeout(slice, notified.as_mut()) => notified.is_ok(),
            };
            if !woken && deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    fn lease_ms(&self) -> u64 {
        match self.lease {
            Lease::Fixed(ms) => ms,
            Lease::Watchdog => self.client.shared.watchdog_lease_ms,
        }
    }

    /// Re-enters a hold this client already has for `owner`.
    async fn reenter(&self, owner: &Owner) -> Result<Option<Guard>> {
        let shared = &self.client.shared;
        let Some(state) = shared.holds.live(&self.keys, owner) else {
            return Ok(None);
        };
        // A re-entry keeps the hold's lease mode; a fixed lease is re-armed
        // (with this handle's lease if it sets one).
        if let Lease::Fixed(held_ms) = state.lease {
            let ms = match self.lease {
                Lease::Fixed(ms) => ms,
                Lease::Watchdog => held_ms,
            };
            let started = Instant::now();
            let renewed: Vec<i64> = RENEW
                .key(&*self.keys.lock)
                .arg(ms)
                .arg(owner.id())
                .invoke_async(&mut shared.conn.clone())
                .await?;
            if renewed.first() != Some(&1) {
                state.mark_lost();
                return Ok(None);
            }
            state.set_expires_at(started + Duration::from_millis(ms));
        }
        if shared.holds.reenter(&state) {
            Ok(Some(Guard::new(self.client.clone(), state)))
        } else {
            Ok(None)
        }
    }

    /// Registers a hold acquired in Redis with `token` by a call sent at
    /// `sent_at` (a fixed lease runs from no earlier than that).
    fn hold(&self, owner: &Owner, token: u64, sent_at: Instant) -> Guard {
        let expires_at = match self.lease {
            Lease::Fixed(ms) => Some(sent_at + Duration::from_millis(ms)),
            Lease::Watchdog => None,
        };
        let shared = &self.client.shared;
        let state = shared
            .holds
            .insert(&self.keys, owner, token, self.lease, expires_at);
        Guard::new(self.client.clone(), state)
    }

    /// One acquire attempt (batched with whatever else is pending).
    async fn attempt(&self, owner: &Owner, will_wait: bool) -> Result<Attempt> {
        let shared = &self.client.shared;
        let started = Instant::now();
        let reply = shared
            .batcher
            .acquire(&self.keys, owner, self.lease_ms(), will_wait)
            .await?;
        Ok(match reply {
            token if token > 0 => {
                Attempt::Acquired(self.hold(owner, token.unsigned_abs(), started))
            }
            0 => Attempt::Held(None),
            negative_ttl => Attempt::Held(Some(Duration::from_millis(negative_ttl.unsigned_abs()))),
        })
    }

    /// Frees the lock whoever holds it and wakes its waiters. Returns whether
    /// a lock was there. Holders find out through renewal (their guards
    /// report the loss) and get [`Error::NotHeld`] on release.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe; once sent, the call takes effect whether awaited or not.
    pub async fn force_unlock(&self) -> Result<bool> {
        let freed: i64 = FORCE_RELEASE
            .key(&*self.keys.lock)
            .key(&*self.keys.channel)
            .arg("*")
            .invoke_async(&mut self.client.shared.conn.clone())
            .await?;
        Ok(freed == 1)
    }

    /// Whether any owner holds the lock now.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn is_locked(&self) -> Result<bool> {
        let exists: bool = redis::cmd("EXISTS")
            .arg(&*self.keys.lock)
            .query_async(&mut self.client.shared.conn.clone())
            .await?;
        Ok(exists)
    }

    /// Whether this handle's owner holds the lock, as Redis sees it now.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn is_held_by_me(&self) -> Result<bool> {
        let held: bool = redis::cmd("HEXISTS")
            .arg(&*self.keys.lock)
            .arg(self.owner().id())
            .query_async(&mut self.client.shared.conn.clone())
            .await?;
        Ok(held)
    }

    /// How many times this handle's owner holds the lock through this client
    /// (0 if not held, or if the hold is known to be lost). Answered locally.
    pub fn hold_count(&self) -> u32 {
        self.client.shared.holds.count(&self.keys, &self.owner())
    }

    /// Time until the lock expires: `None` if no one holds it.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis cannot be reached; [`Error::Protocol`] if
    /// the key exists without an expiry (not set by this library).
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&*self.keys.lock)
            .query_async(&mut self.client.shared.conn.clone())
            .await?;
        match ttl {
            -2 => Ok(None),
            ms if ms >= 0 => Ok(Some(Duration::from_millis(ms as u64))),
            _ => Err(Error::Protocol(format!(
                "lock key {:?} has no expiry",
                self.keys.lock
            ))),
        }
    }
}

fn remaining(deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()),
        None => Duration::MAX,
    }
}
