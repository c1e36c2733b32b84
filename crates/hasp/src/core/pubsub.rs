//! Release messages: one pub/sub connection per client, kept open and made
//! again when it breaks.
//!
//! This module is transport only. It keeps the set of channels someone
//! wants ([`PubSub::subscribe`], [`PubSub::unsubscribe`]) subscribed on the
//! server and tells a [`Listener`] what happens: a subscription confirmed, a
//! message, the connection lost, the connection (re)made with every wanted
//! channel subscribed again. What a message means (which waiter to wake) is
//! the listener's business (`waiters`).
//!
//! Requests are applied in order and against the current wanted set, so a
//! subscribe racing an unsubscribe always ends in the state the set says.
//! The connection is made at once and kept even with nothing subscribed: its
//! loss and return are how a client notices that Redis went away and came
//! back while it only holds locks (faults 5).
//!
//! To a Redis Cluster the channels are sharded (`SSUBSCRIBE`): each is
//! subscribed on the node that owns its slot, where the batch function publishes
//! with `SPUBLISH`. redis-rs's cluster connection does the routing and
//! subscribes again after a reconnect or a slot move, and passes messages
//! on as RESP3 pushes, which this transport hands to the listener.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "cluster")]
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, watch};

use super::endpoint::Endpoint;

/// What the transport reports.
pub(crate) trait Listener: Send + Sync + 'static {
    /// The server confirmed the subscription to `channel`.
    fn subscribed(&self, channel: &str);
    /// A message arrived on `channel`.
    fn message(&self, channel: &str, payload: &[u8]);
    /// The connection broke: subscriptions are off until [`connected`].
    ///
    /// [`connected`]: Listener::connected
    fn disconnected(&self);
    /// The connection was made, and every wanted channel subscribed; `again`
    /// after a connection broke (messages sent meanwhile were lost).
    fn connected(&self, again: bool);
}

#[derive(Debug)]
enum Request {
    Subscribe(Arc<str>),
    Unsubscribe(Arc<str>),
}

/// The client's pub/sub connection.
#[derive(Debug)]
pub(crate) struct PubSub {
    wanted: Arc<Mutex<HashSet<Arc<str>>>>,
    requests: mpsc::UnboundedSender<Request>,
}

fn lock(wanted: &Mutex<HashSet<Arc<str>>>) -> MutexGuard<'_, HashSet<Arc<str>>> {
    wanted.lock().unwrap_or_else(|p| p.into_inner())
}

/// Longest pause between two connection attempts: after Redis comes back,
/// the client notices within about this (and re-checks its holds).
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Where the pub/sub transport listens.
pub(crate) enum Target {
    /// One server (or a Sentinel service's current master).
    Server(Arc<Endpoint>),
    /// A Redis Cluster: the connection, made with RESP3, and its pushes.
    #[cfg(feature = "cluster")]
    Cluster(ClusterConnection, mpsc::UnboundedReceiver<PushInfo>),
}

impl PubSub {
    /// Starts the connection's task on `runtime`; it ends when this value is
    /// dropped.
    pub(crate) fn start(
        target: Target,
        connect_timeout: Duration,
        listener: Arc<dyn Listener>,
        runtime: &tokio::runtime::Handle,
    ) -> Self {
        let wanted = Arc::default();
        let (requests, rx) = mpsc::unbounded_channel();
        match target {
            Target::Server(endpoint) => {
                let task = Task {
                    moved: endpoint.changes(),
                    endpoint,
                    connect_timeout,
                    listener,
                    wanted: Arc::clone(&wanted),
                };
                runtime.spawn(task.run(rx));
            }
            #[cfg(feature = "cluster")]
            Target::Cluster(conn, pushes) => {
                let task = ShardedTask {
                    conn,
                    listener,
                    wanted: Arc::clone(&wanted),
                };
                runtime.spawn(task.run(rx, pushes));
            }
        }
        Self { wanted, requests }
    }

    /// Subscribes to `channel` (once; the caller counts its users).
    pub(crate) fn subscribe(&self, channel: &Arc<str>) {
        let mut wanted = lock(&self.wanted);
        wanted.insert(channel.clone());
        // Sent under the lock so requests reach the task in the order the
        // set changed.
        let _ = self.requests.send(Request::Subscribe(channel.clone()));
    }

    /// Unsubscribes from `channel`.
    pub(crate) fn unsubscribe(&self, channel: &Arc<str>) {
        let mut wanted = lock(&self.wanted);
        wanted.remove(channel);
        let _ = self.requests.send(Request::Unsubscribe(channel.clone()));
    }
}

struct Task {
    endpoint: Arc<Endpoint>,
    /// Changes when the master moved (a Sentinel failover).
    moved: watch::Receiver<u64>,
    connect_timeout: Duration,
    listener: Arc<dyn Listener>,
    wanted: Arc<Mutex<HashSet<Arc<str>>>>,
}

type Sink = redis::aio::PubSubSink;
type Stream = redis::aio::PubSubStream;

impl Task {
    async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Request>) {
        let mut backoff = Duration::from_millis(50);
        let mut again = false;
        loop {
            let Some(connection) = self.connect(&mut requests).await else {
                return; // the client is gone
            };
            let (mut sink, stream) = match connection {
                Ok(c) => c.split(),
                Err(e) => {
                    tracing::debug!(error = %e, "pub/sub connect failed; retrying");
                    if !pause(backoff, &mut requests).await {
                        return;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            backoff = Duration::from_millis(50);
            // (Re)subscribe everything wanted now, then say so: a release may
            // have happened while nobody was listening.
            let wanted: Vec<Arc<str>> = lock(&self.wanted).iter().cloned().collect();
            if !wanted.is_empty() {
                let names: Vec<&str> = wanted.iter().map(|c| &**c).collect();
                if let Err(e) = sink.subscribe(names).await {
                    tracing::debug!(error = %e, "resubscribe failed; reconnecting");
                    continue;
                }
            }
            self.listener.connected(again);
            again = true;
            if !self.serve(&mut sink, stream, &mut requests).await {
                return;
            }
            self.listener.disconnected();
        }
    }

    /// One connect attempt, not restarted by requests arriving meanwhile (a
    /// burst of them must not starve the connection). Those requests are
    /// dropped: on connect, the wanted set is read afresh. `None` once the
    /// client is gone.
    async fn connect(
        &self,
        requests: &mut mpsc::UnboundedReceiver<Request>,
    ) -> Option<redis::RedisResult<redis::aio::PubSub>> {
        let connect = async {
            let info = self.endpoint.resolve().await?;
            crate::transport::pubsub(&info, self.endpoint.tls(), self.connect_timeout).await
        };
        let connect = tokio::time::timeout(self.connect_timeout, connect);
        tokio::pin!(connect);
        loop {
            tokio::select! {
                c = &mut connect => return Some(c.unwrap_or_else(|_| Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "pub/sub connect timed out",
                ))))),
                r = requests.recv() => {
                    r?; // None: the client is gone
                }
            }
        }
    }

    /// Applies requests and passes messages on until the connection breaks
    /// (true) or the client is gone (false).
    async fn serve(
        &mut self,
        sink: &mut Sink,
        mut stream: Stream,
        requests: &mut mpsc::UnboundedReceiver<Request>,
    ) -> bool {
        loop {
            tokio::select! {
                request = requests.recv() => {
                    let Some(request) = request else { return false };
                    if let Err(e) = self.apply(sink, request).await {
                        tracing::debug!(error = %e, "pub/sub request failed; reconnecting");
                        return true;
                    }
                }
                moved = self.moved.changed() => {
                    if moved.is_ok() {
                        tracing::debug!("the master moved; reconnecting pub/sub");
                        return true;
                    }
                }
                message = stream.next() => {
                    let Some(message) = message else {
                        tracing::debug!("pub/sub connection closed; reconnecting");
                        return true;
                    };
                    self.listener
                        .message(message.get_channel_name(), message.get_payload_bytes());
                }
            }
        }
    }

    async fn apply(&self, sink: &mut Sink, request: Request) -> redis::RedisResult<()> {
        match request {
            Request::Subscribe(channel) => {
                if lock(&self.wanted).contains(&channel) {
                    sink.subscribe(&*channel).await?;
                    self.listener.subscribed(&channel);
                }
            }
            Request::Unsubscribe(channel) => {
                if !lock(&self.wanted).contains(&channel) {
                    sink.unsubscribe(&*channel).await?;
                }
            }
        }
        Ok(())
    }
}

/// The transport on a Redis Cluster (see the module docs).
#[cfg(feature = "cluster")]
struct ShardedTask {
    conn: ClusterConnection,
    listener: Arc<dyn Listener>,
    wanted: Arc<Mutex<HashSet<Arc<str>>>>,
}

#[cfg(feature = "cluster")]
impl ShardedTask {
    async fn run(
        mut self,
        mut requests: mpsc::UnboundedReceiver<Request>,
        mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    ) {
        self.listener.connected(false);
        let mut down = false;
        loop {
            tokio::select! {
                request = requests.recv() => {
                    let Some(request) = request else { return };
                    if let Err(e) = self.apply(request).await {
                        // redis-rs subscribes again when the node is back.
                        tracing::debug!(error = %e, "sharded pub/sub request failed");
                    }
                }
                push = pushes.recv() => {
                    let Some(push) = push else { return };
                    match push.kind {
                        PushKind::SMessage => {
                            if let [channel, payload] = &push.data[..] {
                                if let (Some(channel), Some(payload)) = (bytes(channel), bytes(payload)) {
                                    self.listener
                                        .message(&String::from_utf8_lossy(channel), payload);
                                }
                            }
                        }
                        PushKind::SSubscribe => {
                            if down {
                                down = false;
                                self.listener.connected(true);
                            }
                            if let Some(channel) = push.data.first().and_then(bytes) {
                                self.listener.subscribed(&String::from_utf8_lossy(channel));
                            }
                        }
                        PushKind::Disconnection => {
                            down = true;
                            self.listener.disconnected();
                        }
                        // The server dropped a subscription we still want:
                        // its slot moved to another node.
                        PushKind::SUnsubscribe => {
                            let channel = push.data.first().and_then(bytes);
                            let channel: Option<Arc<str>> =
                                channel.map(|c| String::from_utf8_lossy(c).into());
                            if let Some(channel) = channel {
                                if lock(&self.wanted).contains(&channel) {
                                    self.follow(channel).await;
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// Subscribes to `channel` again on the node that serves its slot now
    /// (the first tries may meet the old node: redis-rs refreshes its slot
    /// map on the redirect), then wakes its waiters: a release may have
    /// gone by meanwhile.
    async fn follow(&mut self, channel: Arc<str>) {
        for _ in 0..100 {
            if !lock(&self.wanted).contains(&channel) {
                return;
            }
            match self.conn.ssubscribe(&*channel).await {
                Ok(()) => {
                    self.listener.subscribed(&channel);
                    self.listener.message(&channel, b"");
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, channel = %channel, "sharded resubscribe failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        tracing::warn!(channel = %channel, "could not subscribe again after a slot move; waiters fall back to the lock's expiry");
    }

    async fn apply(&mut self, request: Request) -> redis::RedisResult<()> {
        match request {
            Request::Subscribe(channel) => {
                if lock(&self.wanted).contains(&channel) {
                    self.conn.ssubscribe(&*channel).await?;
                    self.listener.subscribed(&channel);
                }
            }
            Request::Unsubscribe(channel) => {
                if !lock(&self.wanted).contains(&channel) {
                    self.conn.sunsubscribe(&*channel).await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(feature = "cluster")]
fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        _ => None,
    }
}

/// Waits `backoff`; false if the client went away meanwhile.
async fn pause(backoff: Duration, requests: &mut mpsc::UnboundedReceiver<Request>) -> bool {
    let pause = tokio::time::sleep(backoff);
    tokio::pin!(pause);
    loop {
        tokio::select! {
            _ = &mut pause => return true,
            r = requests.recv() => if r.is_none() { return false },
        }
    }
}
