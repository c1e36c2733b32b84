//! Lock 25–26: fencing tokens.

use std::time::Duration;

use crate::helpers::*;

#[tokio::test]
async fn tokens_only_grow_across_owners_clients_and_client_restarts() {
    let ctx = Ctx::new();
    let mut last = 0;
    for _ in 0..3 {
        // A new client each round: tokens do not depend on client state.
        let a = ctx.client().await.lock("fenced").unwrap();
        let b = ctx.client().await.lock("fenced").unwrap();
        for lock in [&a, &b, &a] {
            let g = lock.lock().await.unwrap();
            assert!(g.fencing_token() > last, "{} <= {last}", g.fencing_token());
            last = g.fencing_token();
            let again = lock.lock().await.unwrap();
            assert_eq!(again.fencing_token(), last, "a re-entry shares the token");
            again.unlock().await.unwrap();
            g.unlock().await.unwrap();
        }
    }
}

#[tokio::test]
async fn tokens_survive_expiry_and_deletion_of_the_lock() {
    let ctx = Ctx::new();
    let mut raw = ctx.raw().await;
    let lock = ctx
        .client()
        .await
        .lock("fence-expiry")
        .unwrap()
        .with_lease(Duration::from_millis(100))
        .unwrap();
    let first = lock.lock().await.unwrap();
    let t1 = first.fencing_token();
    // Let the lease run out (time is the subject here), and the counter
    // with it; within it, the same task would re-enter and share t1.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(first.is_lost());
    let second = lock
        .with_watchdog()
        .lock_within(Duration::from_secs(3))
        .await
        .unwrap();
    // (the first hold expired; the re-acquisition is a fresh hold)
    let t2 = second.fencing_token();
    assert!(t2 > t1);
    let _: i64 = query(&mut raw, &["DEL", &lock_key("fence-expiry")]).await;
    let other = ctx.client().await.lock("fence-expiry").unwrap();
    let third = other.lock().await.unwrap();
    assert!(third.fencing_token() > t2);
    let fence_ttl: i64 = query(
        &mut raw,
        &["PTTL", &format!("{}:fence", lock_key("fence-expiry"))],
    )
    .await;
    assert!(
        fence_ttl == -2 || (0..=100).contains(&fence_ttl),
        "the counter lives 100 ms from its seeding: {fence_ttl}"
    );
    // Without the counter, the hold keeps its token: a re-entry through
    // another client reads it from the lock's value.
    let _: i64 = query(
        &mut raw,
        &["DEL", &format!("{}:fence", lock_key("fence-expiry"))],
    )
    .await;
    let owner = other.owner();
    let again = ctx
        .client()
        .await
        .lock("fence-expiry")
        .unwrap()
        .with_owner(owner)
        .lock()
        .await
        .unwrap();
    assert_eq!(again.fencing_token(), third.fencing_token());
    again.unlock().await.unwrap();
    third.unlock().await.unwrap();
    drop((first, second));
}
