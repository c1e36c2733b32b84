//! Direct hand-off of a released lock to the client's next local waiter.
//!
//! A task that waits for a lock leaves an [`Offer`] in the lock's channel
//! state: its owner and lease. When a task of the same client releases the
//! lock, the batcher takes the first live offer and sends the release as
//! "release and hand to this owner": the script frees the lock and takes it
//! again for the waiter in the same call, with a fresh fencing token. The
//! waiter gets the token through its [`PendingGrant`] one round trip sooner
//! than if it were woken to ask Redis itself, and no other client can slip
//! in between.
//!
//! The hand-off yields to other clients: when another client has flagged
//! itself as waiting since the lock was last free, the script frees the
//! lock and publishes instead, and this client's first waiter is woken only
//! after a grace period, so that the other client takes its turn (see
//! `batch.lua`). An offer that was not used goes back to the front of the
//! queue.
//!
//! A grant whose waiter went away (cancelled, timed out, acquired by its own
//! attempt meanwhile) is released again, on whichever side notices: the
//! batcher if the waiter is already gone, the waiter's [`PendingGrant`] on
//! drop if the grant arrived too late to be used.

use std::time::Instant;

use tokio::sync::oneshot;

use crate::batch::{HoldReply, Undo};
use crate::owner::Owner;

/// A lock handed to a waiter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    /// The fencing token of the new hold.
    pub(crate) token: u64,
    /// When the call that made the hold was sent: a fixed lease runs from
    /// no earlier than this.
    pub(crate) sent_at: Instant,
}

/// A waiting task's standing request for a hand-off.
#[derive(Debug)]
pub(crate) struct Offer {
    pub(crate) owner: Owner,
    pub(crate) lease_ms: u64,
    grant: oneshot::Sender<Grant>,
}

impl Offer {
    /// An offer and the waiter's side of it. `undo` releases a grant the
    /// waiter received but did not use.
    pub(crate) fn new(owner: Owner, lease_ms: u64, undo: Undo) -> (Self, PendingGrant) {
        let (grant, rx) = oneshot::channel();
        let offer = Self {
            owner,
            lease_ms,
            grant,
        };
        let pending = HoldReply::new(Some(rx), undo, |_| true);
        (offer, pending)
    }

    /// False once the waiter has stopped waiting.
    pub(crate) fn is_live(&self) -> bool {
        !self.grant.is_closed()
    }

    /// Hands the lock to the waiter. Gives the offer's owner back if the
    /// waiter has gone: the caller must then release the hold.
    pub(crate) fn grant(self, grant: Grant) -> Result<(), Owner> {
        let Self {
            owner, grant: tx, ..
        } = self;
        tx.send(grant).map_err(|_| owner)
    }
}

/// The waiter's side of an [`Offer`]: resolves to the grant, or to `None`
/// if the offer was dropped unused (the client is shutting down). Releases
/// a grant that arrives after the waiter stopped polling.
pub(crate) type PendingGrant = HoldReply<Grant>;
