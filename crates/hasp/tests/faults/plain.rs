//! Lock 34 (`docs/guarantees.md`): a plain lock's operations sent as
//! native commands are settled after a lost reply as the function's are.

use std::time::Duration;

use testkit::{Direction, Mode};

use crate::helpers::*;
use crate::{bounded, through_proxy};

fn plain_key(name: &str) -> String {
    format!("{}:plain", lock_key(name))
}

/// The reply to a plain acquisition (one `SET … NX PX`) is lost after
/// Redis applied it: the caller gets an error or, retried on a new
/// connection, the lock; either way, once it lets go nothing is left.
#[tokio::test]
async fn a_plain_acquisition_whose_reply_was_lost_leaves_no_ghost() {
    bounded(Duration::from_secs(20), async {
        let ctx = Ctx::new();
        let (proxy, client) = through_proxy(&ctx, Duration::from_secs(30)).await;
        let mut raw = ctx.raw().await;
        let lock = client.plain_lock("ghost").unwrap();
        proxy.set(Direction::ToClient, Mode::BlackHole);
        let attempt = tokio::spawn({
            let lock = lock.clone();
            async move { lock.lock().await }
        });
        let applied = testkit::eventually(Duration::from_secs(5), || {
            let mut raw = raw.clone();
            async move { query::<i64>(&mut raw, &["EXISTS", &plain_key("ghost")]).await == 1 }
        })
        .await;
        assert!(applied, "the acquisition reached Redis");
        proxy.close_all();
        proxy.set(Direction::ToClient, Mode::Pass);
        let guard = attempt.await.unwrap().expect("retried on a new connection");
        let value: Option<String> = query(&mut raw, &["GET", &plain_key("ghost")]).await;
        assert!(
            value.is_some_and(|v| v.starts_with("1 ")),
            "one hold, not a re-entry of a hold nobody tracks"
        );
        guard.unlock().await.unwrap();
        let other = ctx.client().await.plain_lock("ghost").unwrap();
        let taken = other.try_lock().await.unwrap();
        assert!(taken.is_some(), "no ghost hold");
    })
    .await;
}

/// The reply to a plain lock's release is lost: the client completes it
/// once Redis answers again, and another client gets the lock within its
/// wait, not after the 30 s lease.
#[tokio::test]
async fn a_plain_release_whose_reply_was_lost_is_completed_by_the_client() {
    bounded(Duration::from_secs(20), async {
        let ctx = Ctx::new();
        let (proxy, client) = through_proxy(&ctx, Duration::from_secs(30)).await;
        let lock = client.plain_lock("released").unwrap();
        lock.lock().await.unwrap().unlock().await.unwrap();
        let guard = lock.lock().await.unwrap();
        proxy.set(Direction::ToServer, Mode::BlackHole);
        assert!(guard.unlock().await.is_err());
        proxy.set(Direction::ToServer, Mode::Pass);
        let other = ctx.client().await.plain_lock("released").unwrap();
        let taken = other.lock_within(Duration::from_secs(10)).await.unwrap();
        taken.unlock().await.unwrap();
    })
    .await;
}
