//! The batcher's connection to one server: a socket the batching task
//! writes and reads itself.
//!
//! redis-rs's multiplexed connection hands each command to its driver
//! through a channel, gets the reply back through a oneshot and arms a timer
//! per command. The batching task needs none of that: it is the only
//! sender and already drives the connection from its own loop. Here a
//! command is written straight into the connection's buffer, the task
//! flushes it when it next drives the connection, and replies, which come
//! back in the order the commands went out, complete the oldest command
//! waiting. So one timer covers every command: only the oldest can be the
//! first to run out of time (`benches/README.md` has what this saves).
//!
//! The connection speaks RESP2 (`resp`), logs in (`AUTH`) and selects the
//! database as the client's URL says. A command whose reply does not come
//! within the response time-out fails with a time-out error and the
//! connection stays, as on redis-rs's connections: its reply, when it
//! comes, is read and dropped. When the connection breaks, or is dropped,
//! every command still waiting fails with a connection error.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{
    Cmd, ConnectionAddr, Pipeline, RedisConnectionInfo, RedisError, RedisFuture, RedisResult, Value,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use super::resp;
use crate::transport::Stream;

/// The read buffer's first size; it grows for a reply that does not fit.
const READ_BUFFER: usize = 16 * 1024;
/// A response time-out longer than this (the settings allow up to Redis's
/// largest millisecond count) waits this long: adding more to a clock
/// reading can overflow what an `Instant` holds on some platforms, and an
/// overflow panics.
const LONGEST_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The socket, driven by the batching task ([`Socket::poll_drive`]).
pub(super) struct Socket {
    shared: Arc<Mutex<Shared>>,
    /// The database selected (what its handles report).
    db: i64,
    io: Io,
}

/// What only the driving task touches.
struct Io {
    stream: Stream,
    /// Received bytes: `read[start..filled]` is not parsed yet.
    read: Vec<u8>,
    start: usize,
    filled: usize,
    /// Fires at or before the deadline of the oldest command still waiting.
    timer: Pin<Box<Sleep>>,
    /// When `timer` fires, if it is armed.
    armed: Option<Instant>,
}

/// A handle to send commands on (cloneable; implements redis-rs's
/// [`ConnectionLike`], so commands and pipelines run on it as on any
/// redis-rs connection).
#[derive(Clone)]
pub(crate) struct Handle {
    shared: Arc<Mutex<Shared>>,
    db: i64,
}

/// What a [`Handle`] and its [`Socket`] share.
struct Shared {
    /// Commands not written yet: `out[written..]`.
    out: Vec<u8>,
    written: usize,
    /// Commands sent, oldest first, each waiting for its replies.
    waiting: VecDeque<Waiting>,
    /// Why the connection is closed, once it is.
    closed: Option<RedisError>,
    /// The task driving the socket, to wake when there is something to write.
    driver: Option<Waker>,
    response_timeout: Duration,
}

struct Waiting {
    deadline: Instant,
    reply: Awaited,
}

/// Where a command's replies go.
enum Awaited {
    /// One command's reply; `None` once it timed out (the reply, when it
    /// comes, is dropped).
    One(Option<oneshot::Sender<RedisResult<Value>>>),
    /// A pipeline's: `skip` replies dropped, then `count` kept.
    Many {
        skip: usize,
        count: usize,
        values: Vec<Value>,
        to: Option<oneshot::Sender<RedisResult<Vec<Value>>>>,
    },
}

impl Awaited {
    /// Answers with `error` (the reply then is dropped when it comes).
    fn fail(&mut self, error: &RedisError) {
        match self {
            Awaited::One(to) => {
                if let Some(to) = to.take() {
                    let _ = to.send(Err(error.clone()));
                }
            }
            Awaited::Many { to, .. } => {
                if let Some(to) = to.take() {
                    let _ = to.send(Err(error.clone()));
                }
            }
        }
    }

    fn answered(&self) -> bool {
        match self {
            Awaited::One(to) => to.is_none(),
            Awaited::Many { to, .. } => to.is_none(),
        }
    }
}

impl Socket {
    /// Connects to `addr` (over TLS with `tls`'s connectors for a
    /// `rediss://` address), logs in and selects the database as `redis`
    /// says; then the socket is ready for commands (which wait at most
    /// `response_timeout` for their replies).
    pub(super) async fn connect(
        addr: &ConnectionAddr,
        redis: &RedisConnectionInfo,
        response_timeout: Duration,
        tls: &crate::tls::Connectors,
    ) -> RedisResult<Socket> {
        let stream = Stream::open(addr, tls).await?;
        let response_timeout = response_timeout.min(LONGEST_WAIT);
        let shared = Arc::new(Mutex::new(Shared {
            out: Vec::new(),
            written: 0,
            waiting: VecDeque::new(),
            closed: None,
            driver: None,
            response_timeout,
        }));
        let mut socket = Socket {
            shared,
            db: redis.db(),
            io: Io {
                stream,
                read: vec![0; READ_BUFFER],
                start: 0,
                filled: 0,
                timer: Box::pin(tokio::time::sleep(response_timeout)),
                armed: None,
            },
        };
        if let Some(password) = redis.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(username) = redis.username() {
                auth.arg(username);
            }
            auth.arg(password);
            socket.ask(&auth).await?;
        }
        if redis.db() != 0 {
            socket.ask(redis::cmd("SELECT").arg(redis.db())).await?;
        }
        Ok(socket)
    }

    /// A handle to send commands on this socket.
    pub(super) fn handle(&self) -> Handle {
        Handle {
            shared: self.shared.clone(),
            db: self.db,
        }
    }

    /// Sends `cmd` and waits for its reply, driving the socket meanwhile
    /// (for a socket nobody else drives yet). A server error is an error.
    pub(super) async fn ask(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let mut handle = self.handle();
        let mut query = handle.req_packed_command(cmd);
        let reply = std::future::poll_fn(|cx| {
            if let Poll::Ready(reply) = query.as_mut().poll(cx) {
                return Poll::Ready(reply);
            }
            if self.poll_drive(cx).is_ready() {
                return Poll::Ready(Err(self.lock().closed.clone().unwrap_or_else(aborted)));
            }
            Poll::Pending
        })
        .await;
        reply.and_then(Value::extract_error)
    }

    /// Writes what is queued, reads and hands out replies, and fails the
    /// commands whose time ran out. Ready (once) when the connection has
    /// closed; every command still waiting then has failed.
    pub(super) fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let mut shared = lock(&self.shared);
        if shared.closed.is_some() {
            return Poll::Ready(());
        }
        if !shared
            .driver
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            shared.driver = Some(cx.waker().clone());
        }
        let io = &mut self.io;
        if let Err(e) = io
            .write(&mut shared, cx)
            .and_then(|()| io.read(&mut shared, cx))
        {
            shared.close(e);
            return Poll::Ready(());
        }
        io.time_out(&mut shared, cx);
        Poll::Pending
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }
}

impl Io {
    fn write(&mut self, shared: &mut Shared, cx: &mut Context<'_>) -> RedisResult<()> {
        while shared.written < shared.out.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &shared.out[shared.written..]) {
                Poll::Ready(Ok(0)) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Poll::Ready(Ok(n)) => shared.written += n,
                Poll::Ready(Err(e)) => return Err(e.into()),
                Poll::Pending => return Ok(()),
            }
        }
        shared.out.clear();
        shared.written = 0;
        match Pin::new(&mut self.stream).poll_flush(cx) {
            Poll::Ready(Err(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn read(&mut self, shared: &mut Shared, cx: &mut Context<'_>) -> RedisResult<()> {
        loop {
            if self.filled == self.read.len() {
                if self.start > 0 {
                    self.read.copy_within(self.start..self.filled, 0);
                    self.filled -= self.start;
                    self.start = 0;
                } else {
                    let grown = self.read.len() * 2;
                    self.read.resize(grown, 0);
                }
            }
            let mut buf = ReadBuf::new(&mut self.read[self.filled..]);
            match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) => {
                    let n = buf.filled().len();
                    if n == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            "the server closed the connection",
                        )
                        .into());
                    }
                    self.filled += n;
                }
                Poll::Ready(Err(e)) => return Err(e.into()),
                Poll::Pending => return Ok(()),
            }
            while let Some((value, used)) = resp::read(&self.read[self.start..self.filled])? {
                self.start += used;
                shared.deliver(value)?;
            }
            if self.start == self.filled {
                self.start = 0;
                self.filled = 0;
            }
        }
    }

    /// Fails the commands whose deadline has passed and keeps the timer
    /// armed for the oldest one left. The timer is moved only when it would
    /// fire too late: firing early costs a look, re-arming on every command
    /// a timer-wheel update.
    fn time_out(&mut self, shared: &mut Shared, cx: &mut Context<'_>) {
        loop {
            let Some(deadline) = shared.first_deadline() else {
                return;
            };
            if self.armed.is_none_or(|at| at > deadline) {
                self.timer.as_mut().reset(deadline);
                self.armed = Some(deadline);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return;
            }
            self.armed = None;
            shared.expire(Instant::now());
        }
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // Commands on a socket gone get no replies: they fail now rather
        // than wait for a deadline nobody checks any more.
        self.lock().close(aborted());
    }
}

/// The state, even after a panic elsewhere left the lock poisoned (every
/// change to it is complete before anything can panic).
fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Hands `value` to the oldest command waiting.
    fn deliver(&mut self, value: Value) -> RedisResult<()> {
        let Some(front) = self.waiting.front_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server sent a reply nobody asked for",
            )
            .into());
        };
        match &mut front.reply {
            Awaited::One(to) => {
                if let Some(to) = to.take() {
                    let _ = to.send(Ok(value));
                }
            }
            Awaited::Many {
                skip,
                count,
                values,
                to,
            } => {
                if *skip > 0 {
                    *skip -= 1;
                } else {
                    values.push(value);
                }
                if *skip > 0 || values.len() < *count {
                    return Ok(());
                }
                if let Some(to) = to.take() {
                    let _ = to.send(Ok(std::mem::take(values)));
                }
            }
        }
        self.waiting.pop_front();
        Ok(())
    }

    /// The deadline of the oldest command still waiting for an answer.
    fn first_deadline(&self) -> Option<Instant> {
        self.waiting
            .iter()
            .find(|w| !w.reply.answered())
            .map(|w| w.deadline)
    }

    /// Fails each command whose deadline is past `now` with a time-out.
    fn expire(&mut self, now: Instant) {
        let timed_out = RedisError::from(io::Error::new(
            io::ErrorKind::TimedOut,
            "no reply from Redis within the response time-out",
        ));
        for waiting in &mut self.waiting {
            if waiting.deadline > now {
                break;
            }
            waiting.reply.fail(&timed_out);
        }
    }

    /// Closes the connection for `error`: every command waiting fails.
    fn close(&mut self, error: RedisError) {
        if self.closed.is_some() {
            return;
        }
        for mut waiting in self.waiting.drain(..) {
            waiting.reply.fail(&error);
        }
        self.out = Vec::new();
        self.written = 0;
        self.driver = None;
        self.closed = Some(error);
    }
}

/// A reply that cannot come any more: the socket is gone.
fn aborted() -> RedisError {
    RedisError::from(io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the connection to Redis was closed",
    ))
}

impl Handle {
    /// Sends one command packed already (`resp::Packer`): its reply, a
    /// server's error included as a value.
    pub(crate) fn send_packed_one(
        &self,
        packed: &[u8],
    ) -> impl Future<Output = RedisResult<Value>> + Send + 'static {
        answer(self.queue_one(|out| out.extend_from_slice(packed)))
    }

    /// Sends `count` commands packed already, one after the other: their
    /// replies, each a value of its own (a server's error included).
    pub(crate) fn send_packed(
        &self,
        count: usize,
        packed: &[u8],
    ) -> impl Future<Output = RedisResult<Vec<Value>>> + Send + 'static {
        answer(self.queue_many(0, count, |out| out.extend_from_slice(packed)))
    }

    /// Queues the command `write` writes, expecting what `awaited` makes
    /// of the reply's sender; wakes the driver if its buffer was empty.
    fn queue<T>(
        &self,
        write: impl FnOnce(&mut Vec<u8>),
        awaited: impl FnOnce(oneshot::Sender<RedisResult<T>>) -> Awaited,
    ) -> Queued<T> {
        let mut shared = lock(&self.shared);
        if let Some(e) = &shared.closed {
            return Err(e.clone());
        }
        let (to, from) = oneshot::channel();
        let idle = shared.out.is_empty();
        write(&mut shared.out);
        let deadline = Instant::now() + shared.response_timeout;
        shared.waiting.push_back(Waiting {
            deadline,
            reply: awaited(to),
        });
        if idle {
            if let Some(driver) = &shared.driver {
                driver.wake_by_ref();
            }
        }
        Ok(from)
    }

    /// Queues the command `write` writes: where its reply will come.
    fn queue_one(&self, write: impl FnOnce(&mut Vec<u8>)) -> Queued<Value> {
        self.queue(write, |to| Awaited::One(Some(to)))
    }

    /// Queues the commands `write` writes: where the replies of `count` of
    /// them after the first `skip` will come.
    fn queue_many(
        &self,
        skip: usize,
        count: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Queued<Vec<Value>> {
        self.queue(write, |to| Awaited::Many {
            skip,
            count,
            values: Vec::with_capacity(count),
            to: Some(to),
        })
    }
}

/// Where the reply to commands queued on a [`Handle`] will come, or why
/// they could not be queued.
type Queued<T> = RedisResult<oneshot::Receiver<RedisResult<T>>>;

/// The reply `queued` gets (an error if the socket went away first).
async fn answer<T>(queued: Queued<T>) -> RedisResult<T> {
    queued?.await.unwrap_or_else(|_| Err(aborted()))
}

impl ConnectionLike for Handle {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(answer(self.queue_one(|out| cmd.write_packed_command(out))))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        if offset + count == 0 {
            return Box::pin(async { Ok(Vec::new()) });
        }
        Box::pin(answer(self.queue_many(offset, count, |out| {
            if pipeline.is_transaction() {
                out.extend_from_slice(&pipeline.get_packed_pipeline());
            } else {
                for cmd in pipeline.cmd_iter() {
                    cmd.write_packed_command(out);
                }
            }
        })))
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::{Direction, FaultProxy, Mode, RedisServer};

    /// A socket to `url` whose commands wait at most `timeout`.
    async fn open(url: &str, timeout: Duration) -> (Handle, Socket) {
        let client = redis::Client::open(url).unwrap();
        let info = client.get_connection_info();
        let tls = crate::tls::Connectors::default();
        let socket = Socket::connect(info.addr(), info.redis_settings(), timeout, &tls)
            .await
            .unwrap();
        (socket.handle(), socket)
    }

    /// A socket through a proxy that from now on holds every reply.
    async fn black_holed() -> (RedisServer, FaultProxy, Handle, Socket) {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(&server);
        let (handle, mut socket) = open(&proxy.url(), Duration::from_secs(60)).await;
        // A round trip: the proxy has taken the connection.
        socket.ask(&echo("hello")).await.unwrap();
        proxy.set(Direction::ToClient, Mode::BlackHole);
        (server, proxy, handle, socket)
    }

    fn echo(text: &str) -> Cmd {
        let mut cmd = redis::cmd("ECHO");
        cmd.arg(text);
        cmd
    }

    #[tokio::test]
    async fn a_reply_after_its_time_out_is_dropped_and_the_next_gets_its_own() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(&server);
        let (_handle, mut socket) = open(&proxy.url(), Duration::from_secs(1)).await;
        proxy.set(Direction::ToClient, Mode::BlackHole);
        let late = socket.ask(&echo("first")).await.unwrap_err();
        assert!(late.is_timeout(), "{late}");
        // The held reply to "first" arrives now, ahead of the next one.
        proxy.set(Direction::ToClient, Mode::Pass);
        let next = socket.ask(&echo("second")).await.unwrap();
        assert_eq!(next, Value::BulkString(b"second".to_vec()));
    }

    #[tokio::test]
    async fn a_pipeline_gets_its_replies_and_server_errors_stay_values() {
        let server = RedisServer::start();
        let (mut handle, mut socket) = open(&server.url(), Duration::from_secs(5)).await;
        let mut pipe = redis::pipe();
        pipe.add_command(echo("a"))
            .cmd("NO-SUCH-COMMAND")
            .add_command(echo("c"));
        let replies = handle.req_packed_commands(&pipe, 1, 2);
        let mut replies = std::pin::pin!(replies);
        let replies = std::future::poll_fn(|cx| {
            let _ = socket.poll_drive(cx);
            replies.as_mut().poll(cx)
        })
        .await
        .unwrap();
        assert!(matches!(replies[0], Value::ServerError(_)), "{replies:?}");
        assert_eq!(replies[1], Value::BulkString(b"c".to_vec()));
    }

    #[tokio::test]
    async fn a_broken_connection_fails_what_waits_and_what_comes_after() {
        let (_server, proxy, mut handle, mut socket) = black_holed().await;
        let (lost, after) = (echo("lost"), echo("after"));
        let mut other = handle.clone();
        let waiting = handle.req_packed_command(&lost);
        let mut waiting = std::pin::pin!(waiting);
        let mut closed = false;
        let reply = std::future::poll_fn(|cx| {
            if !closed {
                // Written before the connection goes.
                let _ = socket.poll_drive(cx);
                proxy.close_all();
                closed = true;
            }
            let _ = socket.poll_drive(cx);
            waiting.as_mut().poll(cx)
        })
        .await;
        let e = reply.unwrap_err();
        assert!(e.is_connection_dropped(), "{e}");
        let after = other.req_packed_command(&after).await.unwrap_err();
        assert!(after.is_connection_dropped(), "{after}");
        let ended = std::future::poll_fn(|cx| Poll::Ready(socket.poll_drive(cx))).await;
        assert!(ended.is_ready(), "the socket says it has closed");
    }

    #[tokio::test]
    async fn dropping_the_socket_fails_what_waits() {
        let (_server, _proxy, mut handle, mut socket) = black_holed().await;
        let orphan = echo("orphan");
        let waiting = handle.req_packed_command(&orphan);
        let mut waiting = std::pin::pin!(waiting);
        std::future::poll_fn(|cx| {
            let _ = waiting.as_mut().poll(cx);
            let _ = socket.poll_drive(cx);
            Poll::Ready(())
        })
        .await;
        drop(socket);
        // Not left waiting for a deadline nobody checks (60 s away).
        let e = tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .expect("failed at once")
            .unwrap_err();
        assert!(e.is_connection_dropped(), "{e}");
    }
}
