//! Replica confirmation of accepted purchases, committed in groups.
//!
//! `WAIT n timeout` blocks the connection it is sent on until `n` replicas
//! acknowledged every write that connection made. Sent after each purchase
//! on the service's shared, multiplexed connection it would block every
//! other purchase behind it (the README's "Durability" has the figures).
//! So confirmation runs on a connection of its
//! own, for many purchases at once: a purchase whose script has answered
//! asks the [`Acker`]; the acker takes everything asked so far, writes one
//! marker (`INCR`) and sends `WAIT` in the same round trip. The master's
//! replication offset is one sequence, so a replica that acknowledged the
//! marker has every purchase applied before it, and each of those purchases
//! had answered before it was asked for. One `WAIT` confirms the group.
//!
//! That holds only on the server, and in the replication history, that
//! took the purchases. The acker's connection follows the master on its
//! own, so around a switch it can be on another server than the purchase
//! was: a purchase taken by a master the sentinels just left, confirmed by
//! a `WAIT` on the new master once the old one follows it, would be
//! answered `accepted` and then lost with the old master's data. So an
//! accepted purchase answers the history its server's sale state was
//! verified for (`store::verification`: a server sells only in the history
//! it was verified for), the acker reads its own server's history in the
//! same round trip as the `WAIT` (`INFO replication`), and only purchases
//! whose history is that one, on a master, are confirmed.

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::store::verification::{parse_history, History};
use crate::store::{RedisConn, ReplicaAck};

/// A purchase waiting for confirmation: the history its server answered,
/// and where to send the outcome.
struct Waiter {
    history: Option<String>,
    outcome: oneshot::Sender<Result<()>>,
}

/// Confirms that writes already applied on the primary reached replicas.
#[derive(Debug, Clone)]
pub(crate) struct Acker {
    asks: mpsc::UnboundedSender<Waiter>,
    history_key: String,
}

impl Acker {
    /// Starts the group-commit task on `conn` (a connection nothing else
    /// uses: `WAIT` blocks it), writing its marker to `marker`; purchases
    /// read the verified history from `history_key`.
    ///
    /// # Errors
    /// [`Error::Invalid`] outside a tokio runtime.
    pub(crate) fn start(
        conn: RedisConn,
        marker: String,
        history_key: String,
        ack: ReplicaAck,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::invalid("replica_ack", "needs a tokio runtime"))?;
        let (asks, queue) = mpsc::unbounded_channel();
        runtime.spawn(commit_groups(conn, marker, ack, queue));
        Ok(Self { asks, history_key })
    }

    /// The key under which a server records the history its sale state was
    /// verified for: the purchase script answers it with an accepted
    /// purchase.
    pub(crate) fn history_key(&self) -> &str {
        &self.history_key
    }

    /// Waits until the replicas have every write this task's caller saw
    /// answered before calling, made on a master in replication history
    /// `history` (what the purchase answered).
    ///
    /// # Errors
    /// [`Error::NotReplicated`] if too few replicas confirmed in time, or
    /// the confirmation came from another server or history than
    /// `history` (none recorded: never confirmed); [`Error::Redis`] if the
    /// confirmation could not be asked.
    pub(crate) async fn confirm(&self, history: Option<String>) -> Result<()> {
        let (outcome, rx) = oneshot::channel();
        self.asks
            .send(Waiter { history, outcome })
            .map_err(|_| Error::Protocol("the replica confirmation task ended".into()))?;
        rx.await
            .map_err(|_| Error::Protocol("the replica confirmation task ended".into()))?
    }
}

/// What one group's round trip found: how many replicas confirmed, on a
/// server with which history.
type Confirmation = redis::RedisResult<(u32, History)>;

/// The task: one `INCR marker` + `WAIT` + `INFO replication` per group of
/// waiting purchases.
async fn commit_groups(
    mut conn: RedisConn,
    marker: String,
    ack: ReplicaAck,
    mut queue: mpsc::UnboundedReceiver<Waiter>,
) {
    let mut group = Vec::new();
    while let Some(first) = queue.recv().await {
        group.push(first);
        while let Ok(next) = queue.try_recv() {
            group.push(next);
        }
        let confirmation: Confirmation = redis::pipe()
            .incr(&marker, 1)
            .ignore()
            .cmd("WAIT")
            .arg(ack.replicas)
            .arg(ack.timeout.as_millis() as u64)
            .cmd("INFO")
            .arg("replication")
            .query_async::<(u32, String)>(&mut conn)
            .await
            .and_then(|(n, info)| Ok((n, parse_history(&info)?)));
        report(&confirmation, &group, ack);
        for waiter in group.drain(..) {
            let outcome = outcome(&confirmation, waiter.history.as_deref(), ack);
            let _ = waiter.outcome.send(outcome); // the asker may have gone
        }
    }
}

/// A purchase's outcome from its group's confirmation.
fn outcome(confirmation: &Confirmation, history: Option<&str>, ack: ReplicaAck) -> Result<()> {
    match confirmation {
        Err(e) => Err(Error::Redis(e.clone())),
        // Replicas of another server, or of another history of this one,
        // say nothing of this purchase.
        Ok((_, server)) if !server.master || history != Some(server.id.as_str()) => {
            Err(Error::NotReplicated {
                acked: 0,
                wanted: ack.replicas,
            })
        }
        Ok((n, _)) if *n >= ack.replicas => Ok(()),
        Ok((n, _)) => Err(Error::NotReplicated {
            acked: *n,
            wanted: ack.replicas,
        }),
    }
}

/// Logs a group that was not confirmed.
fn report(confirmation: &Confirmation, group: &[Waiter], ack: ReplicaAck) {
    match confirmation {
        Err(e) => {
            tracing::warn!(error = %e, purchases = group.len(), "replica confirmation failed")
        }
        Ok((n, server)) => {
            let elsewhere = group
                .iter()
                .filter(|w| !server.master || w.history.as_deref() != Some(server.id.as_str()))
                .count();
            if elsewhere > 0 {
                tracing::warn!(
                    purchases = elsewhere,
                    history = %server.id,
                    master = server.master,
                    "purchases taken by another Redis server or history than the one confirming: not confirmed"
                );
            }
            if *n < ack.replicas && elsewhere < group.len() {
                tracing::warn!(
                    confirmed = n,
                    wanted = ack.replicas,
                    purchases = group.len() - elsewhere,
                    "replicas did not confirm a group of purchases in time"
                );
            }
        }
    }
}
