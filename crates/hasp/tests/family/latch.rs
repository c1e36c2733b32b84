//! The count-down latch: family 15–17, family detail 32–37.

use std::time::{Duration, Instant};

use hasp::Error;

use crate::helpers::{lock_key, query, Ctx};

fn latch_key(name: &str) -> String {
    format!("{}:latch", lock_key(name))
}

async fn exists(ctx: &Ctx, key: &str) -> bool {
    let mut raw = ctx.raw().await;
    query::<i64>(&mut raw, &["EXISTS", key]).await == 1
}

/// Family 15, family detail 32: counted down from any client, the latch wakes
/// every waiter of every client when it reaches zero.
#[tokio::test]
async fn every_waiter_of_every_client_wakes_at_zero() {
    let ctx = Ctx::new();
    let clients = [ctx.client().await, ctx.client().await, ctx.client().await];
    let latch = clients[0].latch("start").unwrap();
    assert!(latch.try_set_count(3).await.unwrap());
    let mut waiters = Vec::new();
    for i in 0..9 {
        let latch = clients[i % 3].latch("start").unwrap();
        waiters.push(tokio::spawn(async move {
            latch.wait().await.unwrap();
            Instant::now()
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, client) in clients.iter().enumerate() {
        let left = client.latch("start").unwrap().count_down().await.unwrap();
        assert_eq!(left, 2 - i as u64);
    }
    let zero = Instant::now();
    for waiter in waiters {
        let woke = tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("every waiter wakes")
            .unwrap();
        println!(
            "figure: woken {:?} after zero",
            woke.saturating_duration_since(zero)
        );
    }
    for client in &clients {
        assert_eq!(client.stats().subscribed_channels, 0);
    }
}

/// Family 15, family detail 32: a bounded wait returns false on time, and true
/// once the count reaches zero.
#[tokio::test]
async fn a_bounded_wait_returns_false_on_time_and_true_at_zero() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let latch = client.latch("bounded").unwrap();
    latch.try_set_count(1).await.unwrap();
    let started = Instant::now();
    assert!(!latch.wait_for(Duration::from_millis(400)).await.unwrap());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_millis(900),
        "{waited:?}"
    );
    let timed_out = latch.wait_within(Duration::from_millis(50)).await;
    assert!(
        matches!(&timed_out, Err(hasp::Error::TimedOut { name, .. }) if name == "bounded"),
        "{timed_out:?}"
    );
    let waiter = tokio::spawn({
        let latch = latch.clone();
        async move { latch.wait_for(Duration::from_secs(10)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    latch.count_down().await.unwrap();
    assert!(waiter.await.unwrap());
}

/// Family 16, family detail 32, 34: counting down below zero does nothing;
/// re-arming a latch that still counts is refused; counting down a latch
/// that was never set is `NotSet` and creates no key.
#[tokio::test]
async fn below_zero_is_a_no_op_and_rearming_a_counting_latch_is_refused() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let never = client.latch("never").unwrap();
    assert!(matches!(
        never.count_down().await.unwrap_err(),
        Error::NotSet { .. }
    ));
    assert!(!exists(&ctx, &latch_key("never")).await, "no key created");

    let latch = client.latch("round").unwrap();
    assert!(latch.try_set_count(2).await.unwrap());
    assert!(!latch.try_set_count(5).await.unwrap(), "still counting");
    assert_eq!(latch.count().await.unwrap(), Some(2));
    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    assert_eq!(latch.count_down().await.unwrap(), 0, "no-op below zero");
    assert_eq!(latch.count().await.unwrap(), Some(0));
    assert!(latch.try_set_count(1).await.unwrap(), "a new round");
    assert_eq!(latch.count().await.unwrap(), Some(1));
}

/// Research 33: a completed latch is remembered (a late waiter returns at
/// once); a wait on a latch never set is `NotSet`, or waits for the setter
/// when asked to.
#[tokio::test]
async fn a_completed_latch_is_remembered_and_a_never_set_one_is_not_zero() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let latch = client.latch("tomb").unwrap();
    assert!(matches!(
        latch.wait().await.unwrap_err(),
        Error::NotSet { .. }
    ));

    let patient = tokio::spawn({
        let latch = client.latch("tomb").unwrap().wait_until_set();
        async move { latch.wait_for(Duration::from_secs(10)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!patient.is_finished(), "it waits for the setter");
    latch.try_set_count(1).await.unwrap();
    latch.count_down().await.unwrap();
    assert!(patient.await.unwrap());

    let started = Instant::now();
    latch.wait().await.unwrap();
    // Woken by the setter, not by its 10 s wait running out.
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut raw = ctx.raw().await;
    let ttl: i64 = query(&mut raw, &["PTTL", &latch_key("tomb")]).await;
    assert!(
        ttl > 3_500_000 && ttl <= 3_600_000,
        "a 1 h tombstone: {ttl}"
    );
}

/// Research 35: `count_down_once` counts each id at most once, so a retry
/// after a lost reply cannot count twice.
#[tokio::test]
async fn an_id_counts_down_at_most_once() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let latch = client.latch("ids").unwrap();
    latch.try_set_count(3).await.unwrap();
    assert_eq!(latch.count_down_once("a").await.unwrap(), 2);
    assert_eq!(latch.count_down_once("a").await.unwrap(), 2);
    assert_eq!(latch.count_down_once("b").await.unwrap(), 1);
    assert_eq!(latch.count_down_once("c").await.unwrap(), 0);
    assert!(!exists(&ctx, &format!("{}:ids", latch_key("ids"))).await);
    assert!(matches!(
        latch.count_down_once("").await.unwrap_err(),
        Error::InvalidArgument { .. }
    ));
}

/// Research 36: deleting a latch wakes its waiters with `Deleted`.
#[tokio::test]
async fn deleting_a_latch_wakes_its_waiters_with_deleted() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let latch = client.latch("gone").unwrap();
    latch.try_set_count(2).await.unwrap();
    let waiter = tokio::spawn({
        let latch = latch.clone();
        async move { latch.wait().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(latch.delete().await.unwrap());
    let result = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken by the deletion")
        .unwrap();
    assert!(matches!(result.unwrap_err(), Error::Deleted { .. }));
    assert!(!latch.delete().await.unwrap());
}

/// Family 17: a latch with an expiry that is never counted down leaves no
/// key behind, and its waiters and their subscriptions do not stay forever.
#[tokio::test]
async fn a_latch_never_counted_down_expires_with_its_waiters() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let latch = client.latch("abandoned").unwrap();
    assert!(latch
        .try_set_count_for(3, Duration::from_millis(500))
        .await
        .unwrap());
    latch.count_down_once("x").await.unwrap();
    let waiter = tokio::spawn({
        let latch = latch.clone();
        async move { latch.wait().await }
    });
    let result = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the wait ends when the latch expires")
        .unwrap();
    assert!(matches!(result.unwrap_err(), Error::Deleted { .. }));
    assert!(!exists(&ctx, &latch_key("abandoned")).await);
    assert!(!exists(&ctx, &format!("{}:ids", latch_key("abandoned"))).await);
    assert_eq!(client.stats().subscribed_channels, 0);
}

/// Research 37: a count that reaches zero while waiters are subscribing
/// never leaves one asleep (they subscribe, then read).
#[tokio::test]
async fn a_completion_racing_the_subscription_wakes_every_waiter() {
    let ctx = Ctx::new();
    let (a, b) = (ctx.client().await, ctx.client().await);
    for round in 0..30 {
        let name = format!("race-{round}");
        let latch = a.latch(&name).unwrap();
        latch.try_set_count(1).await.unwrap();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let latch = b.latch(&name).unwrap();
                tokio::spawn(async move { latch.wait_for(Duration::from_secs(5)).await })
            })
            .collect();
        // Count down while the waiters are still getting ready.
        tokio::time::sleep(Duration::from_micros(200 * round)).await;
        latch.count_down().await.unwrap();
        let zero = Instant::now();
        for waiter in waiters {
            assert!(waiter.await.unwrap().unwrap(), "round {round}");
        }
        // Well inside the 2 s re-read: woken by the message, or saw zero.
        let late = zero.elapsed();
        assert!(
            late < Duration::from_millis(1500),
            "round {round}: {late:?}"
        );
    }
}
