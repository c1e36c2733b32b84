//! Which open connections are idle, longest first, so that a full server
//! can close one to make room for a new connection.
//!
//! A connection is idle while no request of it is in flight: between its
//! opening and its first request's head, and between a response's last
//! byte and the next request. Only idle connections are closed to make
//! room, the one idle longest first (as proxies do), so connections that
//! hold the cap without using it (idle keep-alives, connections opened and
//! left) give way to new ones, while connections in use (a request being
//! answered, a live event stream) keep theirs.
//!
//! Idleness is kept in a queue in the order connections became idle, with
//! a stamp per entry: an entry whose connection was busy since (its stamp
//! moved on) or closed is skipped when it reaches the front, so marking and
//! finding cost O(1) amortised.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, Response};
use tokio::sync::Notify;

/// The open connections of one server.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u64,
    open: HashMap<u64, Entry>,
    /// `(connection, stamp)` in the order they became idle.
    idle: VecDeque<(u64, u64)>,
}

#[derive(Debug)]
struct Entry {
    in_flight: usize,
    /// Moves on each time the connection becomes idle.
    stamp: u64,
    close: Arc<Notify>,
}

/// One open connection's place in [`Connections`]; it leaves when dropped.
#[derive(Debug)]
pub(crate) struct Connection {
    connections: Arc<Connections>,
    id: u64,
    close: Arc<Notify>,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new connection, idle until its first request.
    pub(crate) fn open(self: &Arc<Self>) -> Connection {
        let close = Arc::new(Notify::new());
        let mut inner = self.lock();
        let id = inner.next;
        inner.next += 1;
        inner.open.insert(
            id,
            Entry {
                in_flight: 0,
                stamp: 0,
                close: close.clone(),
            },
        );
        inner.idle.push_back((id, 0));
        Connection {
            connections: self.clone(),
            id,
            close,
        }
    }

    /// Asks the connection idle longest to close; `false` if none is idle.
    pub(crate) fn close_longest_idle(&self) -> bool {
        let mut inner = self.lock();
        while let Some((id, stamp)) = inner.idle.pop_front() {
            let Some(entry) = inner.open.get_mut(&id) else {
                continue; // closed since
            };
            if entry.in_flight > 0 || entry.stamp != stamp {
                continue; // busy since, or idle again later in the queue
            }
            entry.close.notify_one();
            // Asked once: it leaves the queue for good, so a connection
            // already closing is never counted as room twice.
            entry.stamp += 1;
            return true;
        }
        false
    }

    fn started(&self, id: u64) {
        if let Some(entry) = self.lock().open.get_mut(&id) {
            entry.in_flight += 1;
        }
    }

    fn finished(&self, id: u64) {
        let mut inner = self.lock();
        let Some(entry) = inner.open.get_mut(&id) else {
            return;
        };
        entry.in_flight -= 1;
        if entry.in_flight == 0 {
            entry.stamp += 1;
            let stamp = entry.stamp;
            inner.idle.push_back((id, stamp));
        }
    }

    /// Connections idle now (for tests).
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        let inner = self.lock();
        inner.open.values().filter(|e| e.in_flight == 0).count()
    }
}

impl Connection {
    /// Resolves when the server asks this connection to close (to make
    /// room): it should stop after the request in flight, if any.
    pub(crate) async fn close_asked(&self) {
        self.close.notified().await;
    }

    /// `service` with its requests counted as this connection's: in flight
    /// from the request until its response's body has been sent (or
    /// dropped).
    pub(crate) fn track<S>(&self, service: S) -> Tracked<S> {
        Tracked {
            inner: service,
            connections: self.connections.clone(),
            id: self.id,
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.connections.lock().open.remove(&self.id);
    }
}

/// A service whose requests count as one connection's (see
/// [`Connection::track`]).
#[derive(Debug, Clone)]
pub(crate) struct Tracked<S> {
    inner: S,
    connections: Arc<Connections>,
    id: u64,
}

/// One request in flight; finished when dropped.
struct InFlight {
    connections: Arc<Connections>,
    id: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.connections.finished(self.id);
    }
}

impl<S, B> tower::Service<Request<B>> for Tracked<S>
where
    S: tower::Service<Request<B>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.connections.started(self.id);
        let in_flight = InFlight {
            connections: self.connections.clone(),
            id: self.id,
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                Body::new(CountedBody {
                    inner: body,
                    _in_flight: in_flight,
                })
            }))
        })
    }
}

/// A response body that keeps its request in flight until it is done.
struct CountedBody {
    inner: Body,
    _in_flight: InFlight,
}

impl http_body::Body for CountedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_idle_connection_is_asked_to_close_first_and_busy_ones_never() {
        let connections = Arc::new(Connections::default());
        let first = connections.open();
        let second = connections.open();
        let third = connections.open();
        // The first becomes busy, then idle again: now it is the youngest.
        connections.started(first.id);
        assert_eq!(connections.idle_count(), 2);
        connections.finished(first.id);
        // The third is busy.
        connections.started(third.id);
        assert!(connections.close_longest_idle());
        assert!(
            futures_util::FutureExt::now_or_never(second.close_asked()).is_some(),
            "the second was idle longest"
        );
        assert!(connections.close_longest_idle());
        assert!(futures_util::FutureExt::now_or_never(first.close_asked()).is_some());
        assert!(
            !connections.close_longest_idle(),
            "the third is busy, the others asked already"
        );
        drop(third);
        drop(first);
        drop(second);
        assert!(connections.inner.lock().unwrap().open.is_empty());
    }
}
