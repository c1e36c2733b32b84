//! Release notifications: one pub/sub connection per client, one
//! subscription per lock name shared by all local waiters.
//!
//! Waiters hold a [`Subscription`]; the first one for a channel asks the
//! background task to `SUBSCRIBE`, the last one dropped asks it to
//! `UNSUBSCRIBE`. The task applies requests in order and against the current
//! set of wanted channels, so a subscribe racing an unsubscribe always ends
//! in the state the live handles want.
//!
//! A release message wakes *one* local waiter (FIFO): the others keep their
//! place instead of all stampeding Redis. A client hands a lock it releases
//! to its own first waiter (`handoff`) or wakes it directly, and ignores the
//! echo of its own message (the payload is the releasing client's id).
//!
//! When the connection drops, the task reconnects with back-off,
//! resubscribes, and wakes every waiter, since messages may have been lost.
//! Waiters never depend on a message alone: each also waits at most the
//! lock's remaining TTL before retrying.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch, Notify};

use crate::handoff::Offer;

/// Per-channel state shared by the waiters of one lock name.
#[derive(Debug)]
pub(crate) struct ChannelState {
    pub(crate) notify: Notify,
    /// True while the server has confirmed the subscription.
    active: watch::Sender<bool>,
    /// Local tasks currently waiting for this lock.
    waiting: AtomicUsize,
    /// Their requests for a direct hand-off, in the order they started
    /// waiting (see `handoff`).
    offers: Mutex<VecDeque<Offer>>,
}

impl ChannelState {
    fn offers(&self) -> MutexGuard<'_, VecDeque<Offer>> {
        self.offers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues an offer, dropping those of waiters that stopped waiting: a
    /// release takes only the first live one, and without local releases
    /// (the lock held elsewhere, waits timing out) dead ones would pile up.
    fn queue_offer(&self, offer: Offer) {
        let mut offers = self.offers();
        offers.retain(Offer::is_live);
        offers.push_back(offer);
    }
}

#[derive(Debug)]
struct Entry {
    state: Arc<ChannelState>,
    refs: usize,
}

/// Looked up on every release (is there a waiter to wake or hand to?):
/// foldhash, as the holds registry.
type ChannelMap = HashMap<Arc<str>, Entry, foldhash::fast::RandomState>;
type Channels = Arc<Mutex<ChannelMap>>;

fn lock(channels: &Channels) -> MutexGuard<'_, ChannelMap> {
    channels.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug)]
enum Request {
    Subscribe(Arc<str>),
    Unsubscribe(Arc<str>),
}

/// The client's pub/sub front end.
#[derive(Debug)]
pub(crate) struct PubSub {
    channels: Channels,
    /// Entries in `channels`, readable without its lock: every release asks
    /// for waiters, and mostly there are none.
    in_use: AtomicUsize,
    requests: mpsc::UnboundedSender<Request>,
}

impl PubSub {
    /// Starts the background task on `runtime`. It ends when this value is
    /// dropped (with the client) and the last subscription is gone.
    pub(crate) fn start(
        client: redis::Client,
        connect_timeout: Duration,
        client_id: Arc<str>,
        runtime: &tokio::runtime::Handle,
    ) -> Arc<Self> {
        let channels: Channels = Arc::default();
        let (requests, rx) = mpsc::unbounded_channel();
        runtime.spawn(run(
            client,
            connect_timeout,
            client_id,
            channels.clone(),
            rx,
        ));
        Arc::new(Self {
            channels,
            in_use: AtomicUsize::new(0),
            requests,
        })
    }

    /// Joins (or starts) the subscription to `channel`.
    pub(crate) fn subscribe(self: &Arc<Self>, channel: &Arc<str>) -> Subscription {
        let mut map = lock(&self.channels);
        let state = match map.get_mut(channel) {
            Some(entry) => {
                entry.refs += 1;
                entry.state.clone()
            }
            None => {
                let state = Arc::new(ChannelState {
                    notify: Notify::new(),
                    active: watch::Sender::new(false),
                    waiting: AtomicUsize::new(0),
                    offers: Mutex::default(),
                });
                self.in_use.fetch_add(1, Ordering::SeqCst);
                map.insert(
                    channel.clone(),
                    Entry {
                        state: state.clone(),
                        refs: 1,
                    },
                );
                // Sent under the map lock so requests reach the task in the
                // order the map changed.
                let _ = self.requests.send(Request::Subscribe(channel.clone()));
                state
            }
        };
        Subscription {
            pubsub: self.clone(),
            channel: channel.clone(),
            state,
        }
    }

    /// Wakes one local waiter of `channel`, if any (after a local release).
    pub(crate) fn wake_one(&self, channel: &str) {
        if self.in_use.load(Ordering::SeqCst) == 0 {
            return;
        }
        if let Some(entry) = lock(&self.channels).get(channel) {
            if entry.state.waiting.load(Ordering::Acquire) > 0 {
                entry.state.notify.notify_one();
            }
        }
    }

    /// The first live hand-off offer of `channel`'s waiters, if any.
    pub(crate) fn take_offer(&self, channel: &str) -> Option<Offer> {
        if self.in_use.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let state = lock(&self.channels).get(channel)?.state.clone();
        let mut offers = state.offers();
        while let Some(offer) = offers.pop_front() {
            if offer.is_live() {
                return Some(offer);
            }
        }
        None
    }

    /// Puts back an offer [`take_offer`](Self::take_offer) returned unused,
    /// ahead of the others (it was first).
    pub(crate) fn return_offer(&self, channel: &str, offer: Offer) {
        let state = lock(&self.channels).get(channel).map(|e| e.state.clone());
        if let Some(state) = state {
            state.offers().push_front(offer);
        }
    }

    /// True if local tasks are already queued for `channel`: a newcomer
    /// then queues behind them instead of barging.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        if self.in_use.load(Ordering::SeqCst) == 0 {
            return false;
        }
        lock(&self.channels)
            .get(channel)
            .is_some_and(|e| e.state.waiting.load(Ordering::Acquire) > 0)
    }

    /// Channels this client is subscribed to (or subscribing).
    pub(crate) fn channel_count(&self) -> usize {
        lock(&self.channels).len()
    }
}

/// A share in one channel's subscription; unsubscribes when the last share
/// is dropped.
#[derive(Debug)]
pub(crate) struct Subscription {
    pubsub: Arc<PubSub>,
    channel: Arc<str>,
    state: Arc<ChannelState>,
}

impl Subscription {
    pub(crate) fn state(&self) -> &ChannelState {
        &self.state
    }

    /// Waits until the server confirmed the subscription, at most `limit`.
    /// Returns false on time-out (the caller then relies on TTL retries).
    pub(crate) async fn ready(&self, limit: Duration) -> bool {
        let mut rx = self.state.active.subscribe();
        let confirmed = tokio::time::timeout(limit, rx.wait_for(|active| *active)).await;
        matches!(confirmed, Ok(Ok(_)))
    }

    /// Queues a hand-off offer behind those of earlier waiters.
    pub(crate) fn offer(&self, offer: Offer) {
        self.state.queue_offer(offer);
    }

    /// Registers the caller as a waiter until the returned token is dropped.
    pub(crate) fn enter_queue(&self) -> QueueToken<'_> {
        self.state.waiting.fetch_add(1, Ordering::AcqRel);
        QueueToken(&self.state)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = lock(&self.pubsub.channels);
        if let Some(entry) = map.get_mut(&self.channel) {
            entry.refs -= 1;
            if entry.refs == 0 {
                map.remove(&self.channel);
                self.pubsub.in_use.fetch_sub(1, Ordering::SeqCst);
                let _ = self
                    .pubsub
                    .requests
                    .send(Request::Unsubscribe(self.channel.clone()));
            }
        }
    }
}

/// Counts a task as waiting while alive.
pub(crate) struct QueueToken<'a>(&'a ChannelState);

impl Drop for QueueToken<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn run(
    client: redis::Client,
    connect_timeout: Duration,
    client_id: Arc<str>,
    channels: Channels,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        // One connect attempt, not restarted by requests arriving meanwhile
        // (a burst of them must not starve the connection). Those requests
        // are dropped: on connect, the wanted set is read from the map.
        let connect = tokio::time::timeout(connect_timeout, client.get_async_pubsub());
        tokio::pin!(connect);
        let connection = loop {
            tokio::select! {
                c = &mut connect => break c.unwrap_or_else(|_| Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "pub/sub connect timed out",
                )))),
                r = requests.recv() => if r.is_none() { return },
            }
        };
        let (mut sink, mut stream) = match connection {
            Ok(c) => c.split(),
            Err(e) => {
                tracing::debug!(error = %e, "pub/sub connect failed; retrying");
                let pause = tokio::time::sleep(backoff);
                tokio::pin!(pause);
                loop {
                    tokio::select! {
                        _ = &mut pause => break,
                        r = requests.recv() => if r.is_none() { return },
                    }
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);

        // (Re)subscribe everything wanted now, then wake every waiter: a
        // release may have happened while we were not listening.
        let wanted: Vec<(Arc<str>, Arc<ChannelState>)> = lock(&channels)
            .iter()
            .map(|(k, v)| (k.clone(), v.state.clone()))
            .collect();
        if !wanted.is_empty() {
            let names: Vec<&str> = wanted.iter().map(|(k, _)| &**k).collect();
            if let Err(e) = sink.subscribe(names).await {
                tracing::debug!(error = %e, "resubscribe failed; reconnecting");
                continue;
            }
            for (_, state) in &wanted {
                state.active.send_replace(true);
                state.notify.notify_waiters();
            }
        }

        loop {
            tokio::select! {
                request = requests.recv() => {
                    let result = match request {
                        None => return,
                        Some(Request::Subscribe(channel)) => {
                            let state = lock(&channels).get(&channel).map(|e| e.state.clone());
                            match state {
                                Some(state) => sink.subscribe(&*channel).await.map(|()| {
                                    state.active.send_replace(true);
                                }),
                                None => Ok(()),
                            }
                        }
                        Some(Request::Unsubscribe(channel)) => {
                            if lock(&channels).contains_key(&channel) {
                                Ok(())
                            } else {
                                sink.unsubscribe(&*channel).await
                            }
                        }
                    };
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "pub/sub request failed; reconnecting");
                        break;
                    }
                }
                message = stream.next() => {
                    let Some(message) = message else {
                        tracing::debug!("pub/sub connection closed; reconnecting");
                        break;
                    };
                    if message.get_payload_bytes() == client_id.as_bytes() {
                        continue; // our own release: local waiters were woken directly
                    }
                    if let Some(entry) = lock(&channels).get(message.get_channel_name()) {
                        entry.state.notify.notify_one();
                    }
                }
            }
        }
        for entry in lock(&channels).values() {
            entry.state.active.send_replace(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Undo;
    use crate::owner::Owner;

    #[test]
    fn offers_of_waiters_that_stopped_waiting_do_not_pile_up() {
        let state = ChannelState {
            notify: Notify::new(),
            active: watch::Sender::new(true),
            waiting: AtomicUsize::new(0),
            offers: Mutex::default(),
        };
        let owner = Owner::from_id("waiter").unwrap();
        let mut live = Vec::new();
        for i in 0..100 {
            let (offer, pending) = Offer::new(owner.clone(), 1000, Undo::detached());
            state.queue_offer(offer);
            if i % 10 == 0 {
                live.push(pending); // still waiting
            } // else: timed out, its pending grant dropped
        }
        let (offer, _pending) = Offer::new(owner, 1000, Undo::detached());
        state.queue_offer(offer);
        assert_eq!(state.offers().len(), live.len() + 1);
    }
}
