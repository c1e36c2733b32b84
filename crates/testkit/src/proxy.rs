//! A TCP proxy between clients and a Redis server that a test drives, per
//! connection and direction: pass bytes on, delay them, hold them (a black
//! hole: nothing arrives until the mode changes), or close the connection.
//!
//! It runs on a thread of its own with its own tokio runtime, so a test's
//! runtime (current-thread or blocked) never stalls it.
//!
//! ```no_run
//! use testkit::{Direction, FaultProxy, Mode, RedisServer};
//! let server = RedisServer::start();
//! let proxy = FaultProxy::start(&server);
//! let url = proxy.url(); // connect the client under test here
//! proxy.set(Direction::ToClient, Mode::BlackHole); // replies are held...
//! proxy.close_all(); // ...and lost with the connections
//! proxy.set(Direction::Both, Mode::Pass);
//! ```

use std::collections::BTreeMap;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to Redis (requests).
    ToServer,
    /// From Redis to the client (replies, pub/sub messages).
    ToClient,
    /// Both ways.
    Both,
}

/// What the proxy does with the bytes of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Pass them on at once.
    Pass,
    /// Pass them on after this delay (order kept).
    Delay(Duration),
    /// Hold them: nothing is passed on until the mode changes (then what was
    /// held goes on), or the connection is closed (then it is lost).
    BlackHole,
}

/// The modes of one connection (or of connections to come).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Modes {
    to_server: Mode,
    to_client: Mode,
}

impl Modes {
    fn set(&mut self, direction: Direction, mode: Mode) {
        if direction != Direction::ToClient {
            self.to_server = mode;
        }
        if direction != Direction::ToServer {
            self.to_client = mode;
        }
    }
}

struct Link {
    modes: watch::Sender<Modes>,
    close: watch::Sender<bool>,
}

struct State {
    upstream: Upstream,
    /// Whether the upstream speaks TLS (clients then do too).
    tls: bool,
    default: Modes,
    links: BTreeMap<u64, Link>,
    next_id: u64,
    accepted: u64,
}

#[derive(Debug, Clone)]
enum Upstream {
    Tcp(u16),
    Unix(PathBuf),
}

/// A fault-injecting TCP proxy in front of one Redis server; stopped when
/// dropped.
pub struct FaultProxy {
    port: u16,
    state: Arc<Mutex<State>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl FaultProxy {
    /// A proxy on a free port of 127.0.0.1 in front of `server`, passing
    /// everything.
    pub fn start(server: &launcher::RedisServer) -> Self {
        let upstream = upstream_of(server);
        let listener = StdListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let state = Arc::new(Mutex::new(State {
            upstream,
            tls: server.is_tls(),
            default: Modes {
                to_server: Mode::Pass,
                to_client: Mode::Pass,
            },
            links: BTreeMap::new(),
            next_id: 0,
            accepted: 0,
        }));
        let (shutdown, stop) = tokio::sync::oneshot::channel();
        let thread = {
            let state = state.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                runtime.block_on(accept(listener, state, stop));
            })
        };
        Self {
            port,
            state,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// The proxy's TCP port on 127.0.0.1 (for a replica to replicate
    /// through it, say).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL a client connects to through the proxy (`rediss://` in
    /// front of a TLS server: the proxy passes the encrypted bytes).
    pub fn url(&self) -> String {
        let scheme = if lock(&self.state).tls {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Sets `mode` for `direction` on every open connection and on those to
    /// come.
    pub fn set(&self, direction: Direction, mode: Mode) {
        let mut state = lock(&self.state);
        state.default.set(direction, mode);
        for link in state.links.values() {
            link.modes.send_modify(|m| m.set(direction, mode));
        }
    }

    /// Sets `mode` for `direction` on connection `id` only (see
    /// [`connections`](Self::connections)).
    pub fn set_connection(&self, id: u64, direction: Direction, mode: Mode) {
        if let Some(link) = lock(&self.state).links.get(&id) {
            link.modes.send_modify(|m| m.set(direction, mode));
        }
    }

    /// Sends new connections to `server` from now on (a failover); open
    /// connections stay where they are until closed.
    pub fn set_upstream(&self, server: &launcher::RedisServer) {
        let mut state = lock(&self.state);
        state.upstream = upstream_of(server);
        state.tls = server.is_tls();
    }

    /// The ids of the open connections, oldest first.
    pub fn connections(&self) -> Vec<u64> {
        lock(&self.state).links.keys().copied().collect()
    }

    /// Connections accepted since the proxy started.
    pub fn accepted(&self) -> u64 {
        lock(&self.state).accepted
    }

    /// Closes connection `id` on both sides; bytes held are lost.
    pub fn close(&self, id: u64) {
        if let Some(link) = lock(&self.state).links.remove(&id) {
            link.close.send_replace(true);
        }
    }

    /// Closes every open connection on both sides; bytes held are lost.
    /// New connections are accepted as before.
    pub fn close_all(&self) {
        let links = std::mem::take(&mut lock(&self.state).links);
        for link in links.values() {
            link.close.send_replace(true);
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.close_all();
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn upstream_of(server: &launcher::RedisServer) -> Upstream {
    match server.port() {
        Some(port) => Upstream::Tcp(port),
        None => Upstream::Unix(server.socket_path()),
    }
}

async fn accept(
    listener: StdListener,
    state: Arc<Mutex<State>>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
    loop {
        let client = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        let _ = client.set_nodelay(true);
        let (modes, close, id, upstream) = {
            let mut state = lock(&state);
            let id = state.next_id;
            state.next_id += 1;
            state.accepted += 1;
            let (modes, modes_rx) = watch::channel(state.default);
            let (close, close_rx) = watch::channel(false);
            state.links.insert(id, Link { modes, close });
            (modes_rx, close_rx, id, state.upstream.clone())
        };
        let state = state.clone();
        tokio::spawn(async move {
            match &upstream {
                Upstream::Tcp(port) => {
                    if let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", *port)).await {
                        let _ = server.set_nodelay(true);
                        relay(client, server, modes, close).await;
                    }
                }
                Upstream::Unix(path) => {
                    if let Ok(server) = tokio::net::UnixStream::connect(path).await {
                        relay(client, server, modes, close).await;
                    }
                }
            }
            lock(&state).links.remove(&id);
        });
    }
}

/// Pumps both directions until either side closes or the test closes the
/// connection; dropping the halves closes both sockets.
async fn relay<S>(
    client: tokio::net::TcpStream,
    server: S,
    modes: watch::Receiver<Modes>,
    mut close: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite,
{
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = tokio::io::split(server);
    let up = pump(client_read, server_write, modes.clone(), |m| m.to_server);
    let down = pump(server_read, client_write, modes, |m| m.to_client);
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = close.wait_for(|closed| *closed) => {}
    }
}

async fn pump<R, W>(
    mut from: R,
    mut to: W,
    mut modes: watch::Receiver<Modes>,
    direction: fn(&Modes) -> Mode,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let mode = direction(&modes.borrow_and_update());
            match mode {
                Mode::Pass => break,
                Mode::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Mode::BlackHole => {
                    if modes.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
