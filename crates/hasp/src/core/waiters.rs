//! The waiters' home: this client's tasks waiting for each lock.
//!
//! Per lock name a [`WaitQueue`] holds, in the order the tasks started
//! waiting, their requests for a direct hand-off (an [`Offer`]), a count of
//! waiters, the state of the name's pub/sub subscription, and a notification
//! that wakes one waiter at a time. The first [`Waiter`] of a name
//! subscribes to its release channel, the last one gone unsubscribes (one
//! subscription per name per client).
//!
//! * **Wake one.** A release message from another client, a local release,
//!   or a reconnect (messages may have been lost: then all) wakes waiters;
//!   one at a time keeps the others' place instead of a stampede on Redis.
//!   A waiter never depends on a message alone: it also retries when the
//!   holder's TTL runs out ([`Waiter::wait_for`]).
//! * **Hand-off.** A task of this client that releases the lock sends it as
//!   "release and hand to the first waiter" ([`Waiters::release`]): the
//!   script frees the lock and takes it again for that waiter in the same
//!   call, with a fresh fencing token; the waiter gets a [`Grant`] one round
//!   trip sooner than a wake-up would give it, and no other client slips in.
//! * **Yielding.** When another client flagged itself as waiting since the
//!   lock was last free, the script frees and publishes instead, and this
//!   client's first waiter holds back for [`YIELD_GRACE`] before it asks, so
//!   that the other client (told first, it would win every race) gets its
//!   turn.
//! * **Grants nobody takes.** A grant whose waiter left (cancelled, timed
//!   out, served by its own attempt) is released again on whichever side
//!   sees it last (`reply`).
//!
//! * **Named wake-ups.** A kind whose waiters also queue in Redis (a
//!   semaphore) joins with [`Waiters::join_place`]: its waiter has an id, no
//!   offer, and a wake-up of its own. A message `>id,id,...` wakes exactly
//!   those waiters of this client (the script names the ones it serves
//!   next), and nobody else.
//!
//! Nothing here is about the reentrant lock's layout beyond the hand-off's
//! heir and lease.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tokio::sync::{oneshot, watch, Notify};

use super::batcher::{Completion, Queue, WAIT_ENDS};
use super::holds::Written;
use super::keys::LockKeys;
use super::pubsub::PubSub;
use super::reply::{HoldReply, Undo};
use super::wire::lock::LockOp;
use super::wire::{Op, Reply};
use crate::error::Error;
use hasp_owner::Owner;

/// How long a client holds its own waiters back after it freed a lock for
/// another client's waiter: ample for that client to hear of it and ask (a
/// round trip or two), short enough not to matter if it went away.
const YIELD_GRACE: Duration = Duration::from_millis(10);

/// How long a waiter waits without a known TTL before it asks again: a key
/// without expiry (not set by hasp), or a waiter queued behind local waiters
/// that has not asked yet (the lock may expire silently while the waiter
/// ahead gives up).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// A lock handed to a waiter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    /// The fencing token of the new hold.
    pub(crate) token: u64,
    /// No later than when the call that made the hold was sent: its lease
    /// runs from no earlier than this.
    pub(crate) sent_at: Instant,
}

/// A waiting task's standing request for a hand-off.
#[derive(Debug)]
struct Offer {
    owner: Owner,
    lease_ms: u64,
    grant: oneshot::Sender<Grant>,
}

impl Offer {
    /// False once the waiter has stopped waiting.
    fn is_live(&self) -> bool {
        !self.grant.is_closed()
    }
}

/// The waiters of one lock name in this client.
#[derive(Debug)]
pub(crate) struct WaitQueue {
    notify: Notify,
    /// True while the server has confirmed the subscription.
    active: watch::Sender<bool>,
    waiting: AtomicUsize,
    offers: Mutex<VecDeque<Offer>>,
    /// Set after a hand-off yielded to another client.
    held_back_until: Mutex<Option<Instant>>,
    /// Counts the times the lock may have become free (release messages,
    /// local releases, reconnects), for [`Watch`]es.
    freed: watch::Sender<u64>,
    /// Waiters that queue in Redis, by id: woken by name.
    named: Mutex<HashMap<Arc<str>, Arc<Notify>, foldhash::fast::RandomState>>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these mutexes is a single push, pop or store:
    // a panic cannot leave one half-done, so poison is moot.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl WaitQueue {
    fn new() -> Self {
        Self {
            notify: Notify::new(),
            active: watch::Sender::new(false),
            waiting: AtomicUsize::new(0),
            offers: Mutex::default(),
            held_back_until: Mutex::default(),
            freed: watch::Sender::new(0),
            named: Mutex::default(),
        }
    }

    /// The lock may be free: tells the watches.
    fn tell_watches(&self) {
        if self.freed.receiver_count() > 0 {
            self.freed.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Queues an offer, dropping those of waiters that stopped waiting: a
    /// release takes only the first live one, and without local releases
    /// (the lock held elsewhere, waits timing out) dead ones would pile up.
    fn queue_offer(&self, offer: Offer) {
        let mut offers = guard(&self.offers);
        offers.retain(Offer::is_live);
        offers.push_back(offer);
    }

    fn take_offer(&self) -> Option<Offer> {
        let mut offers = guard(&self.offers);
        while let Some(offer) = offers.pop_front() {
            if offer.is_live() {
                return Some(offer);
            }
        }
        None
    }

    fn wake_one(&self) {
        self.tell_watches();
        if self.waiting.load(Ordering::Acquire) > 0 {
            self.notify.notify_one();
        }
    }
}

#[derive(Debug)]
struct Entry {
    queue: Arc<WaitQueue>,
    /// Live [`Waiter`]s of this name.
    refs: usize,
}

/// Looked up on every release (is there a waiter to wake or hand to?):
/// foldhash, as the holds registry.
type QueueMap = HashMap<Arc<str>, Entry, foldhash::fast::RandomState>;

/// Every wait queue of a client, by release channel.
#[derive(Debug)]
pub(crate) struct Waiters {
    client_id: Arc<str>,
    queues: Mutex<QueueMap>,
    /// Entries in `queues`, readable without its lock: every release asks
    /// for waiters, and mostly there are none.
    in_use: AtomicUsize,
    pubsub: PubSub,
    /// False when acquisitions must be confirmed by replicas: a release
    /// then wakes the first waiter instead of handing it the lock.
    hand_off: bool,
}

impl Waiters {
    pub(crate) fn new(client_id: Arc<str>, pubsub: PubSub, hand_off: bool) -> Self {
        Self {
            client_id,
            queues: Mutex::default(),
            in_use: AtomicUsize::new(0),
            pubsub,
            hand_off,
        }
    }

    fn queue(&self, channel: &str) -> Option<Arc<WaitQueue>> {
        if self.in_use.load(Ordering::SeqCst) == 0 {
            return None;
        }
        guard(&self.queues).get(channel).map(|e| e.queue.clone())
    }

    /// True if tasks of this client already wait for the lock: a newcomer
    /// then queues behind them instead of barging.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.queue(channel)
            .is_some_and(|q| q.waiting.load(Ordering::Acquire) > 0)
    }

    /// Release channels this client is subscribed to (or subscribing).
    pub(crate) fn channel_count(&self) -> usize {
        guard(&self.queues).len()
    }

    /// Joins the queue of `keys`' lock for `owner`, whose hold would have a
    /// lease of `lease_ms` if handed over; subscribes if first.
    pub(crate) fn join(
        self: &Arc<Self>,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        lease_ms: u64,
        batch: &Queue,
    ) -> Waiter {
        let queue = self.enter(keys);
        queue.waiting.fetch_add(1, Ordering::AcqRel);
        let (tx, rx) = oneshot::channel();
        queue.queue_offer(Offer {
            owner: owner.clone(),
            lease_ms,
            grant: tx,
        });
        let undo = Undo::lock(keys, owner, batch);
        Waiter {
            waiters: self.clone(),
            channel: keys.channel.clone(),
            queue,
            grant: Some(HoldReply::new(rx, undo, |_| true)),
            named: None,
        }
    }

    /// Joins the waiters of `keys`' object as the waiter `id`, which queues
    /// in Redis and is woken by name (see the module docs); subscribes if
    /// first.
    pub(crate) fn join_place(self: &Arc<Self>, keys: &Arc<LockKeys>, id: Arc<str>) -> Waiter {
        let queue = self.enter(keys);
        queue.waiting.fetch_add(1, Ordering::AcqRel);
        let wake = Arc::new(Notify::new());
        guard(&queue.named).insert(id.clone(), wake.clone());
        Waiter {
            waiters: self.clone(),
            channel: keys.channel.clone(),
            queue,
            grant: None,
            named: Some((id, wake)),
        }
    }

    /// Watches `keys`' lock for releases without queuing for it (see
    /// [`Watch`]); subscribes if first.
    pub(crate) fn watch(self: &Arc<Self>, keys: &Arc<LockKeys>) -> Watch {
        let queue = self.enter(keys);
        let freed = queue.freed.subscribe();
        Watch {
            waiters: self.clone(),
            channel: keys.channel.clone(),
            queue,
            freed,
        }
    }

    /// Counts one more user of the name's queue, made (and subscribed) if
    /// this is the first.
    fn enter(&self, keys: &LockKeys) -> Arc<WaitQueue> {
        let mut map = guard(&self.queues);
        let entry = map.entry(keys.channel.clone()).or_insert_with(|| {
            self.in_use.fetch_add(1, Ordering::SeqCst);
            // Under the map lock, so that the transport sees subscribe
            // and unsubscribe in the order the map changed.
            self.pubsub.subscribe(&keys.channel);
            Entry {
                queue: Arc::new(WaitQueue::new()),
                refs: 0,
            }
        });
        entry.refs += 1;
        entry.queue.clone()
    }

    fn leave(&self, channel: &Arc<str>) {
        let mut map = guard(&self.queues);
        if let Some(entry) = map.get_mut(channel) {
            entry.refs -= 1;
            if entry.refs == 0 {
                map.remove(channel);
                self.in_use.fetch_sub(1, Ordering::SeqCst);
                self.pubsub.unsubscribe(channel);
            }
        }
    }

    /// The operation that releases `holds` holds of `owner` — handed to this
    /// client's first waiter of the lock, if there is one — and its
    /// completion, which settles the hand-off and passes the releaser's
    /// outcome to `then` (a hand-off or a yield is, for the releaser, a
    /// release).
    pub(crate) fn release(
        self: &Arc<Self>,
        batch: &Queue,
        keys: &Arc<LockKeys>,
        owner: &Owner,
        holds: u32,
        written: Option<Written>,
        then: Completion,
    ) -> (Op, Completion) {
        let nonce = batch.nonce();
        let sent_at = Instant::now();
        let queue = self.queue(&keys.channel);
        let heir = queue
            .as_ref()
            .filter(|_| self.hand_off)
            .and_then(|q| q.take_offer());
        let op = match &heir {
            Some(heir) => Op::Lock(LockOp::HandOff {
                keys: keys.clone(),
                owner: owner.clone(),
                holds,
                nonce,
                heir: heir.owner.clone(),
                lease_ms: heir.lease_ms,
            }),
            None => Op::Lock(LockOp::Release {
                keys: keys.clone(),
                owner: owner.clone(),
                holds,
                nonce,
                written,
            }),
        };
        // No task of this client waits for the lock: nothing to settle.
        let Some(queue) = queue else {
            return (op, then);
        };
        let (batch, keys) = (batch.clone(), keys.clone());
        let done: Completion = Box::new(move |reply| {
            match (heir, reply) {
                (Some(heir), Ok(Reply::Acquired { token })) => {
                    then(Ok(Reply::Released));
                    // After the releaser's reply, so that the heir is the
                    // task this worker runs next (tokio runs the last task
                    // woken first).
                    let Offer { owner, grant, .. } = heir;
                    if grant.send(Grant { token, sent_at }).is_err() {
                        batch.release_one(keys, owner);
                    }
                }
                (Some(heir), Ok(Reply::Yielded)) => {
                    guard(&queue.offers).push_front(heir);
                    *guard(&queue.held_back_until) = Some(Instant::now() + YIELD_GRACE);
                    queue.wake_one();
                    then(Ok(Reply::Released));
                }
                // Not handed over (still held, not held, freed by a
                // settlement, or the reply was lost: then the batcher
                // settles it): the heir keeps its place at the front, and is
                // woken if the lock is free.
                (Some(heir), reply) => {
                    guard(&queue.offers).push_front(heir);
                    if matches!(reply, Ok(Reply::Released)) {
                        queue.wake_one();
                    }
                    then(reply);
                }
                (None, reply) => {
                    if matches!(reply, Ok(Reply::Released)) {
                        queue.wake_one();
                    }
                    then(reply);
                }
            }
        });
        (op, done)
    }

    /// The server confirmed the subscription to `channel`.
    pub(crate) fn subscribed(&self, channel: &str) {
        if let Some(queue) = self.queue(channel) {
            queue.active.send_replace(true);
        }
    }

    /// A release message: wakes one waiter, unless this client sent it (it
    /// woke or handed to its waiters itself).
    pub(crate) fn message(&self, channel: &str, payload: &[u8]) {
        if payload == self.client_id.as_bytes() {
            return;
        }
        if let Some(ids) = payload.strip_prefix(b">") {
            if let Some(queue) = self.queue(channel) {
                queue.tell_watches();
                let named = guard(&queue.named);
                for id in ids.split(|b| *b == b',') {
                    let wake = std::str::from_utf8(id).ok().and_then(|id| named.get(id));
                    if let Some(wake) = wake {
                        wake.notify_one();
                    }
                }
            }
            return;
        }
        if let Some(queue) = self.queue(channel) {
            queue.tell_watches();
            queue.notify.notify_one();
        }
    }

    /// The subscriptions are off until [`connected`](Self::connected).
    pub(crate) fn disconnected(&self) {
        for entry in guard(&self.queues).values() {
            entry.queue.active.send_replace(false);
        }
    }

    /// Subscribed again after a reconnect: wakes every waiter, since
    /// releases may have happened while nobody listened.
    pub(crate) fn connected(&self) {
        for entry in guard(&self.queues).values() {
            entry.queue.active.send_replace(true);
            entry.queue.tell_watches();
            entry.queue.notify.notify_waiters();
        }
    }
}

/// What one attempt of a waiter found.
pub(crate) enum Attempt<T> {
    /// Acquired.
    Done(T),
    /// Held by someone else, for this long if known.
    Busy(Option<Duration>),
}

/// One task's place in a lock's wait queue, with its offer for a hand-off.
/// Dropping it leaves the queue (and unsubscribes if it was the last).
#[derive(Debug)]
pub(crate) struct Waiter {
    waiters: Arc<Waiters>,
    channel: Arc<str>,
    queue: Arc<WaitQueue>,
    /// The hand-off offer's reply (none for a waiter that queues in Redis).
    grant: Option<HoldReply<Grant>>,
    /// The id and wake-up of a waiter that queues in Redis.
    named: Option<(Arc<str>, Arc<Notify>)>,
}

impl Waiter {
    /// Waits until the server confirmed the subscription (a release before
    /// that would be missed), at most `limit`.
    pub(crate) async fn ready(&self, limit: Duration) {
        let mut rx = self.queue.active.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|active| *active)).await;
    }

    /// Tries `attempt` whenever the lock may have become free — woken by a
    /// release or a reconnect, or when the last known TTL ran out — until it
    /// succeeds, a hand-off grants the lock (turned into the result by
    /// `granted`; `None` from it: ask again), or `deadline` passes
    /// (`Ok(None)`). `ttl` is what the
    /// caller's own first attempt found; `queued_blind` says it has not
    /// asked Redis yet (it queued behind other waiters).
    pub(crate) async fn wait_for<T, F, Fut>(
        mut self,
        deadline: Option<Instant>,
        mut ttl: Option<Duration>,
        mut queued_blind: bool,
        mut attempt: F,
        granted: impl Fn(Grant) -> Option<T>,
    ) -> Result<Option<T>, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Attempt<T>, Error>>,
    {
        let queue = self.queue.clone();
        let named = self.named.as_ref().map(|(_, wake)| wake.clone());
        let mut unconfirmed = None;
        loop {
            let notified = queue.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(Some(grant)) = self.grant.as_mut().and_then(FutureExt::now_or_never) {
                if let Some(done) = granted(grant) {
                    return Ok(Some(done));
                }
            }
            if !queued_blind {
                if let Some(done) = self.hold_back().await.and_then(&granted) {
                    return Ok(Some(done));
                }
                // No try starts once the wait is over (a wake can come
                // after it).
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return ran_out(unconfirmed);
                }
                let tried = within_wait(deadline, attempt()).await;
                match unconfirmed_as_busy(tried, deadline, &mut unconfirmed)? {
                    Attempt::Done(done) => return Ok(Some(done)),
                    Attempt::Busy(t) => ttl = t,
                }
            }
            queued_blind = false;
            let left = remaining(deadline);
            if left.is_zero() {
                return ran_out(unconfirmed);
            }
            let slice = ttl.unwrap_or(RECHECK).min(left);
            let pending_grant = self.grant.as_mut().filter(|g| !g.is_done());
            let has_grant = pending_grant.is_some();
            let grant = async {
                match pending_grant {
                    Some(grant) => grant.await,
                    None => std::future::pending().await,
                }
            };
            let by_name = async {
                match &named {
                    Some(wake) => wake.notified().await,
                    None => std::future::pending().await,
                }
            };
            let woken = tokio::select! {
                biased;
                grant = grant, if has_grant => match grant.and_then(&granted) {
                    Some(done) => return Ok(Some(done)),
                    None => true, // no hand-off will come (shutting down): ask
                },
                woken = tokio::time::timeout(slice, async {
                    tokio::select! {
                        () = notified.as_mut() => {},
                        () = by_name => {},
                    }
                }) => woken.is_ok(),
            };
            if !woken && deadline.is_some_and(|d| Instant::now() >= d) {
                return ran_out(unconfirmed);
            }
        }
    }

    /// After a hand-off yielded to another client, waits out the grace
    /// before asking (a grant may still come meanwhile).
    async fn hold_back(&mut self) -> Option<Grant> {
        let grant = self.grant.as_mut()?;
        let until = guard(&self.queue.held_back_until).take()?;
        if until <= Instant::now() {
            return None;
        }
        tokio::select! {
            grant = grant, if !grant.is_done() => grant,
            () = tokio::time::sleep_until(until.into()) => None,
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some((id, _)) = &self.named {
            guard(&self.queue.named).remove(id);
        }
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
        self.waiters.leave(&self.channel);
    }
}

/// A subscription to one lock's releases for a caller that waits for the
/// lock without queuing for a hand-off: a MultiLock or RedLock, which must
/// not hold one part while it waits for another. It is told of every
/// release this client sees (messages, its own releases, reconnects) and
/// takes no place among the lock's waiters. Dropping it unsubscribes if it
/// was the name's last user.
#[derive(Debug)]
pub(crate) struct Watch {
    waiters: Arc<Waiters>,
    channel: Arc<str>,
    queue: Arc<WaitQueue>,
    freed: watch::Receiver<u64>,
}

impl Watch {
    /// Waits until the server confirmed the subscription, at most `limit`.
    pub(crate) async fn ready(&self, limit: Duration) {
        let mut rx = self.queue.active.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|active| *active)).await;
    }

    /// Resolves when the lock may have become free since this watch was
    /// made or last resolved.
    pub(crate) async fn freed(&mut self) {
        if self.freed.changed().await.is_err() {
            std::future::pending::<()>().await; // the queue outlives us
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.waiters.leave(&self.channel);
    }
}

/// The deadline of a wait of `wait` from now.
///
/// # Errors
/// [`Error::InvalidArgument`] if it is too far to represent.
pub(crate) fn deadline_after(wait: Duration) -> Result<Instant, Error> {
    Instant::now()
        .checked_add(wait)
        .ok_or_else(|| Error::invalid("wait", format!("{wait:?} is too large")))
}

/// Time left until `deadline` (`Duration::MAX` without one).
pub(crate) fn remaining(deadline: Option<Instant>) -> Duration {
    match deadline {
        Some(d) => d.saturating_duration_since(Instant::now()),
        None => Duration::MAX,
    }
}

/// Runs `attempt` as a try of a wait that ends at `deadline`: its
/// operations carry the deadline, so that with replica acknowledgement the
/// try's `WAIT` ends by it (`batcher::WAIT_ENDS`).
pub(crate) async fn within_wait<T>(
    deadline: Option<Instant>,
    attempt: impl Future<Output = T>,
) -> T {
    WAIT_ENDS.scope(deadline, attempt).await
}

/// How soon an acquisition that too few replicas confirmed (so it was
/// undone) is tried again by a caller that waits.
const UNCONFIRMED_RETRY: Duration = Duration::from_millis(50);

/// An attempt's result for a caller that waits until `deadline`: an
/// acquisition too few replicas confirmed (a replica that has just
/// attached is not counted for a while) is "busy, ask again soon" while
/// the wait has time left; its error is kept in `unconfirmed`, answered if
/// the wait runs out before an attempt succeeds.
pub(crate) fn unconfirmed_as_busy<T>(
    result: Result<Attempt<T>, Error>,
    deadline: Option<Instant>,
    unconfirmed: &mut Option<Error>,
) -> Result<Attempt<T>, Error> {
    match result {
        Err(error @ Error::NotReplicated { .. }) if !remaining(deadline).is_zero() => {
            tracing::debug!(%error, "acquisition not confirmed by replicas: trying again");
            *unconfirmed = Some(error);
            Ok(Attempt::Busy(Some(UNCONFIRMED_RETRY)))
        }
        other => other,
    }
}

/// What a wait that ran out answers: "not acquired", or the replicas'
/// refusal if that is why the last attempt failed.
pub(crate) fn ran_out<T>(unconfirmed: Option<Error>) -> Result<Option<T>, Error> {
    unconfirmed.map_or(Ok(None), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(owner: &Owner) -> (Offer, oneshot::Receiver<Grant>) {
        let (grant, rx) = oneshot::channel();
        let offer = Offer {
            owner: owner.clone(),
            lease_ms: 1000,
            grant,
        };
        (offer, rx)
    }

    #[test]
    fn offers_of_waiters_that_stopped_waiting_do_not_pile_up() {
        let queue = WaitQueue::new();
        let owner = Owner::from_id("waiter").unwrap();
        let mut live = Vec::new();
        for i in 0..100 {
            let (offer, pending) = offer(&owner);
            queue.queue_offer(offer);
            if i % 10 == 0 {
                live.push(pending); // still waiting
            } // else: timed out, its receiver dropped
        }
        let (last, _pending) = offer(&owner);
        queue.queue_offer(last);
        assert_eq!(guard(&queue.offers).len(), live.len() + 1);
    }

    #[test]
    fn the_first_live_offer_is_taken_and_dead_ones_are_skipped() {
        let queue = WaitQueue::new();
        let (dead, gone) = offer(&Owner::from_id("dead").unwrap());
        let (alive, _kept) = offer(&Owner::from_id("alive").unwrap());
        queue.queue_offer(dead);
        drop(gone);
        guard(&queue.offers).push_back(alive);
        let taken = queue.take_offer().expect("a live offer");
        assert_eq!(taken.owner.id(), "alive");
        assert!(queue.take_offer().is_none());
    }
}
