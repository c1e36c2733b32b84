//! The HTTP server loop: the router on hyper, with the connection limits a
//! public service needs.
//!
//! `axum::serve` sets none: an idle or trickling connection was held
//! forever, and 20,000 of them filled the process' file limit.
//! Here:
//!
//! * **header timeout**: a request's head must arrive whole within
//!   [`ConnectionLimits::header_timeout`] of the connection opening or of
//!   the previous response (hyper's `header_read_timeout`, which runs on idle
//!   keep-alive connections too): slowloris and idle connections are closed;
//! * **body timeout**: a request body must arrive whole within
//!   [`ConnectionLimits::body_timeout`] (408);
//! * **connection cap**: at [`ConnectionLimits::max_connections`] open
//!   connections, the one idle longest is closed to make room for a new one
//!   (`idle`), so only connections in use hold the cap; when none is idle,
//!   the new one gets a short 503 and is closed at once, so the process
//!   keeps file descriptors for its Redis, its database and the connections
//!   it serves;
//! * **per-address cap**: past [`ConnectionLimits::max_per_address`] open
//!   connections from one client address, the same: one address that keeps
//!   reopening connections cannot take the whole cap from everyone else;
//! * graceful shutdown: no new connections; idle ones are closed, requests
//!   in flight finish.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tower::Service;

use super::idle::Connections;

/// How long a connection accepted at the cap waits for the room an idle
/// connection's closing makes before it is refused.
const ROOM_WAIT: Duration = Duration::from_secs(1);

pub use crate::limits::ConnectionLimits;

/// The answer a connection past the cap gets before it is closed.
const OVERLOADED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 67\r\n\r\n\
{\"code\":\"overloaded\",\"message\":\"too many connections; retry later\"}";

/// Serves `router` on `listener` under `limits` until `stop` turns true,
/// then lets requests in flight finish.
///
/// # Errors
/// None today: accept errors (such as running out of descriptors) are
/// logged and retried.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let router = router.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_timeout,
    ));
    let mut make_service = router.into_make_service_with_connect_info::<SocketAddr>();
    let max = limits.max_connections.min(Semaphore::MAX_PERMITS) as u32;
    let slots = Arc::new(Semaphore::new(max as usize));
    let per_address = PerAddress::new(limits.max_per_address);
    let connections = Arc::new(Connections::default());
    // HTTP/1 only: the protocol sniffing of hyper-util's `auto` builder
    // waits for a client's first bytes with no timeout, so an idle
    // connection never reached the header timeout.
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    // Connections accepted at the cap, back with a slot once an idle one
    // closed to make room.
    let (roomed, mut made_room) = mpsc::unbounded_channel::<Roomed>();
    let mut stopping = stop.clone();
    let stopped = async move {
        let _ = stopping.wait_for(|s| *s).await;
    };
    tokio::pin!(stopped);
    loop {
        let (stream, peer, address_slot, slot) = tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors (EMFILE) is the usual one: wait
                        // for connections to close rather than spin.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(address_slot) = per_address.take(peer.ip()) else {
                    tokio::spawn(refuse(stream));
                    continue;
                };
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => (stream, peer, address_slot, slot),
                    Err(_) if connections.close_longest_idle() => {
                        let (slots, roomed) = (slots.clone(), roomed.clone());
                        tokio::spawn(async move {
                            match tokio::time::timeout(ROOM_WAIT, slots.acquire_owned()).await {
                                Ok(Ok(slot)) => {
                                    let _ = roomed.send((stream, peer, address_slot, slot));
                                }
                                _ => refuse(stream).await,
                            }
                        });
                        continue;
                    }
                    Err(_) => {
                        tokio::spawn(refuse(stream));
                        continue;
                    }
                }
            }
            Some(roomed) = made_room.recv() => roomed,
            () = &mut stopped => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(service) = make_service.call(peer).await;
        let connection = connections.open();
        let conn = builder.serve_connection(
            TokioIo::new(stream),
            TowerToHyperService::new(connection.track(service)),
        );
        let mut stop = stop.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let mut closing = false;
            let ended = loop {
                tokio::select! {
                    ended = conn.as_mut() => break ended,
                    () = connection.close_asked(), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    _ = stop.wait_for(|s| *s), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            };
            if let Err(e) = ended {
                // Timeouts and clients going away end up here: routine.
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop((slot, address_slot, connection));
        });
    }
    drop(listener);
    drop(made_room);
    // Every connection holds a slot until it ends: all of them back means
    // every request in flight finished.
    let _ = slots.acquire_many(max).await;
    Ok(())
}

type Roomed = (TcpStream, SocketAddr, AddressSlot, OwnedSemaphorePermit);

/// Open connections per client address, each at most `max`.
#[derive(Clone)]
struct PerAddress {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
}

/// One open connection of an address; given back when dropped.
struct AddressSlot {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    address: IpAddr,
}

impl PerAddress {
    fn new(max: usize) -> Self {
        Self {
            open: Arc::default(),
            max,
        }
    }

    /// A slot for one more connection from `address`, if it has fewer than
    /// `max` open.
    fn take(&self, address: IpAddr) -> Option<AddressSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(address).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(AddressSlot {
            open: self.open.clone(),
            address,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                // Only addresses with connections open are kept.
                open.remove(&self.address);
            }
        }
    }
}

/// Answers a connection past a cap with a 503 and closes it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(OVERLOADED).await?;
        stream.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_at_most_its_share_and_gives_it_back() {
        let per_address = PerAddress::new(2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "::1".parse().unwrap();
        let first = per_address.take(a).unwrap();
        let _second = per_address.take(a).unwrap();
        assert!(per_address.take(a).is_none());
        assert!(
            per_address.take(b).is_some(),
            "another address is not affected"
        );
        drop(first);
        assert!(per_address.take(a).is_some());
    }

    #[test]
    fn the_overload_answer_is_well_formed() {
        let text = std::str::from_utf8(OVERLOADED).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["code"], "overloaded");
    }
}
