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

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::store::{RedisConn, ReplicaAck};

type Waiter = oneshot::Sender<Result<()>>;

/// Confirms that writes already applied on the primary reached replicas.
#[derive(Debug, Clone)]
pub(crate) struct Acker {
    asks: mpsc::UnboundedSender<Waiter>,
}

impl Acker {
    /// Starts the group-commit task on `conn` (a connection nothing else
    /// uses: `WAIT` blocks it), writing its marker to `marker`.
    ///
    /// # Errors
    /// [`Error::Invalid`] outside a tokio runtime.
    pub(crate) fn start(conn: RedisConn, marker: String, ack: ReplicaAck) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::invalid("replica_ack", "needs a tokio runtime"))?;
        let (asks, queue) = mpsc::unbounded_channel();
        runtime.spawn(commit_groups(conn, marker, ack, queue));
        Ok(Self { asks })
    }

    /// Waits until the replicas have every write this task's caller saw
    /// answered before calling.
    ///
    /// # Errors
    /// [`Error::NotReplicated`] if too few replicas confirmed in time;
    /// [`Error::Redis`] if the confirmation could not be asked.
    pub(crate) async fn confirm(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.asks
            .send(tx)
            .map_err(|_| Error::Protocol("the replica confirmation task ended".into()))?;
        rx.await
            .map_err(|_| Error::Protocol("the replica confirmation task ended".into()))?
    }
}

/// The task: one `INCR marker` + `WAIT` per group of waiting purchases.
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
        let acked: redis::RedisResult<(u32,)> = redis::pipe()
            .incr(&marker, 1)
            .ignore()
            .cmd("WAIT")
            .arg(ack.replicas)
            .arg(ack.timeout.as_millis() as u64)
            .query_async(&mut conn)
            .await;
        match &acked {
            Ok((n,)) if *n < ack.replicas => tracing::warn!(
                confirmed = n,
                wanted = ack.replicas,
                purchases = group.len(),
                "replicas did not confirm a group of purchases in time"
            ),
            Err(e) => {
                tracing::warn!(error = %e, purchases = group.len(), "replica confirmation failed")
            }
            _ => {}
        }
        for waiter in group.drain(..) {
            let outcome = match &acked {
                Ok((n,)) if *n >= ack.replicas => Ok(()),
                Ok((n,)) => Err(Error::NotReplicated {
                    acked: *n,
                    wanted: ack.replicas,
                }),
                Err(e) => Err(Error::Redis(e.clone())),
            };
            let _ = waiter.send(outcome); // the asker may have gone
        }
    }
}
