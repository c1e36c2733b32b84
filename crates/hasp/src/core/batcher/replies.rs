//! What a call's replies do: each request completed with its reply (a
//! native command that found the lock otherwise goes through the function
//! next), and what a call leaves behind (settlements of lost replies,
//! requests to send again after a broken connection or a redirect).

use std::sync::atomic::Ordering;

use redis::{RedisError, Value};
use tokio::sync::mpsc;

use super::connection;
use super::queue::{closed, Request};
use super::{CallStats, MAX_REDIRECTS, REDIRECT_PAUSE};
use crate::core::wire::{Nonces, Op, Reply};
use crate::error::{is_redirect, Error};

/// The result of one call: the error that broke it, the settlements it
/// leaves (if its reply was lost) and the requests to send again.
#[derive(Default)]
pub(super) struct Sent {
    pub(super) error: Option<RedisError>,
    pub(super) unsettled: Vec<Op>,
    pub(super) retries: Vec<Request>,
    /// Some operation was refused by a replica: the server is no longer the
    /// master.
    pub(super) stale: bool,
    /// Some operation reached a cluster node that does not serve its slot.
    pub(super) misrouted: bool,
    /// The server answered `NOSCRIPT` to a native script.
    pub(super) scripts_lost: bool,
}

impl Sent {
    /// Adds what another part of the same call left.
    pub(super) fn merge(&mut self, other: Sent) {
        if self.error.is_none() {
            self.error = other.error;
        }
        self.unsettled.extend(other.unsettled);
        self.retries.extend(other.retries);
        self.stale |= other.stale;
        self.misrouted |= other.misrouted;
        self.scripts_lost |= other.scripts_lost;
    }
}

/// Completes a request sent as a native command. A command that found the
/// lock otherwise changed nothing: the request goes through the function,
/// first in the next call (with the retries). A failure is the function's
/// failure (the settlement is the same).
pub(super) fn native_answered(
    mut request: Request,
    reply: redis::RedisResult<Value>,
    stats: &CallStats,
    nonces: &Nonces,
    requeue: &mpsc::WeakUnboundedSender<Request>,
) -> Sent {
    // A server's error may come as a value (`-LOADING` while it loads).
    match reply.and_then(Value::extract_error) {
        Ok(value) => match request.op.decode_native(&value) {
            Ok(Some(reply)) => {
                stats.native_ops.fetch_add(1, Ordering::Relaxed);
                (request.done)(Ok(reply));
                Sent::default()
            }
            Ok(None) => {
                stats.native_fallbacks.fetch_add(1, Ordering::Relaxed);
                request.scripted = true;
                Sent {
                    retries: vec![request],
                    ..Sent::default()
                }
            }
            Err(e) => {
                (request.done)(Err(e));
                Sent::default()
            }
        },
        Err(e) if is_redirect(&e) || connection::is_read_only(&e) => {
            redirected(e, Vec::new(), vec![request], requeue.clone())
        }
        // The server lost the script (`SCRIPT FLUSH`): nothing was applied;
        // the scripts are loaded again before the next call.
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            stats.native_fallbacks.fetch_add(1, Ordering::Relaxed);
            request.scripted = true;
            Sent {
                retries: vec![request],
                scripts_lost: true,
                ..Sent::default()
            }
        }
        Err(e) => failed(&Error::Redis(e), Vec::new(), vec![request], nonces),
    }
}

/// Completes a call Redis answered. With replica acknowledgement, `acks`
/// is (acknowledged, wanted): an acquisition fewer confirmed is undone (by
/// its nonce) and answered `NotReplicated`; a renewal just does not count.
/// Returns the requests whose operation reached a cluster node that does
/// not serve its slot (applied nothing: to send again) apart.
pub(super) fn answered(
    settle: Vec<Op>,
    batch: Vec<Request>,
    values: Vec<Value>,
    acks: Option<(u32, u32)>,
) -> (Sent, Vec<Request>) {
    let mut values = values.into_iter();
    let mut unsettled = Vec::new();
    let mut misrouted = Vec::new();
    let mut settle_misrouted = false;
    let mut stale = false;
    for (op, value) in settle.into_iter().zip(values.by_ref()) {
        match op.decode(&value) {
            Err(Error::Redis(e)) if is_redirect(&e) || connection::is_read_only(&e) => {
                settle_misrouted = true;
                stale |= connection::is_read_only(&e);
                unsettled.push(op);
            }
            Err(e) => tracing::warn!(error = %e, "settling a lost reply failed"),
            Ok(_) => {}
        }
    }
    let short = acks.filter(|(acked, wanted)| acked < wanted);
    for (request, value) in batch.into_iter().zip(values) {
        let mut reply = request.op.decode(&value);
        // Reached a node that does not serve the slot, or a replica (a
        // demoted master): applied nothing (every operation reads before
        // it writes), so it goes again, to the right node.
        if let Err(Error::Redis(e)) = &reply {
            if is_redirect(e) || connection::is_read_only(e) {
                stale |= connection::is_read_only(e);
                misrouted.push(request);
                continue;
            }
        }
        if let Some((acked, wanted)) = short {
            if request.op.needs_replicas() && reply.is_ok() {
                if reply.as_ref().is_ok_and(Reply::grants) {
                    unsettled.extend(request.op.settlement().into_iter().take(1));
                }
                reply = Err(Error::NotReplicated { acked, wanted });
            }
        }
        (request.done)(reply);
    }
    let sent = Sent {
        error: None,
        misrouted: settle_misrouted || !misrouted.is_empty(),
        unsettled,
        retries: Vec::new(),
        stale,
        scripts_lost: false,
    };
    (sent, misrouted)
}

/// Completes a call that failed with `error`. Its settlements were not
/// confirmed, whatever the error: they go again. A lost reply leaves each
/// request's settlement, and a broken connection (not a slow one) one more
/// try on a new connection after them; a refused call (Redis loading its
/// data, out of memory, ...) applied nothing, but a release must still
/// happen.
pub(super) fn failed(error: &Error, settle: Vec<Op>, batch: Vec<Request>, nonces: &Nonces) -> Sent {
    let redis = match error {
        Error::Redis(r) => Some(r.clone()),
        _ => None,
    };
    let unknown = redis.as_ref().is_some_and(outcome_unknown);
    let retry = redis
        .as_ref()
        .is_some_and(|r| outcome_unknown(r) && !r.is_timeout());
    let mut sent = Sent {
        error: redis,
        unsettled: settle,
        retries: Vec::new(),
        stale: false,
        misrouted: false,
        scripts_lost: false,
    };
    for request in batch {
        if unknown {
            let (settle, again) = request.after_broken_call(retry, nonces);
            sent.unsettled.extend(settle);
            sent.retries.extend(again);
        } else {
            sent.unsettled.extend(request.op.unfinished());
            (request.done)(Err(error.clone()));
        }
    }
    sent
}

/// Completes a redirected call, or one a replica refused: nothing was
/// applied, so each request goes again after a pause (see
/// [`send_again_later`]) once the slot map, or for one server the
/// master's address, is found afresh; its settlements stay pending.
pub(super) fn redirected(
    error: RedisError,
    settle: Vec<Op>,
    batch: Vec<Request>,
    requeue: mpsc::WeakUnboundedSender<Request>,
) -> Sent {
    tracing::debug!(error = %error, operations = batch.len(), "call redirected; sending again");
    send_again_later(batch, requeue);
    Sent {
        error: None,
        unsettled: settle,
        retries: Vec::new(),
        stale: connection::is_read_only(&error),
        misrouted: true,
        scripts_lost: false,
    }
}

/// Queues `requests` again after [`REDIRECT_PAUSE`] (by then the slot map
/// is refreshed, or the migration or failover further along); one sent
/// again [`MAX_REDIRECTS`] times already gets the error instead.
pub(super) fn send_again_later(
    requests: Vec<Request>,
    requeue: mpsc::WeakUnboundedSender<Request>,
) {
    let mut again = Vec::new();
    for mut request in requests {
        if request.redirects >= MAX_REDIRECTS {
            let error = RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
                "no master took the operation in time (a slot migration or failover outlasted the retries)",
            ));
            (request.done)(Err(Error::Redis(error)));
        } else {
            request.redirects += 1;
            again.push(request);
        }
    }
    if again.is_empty() {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(REDIRECT_PAUSE).await;
        for request in again {
            match requeue.upgrade() {
                Some(queue) => {
                    if let Err(mpsc::error::SendError(request)) = queue.send(request) {
                        (request.done)(Err(closed()));
                    }
                }
                None => (request.done)(Err(closed())),
            }
        }
    });
}

/// An error after which a call may or may not have been applied.
fn outcome_unknown(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_errors_after_sending_leave_the_outcome_unknown() {
        let dropped = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(outcome_unknown(&dropped));
        let refused = RedisError::from((redis::ErrorKind::Client, "hasp client is shut down"));
        assert!(!outcome_unknown(&refused));
    }
}
