//! Waiting in a line kept in Redis (`line.lua`): the kinds that serve
//! waiters of every client in order of arrival (fair lock, read-write lock,
//! semaphore) queue
//! each waiting task there under an id of its own, and are woken by name.
//!
//! A task's first try already takes its place; from then on whatever ends
//! the wait without the grant (time, an error, cancellation) leaves the
//! line. A waiting task asks again every third of the waiter TTL (which
//! refreshes its place) and when its try's hint says, so a dead waiter's
//! place ends within one waiter TTL and the ones behind move up.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use super::batcher::Queue;
use super::holds::{Claim, HoldState};
use super::keys::LockKeys;
use super::waiters::{ran_out, remaining, unconfirmed_as_busy, within_wait, Attempt};
use super::wire::hold::{Acquire, Acquisition, Place, Step};
use super::wire::Op;
use super::Core;
use crate::config::lease_millis;
use crate::error::Result;

impl Core {
    /// A new place in a line for a waiter: its id and its member,
    /// `<tag>|<id>` (the tag is what the kind's script reads of the waiter:
    /// a semaphore's the permits it wants).
    pub(crate) fn new_place(&self, tag: impl std::fmt::Display) -> (Arc<str>, Place) {
        let id: Arc<str> = format!("{}/{}", self.id, self.queue.nonce()).into();
        let place = Place {
            member: format!("{tag}|{id}").into(),
            ttl_ms: lease_millis(self.settings.waiter_ttl).unwrap_or(u64::MAX),
        };
        (id, place)
    }

    /// Takes one hold of a queued lock (`how`: its kind's acquisition) for
    /// the claim's owner: without `wait`, one try that never queues; with
    /// it, a place in the line under `tag` until taken or `deadline` passes
    /// (`Ok(None)`).
    pub(super) async fn acquire_in_line<A: Acquisition>(
        &self,
        claim: Claim<'_>,
        deadline: Option<Instant>,
        wait: bool,
        how: A,
        tag: char,
    ) -> Result<Option<Arc<HoldState>>> {
        let attempt = |place: Option<Place>| {
            let lease_ms = self.lease_ms(claim.lease);
            let acquire = Acquire {
                owner: claim.owner.clone(),
                count: 1,
                lease_ms,
                nonce: self.queue.nonce(),
                place,
            };
            let op = Op::hold(claim.keys, Step::Acquire(acquire, how.clone()));
            self.take_hold(claim, lease_ms, op)
        };
        if !wait {
            return match attempt(None).await? {
                Attempt::Done(hold) => Ok(Some(hold)),
                Attempt::Busy(_) => Ok(None),
            };
        }
        let (id, place) = self.new_place(tag);
        let leave = Op::hold::<A>(
            claim.keys,
            Step::Leave {
                member: place.member.clone(),
            },
        );
        let again = || attempt(Some(place.clone()));
        self.wait_in_line(claim.keys, id, leave, deadline, again)
            .await
    }

    /// Waits in the line of `keys`' object as waiter `id`: runs `attempt`
    /// (which takes or refreshes the place) at once, then whenever woken by
    /// name, a reconnect, or the hint, until it succeeds or `deadline`
    /// passes (`Ok(None)`). `leave` is sent unless it succeeded.
    pub(crate) async fn wait_in_line<T, F, Fut>(
        &self,
        keys: &Arc<LockKeys>,
        id: Arc<str>,
        leave: Op,
        deadline: Option<Instant>,
        mut attempt: F,
    ) -> Result<Option<T>>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Attempt<T>>>,
    {
        let mut leave = LeaveOnDrop {
            queue: &self.queue,
            op: Some(leave),
        };
        // Ask again before the place can end, and when the hint says.
        let refresh = self.settings.waiter_ttl / 3;
        let busy_for = move |ttl: Option<Duration>| Some(ttl.unwrap_or(refresh).min(refresh));
        let mut unconfirmed = None;
        let first = within_wait(deadline, attempt()).await;
        let ttl = match unconfirmed_as_busy(first, deadline, &mut unconfirmed)? {
            Attempt::Done(done) => {
                leave.op = None;
                return Ok(Some(done));
            }
            Attempt::Busy(ttl) => busy_for(ttl),
        };
        if remaining(deadline).is_zero() {
            return ran_out(unconfirmed);
        }
        let waiter = self.waiters.join_place(keys, id);
        let confirm = remaining(deadline)
            .min(self.settings.response_timeout)
            .min(refresh);
        waiter.ready(confirm).await;
        let again = || {
            let next = attempt();
            async move {
                Ok(match next.await? {
                    Attempt::Busy(ttl) => Attempt::Busy(busy_for(ttl)),
                    done => done,
                })
            }
        };
        // No hand-off grants anything to a waiter in line (it has no
        // offer): it takes what it waits for itself.
        let done = waiter
            .wait_for(deadline, ttl, false, again, |_| None)
            .await?;
        if done.is_some() {
            leave.op = None;
        }
        Ok(done)
    }
}

/// Sends its operation (leaving a line) when dropped, unless disarmed.
struct LeaveOnDrop<'a> {
    queue: &'a Queue,
    op: Option<Op>,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(op) = self.op.take() {
            self.queue.detach(op);
        }
    }
}
