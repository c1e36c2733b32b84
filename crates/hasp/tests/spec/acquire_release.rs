//! Lock 1–14: acquire and release.

use std::time::{Duration, Instant};

use hasp::{Error, Owner, Settings};

use crate::helpers::*;

#[tokio::test]
async fn one_owner_locks_and_unlocks_many_times() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.lock("repeat").unwrap();
    for _ in 0..200 {
        let guard = lock.lock().await.unwrap();
        guard.unlock().await.unwrap();
    }
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn same_owner_reenters_and_others_wait_for_every_release() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let other = ctx.client().await.lock("reentrant").unwrap();
    let lock = client.lock("reentrant").unwrap();

    assert_eq!(lock.hold_count(), 0);
    let outer = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count(), 1);
    let inner = tokio::time::timeout(Duration::from_secs(1), lock.lock())
        .await
        .expect("re-entry must not block")
        .unwrap();
    assert_eq!(lock.hold_count(), 2);

    assert!(other.try_lock().await.unwrap().is_none());
    inner.unlock().await.unwrap();
    assert_eq!(lock.hold_count(), 1);
    assert!(
        other.try_lock().await.unwrap().is_none(),
        "one hold remains"
    );
    outer.unlock().await.unwrap();
    assert_eq!(lock.hold_count(), 0);
    let theirs = other
        .try_lock()
        .await
        .unwrap()
        .expect("free after both releases");
    theirs.unlock().await.unwrap();
}

#[tokio::test]
async fn another_task_of_the_same_client_is_another_owner() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.lock("per-task").unwrap();
    let guard = lock.lock().await.unwrap();
    let in_other_task = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock().await.unwrap().is_some() })
            .await
            .unwrap()
    };
    assert!(!in_other_task);
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn an_explicit_owner_reenters_from_another_task_and_a_guard_moves_between_tasks() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let owner = Owner::new();
    let lock = client.lock("handed").unwrap().with_owner(owner.clone());
    let guard = lock.lock().await.unwrap();
    let token = guard.fencing_token();
    let lock2 = lock.clone();
    let (inner_token, count) = tokio::spawn(async move {
        let inner = lock2
            .try_lock()
            .await
            .unwrap()
            .expect("same explicit owner re-enters");
        let t = inner.fencing_token();
        let c = lock2.hold_count();
        inner.unlock().await.unwrap();
        (t, c)
    })
    .await
    .unwrap();
    assert_eq!((inner_token, count), (token, 2));
    // The guard carries its owner: released from yet another task.
    tokio::spawn(async move { guard.unlock().await })
        .await
        .unwrap()
        .unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

/// Lock 2 and 3 (reentrancy): two tasks of one explicit owner that lock at
/// the same moment both reach Redis, which counts two holds; the last
/// guard's release gives both back in one operation (the wire's `R`), and
/// the lock is free.
#[tokio::test]
async fn a_same_owner_race_counts_two_holds_in_redis_and_the_last_release_frees_both() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let mut raw = ctx.raw().await;
    let lock = client.lock("raced").unwrap().with_owner(Owner::new());
    // Polled together: neither finds the other's hold locally before
    // Redis answers, so both acquisitions go to Redis.
    let (first, second) = tokio::join!(lock.lock(), lock.lock());
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(lock.hold_count(), 2);
    let hold = hold_in_redis(&mut raw, "raced").await.expect("held");
    assert_eq!(hold.count, 2, "both acquisitions reached Redis");
    first.unlock().await.unwrap();
    assert_eq!(
        hold_in_redis(&mut raw, "raced").await.map(|h| h.count),
        Some(2),
        "the first release stays local"
    );
    second.unlock().await.unwrap();
    assert!(hold_in_redis(&mut raw, "raced").await.is_none());
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn is_locked_is_seen_by_every_observer_and_held_by_me_only_by_the_owner() {
    let ctx = Ctx::new();
    let a = ctx.client().await.lock("observed").unwrap();
    let b = ctx.client().await.lock("observed").unwrap();
    assert!(!a.is_locked().await.unwrap());
    let guard = a.lock().await.unwrap();
    assert!(a.is_locked().await.unwrap());
    assert!(b.is_locked().await.unwrap());
    assert!(a.is_held_by_me().await.unwrap());
    assert!(!b.is_held_by_me().await.unwrap());
    guard.unlock().await.unwrap();
    assert!(!a.is_locked().await.unwrap());
    assert!(!b.is_locked().await.unwrap());
    assert!(!a.is_held_by_me().await.unwrap());
}

#[tokio::test]
async fn a_stale_holder_release_is_not_held_and_leaves_the_real_owner_alone() {
    // A guard is the only way to release, so a "non-owner" release is a
    // guard whose hold was taken away (force-unlock) and re-acquired.
    let ctx = Ctx::new();
    let a = ctx.client().await.lock("stolen").unwrap();
    let b = ctx.client().await.lock("stolen").unwrap();
    let stale = a.lock().await.unwrap();
    assert!(b.force_unlock().await.unwrap());
    let real = b
        .try_lock()
        .await
        .unwrap()
        .expect("free after force unlock");
    let err = stale.unlock().await.unwrap_err();
    assert_not_held(err);
    assert!(b.is_held_by_me().await.unwrap());
    real.unlock().await.unwrap();
}

#[tokio::test]
async fn an_explicit_lease_expires_and_the_late_release_does_not_disturb_the_next_owner() {
    let ctx = Ctx::new();
    let lease = Duration::from_millis(600);
    let a = ctx
        .client()
        .await
        .lock("leased")
        .unwrap()
        .with_lease(lease)
        .unwrap();
    let b = ctx.client().await.lock("leased").unwrap();
    let started = Instant::now();
    let old = a.lock().await.unwrap();
    let new = b
        .try_lock_for(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the lease frees the lock");
    let waited = started.elapsed();
    assert!(waited >= lease - Duration::from_millis(50), "{waited:?}");
    assert!(waited < lease + Duration::from_millis(1500), "{waited:?}");
    assert!(old.is_lost());
    assert_not_held(old.unlock().await.unwrap_err());
    assert!(b.is_held_by_me().await.unwrap());
    new.unlock().await.unwrap();
}

#[tokio::test]
async fn remaining_ttl_follows_the_lease_and_reports_no_lock_after_release() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lease = Duration::from_secs(5);
    let lock = client.lock("ttl").unwrap().with_lease(lease).unwrap();
    let guard = lock.lock().await.unwrap();
    let ttl = lock.remaining_ttl().await.unwrap().unwrap();
    assert!(
        ttl <= lease && ttl > lease - Duration::from_secs(1),
        "{ttl:?}"
    );
    guard.unlock().await.unwrap();
    assert_eq!(lock.remaining_ttl().await.unwrap(), None);

    // Watchdog mode: the TTL stays near the watchdog timeout while held.
    let wd = Duration::from_millis(900);
    let client = ctx.fast_watchdog_client(wd).await;
    let lock = client.lock("ttl-watchdog").unwrap();
    let guard = lock.lock().await.unwrap();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let ttl = lock.remaining_ttl().await.unwrap().expect("still held");
        // Renewed every 300 ms, so never below ~wd - period (minus slack).
        assert!(ttl > Duration::from_millis(350), "{ttl:?}");
        assert!(ttl <= wd);
    }
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_reentry_rearms_an_explicit_lease() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lease = Duration::from_secs(3);
    let lock = client.lock("rearm").unwrap().with_lease(lease).unwrap();
    let g1 = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    let g2 = lock.lock().await.unwrap();
    let g3 = lock.lock().await.unwrap();
    g3.unlock().await.unwrap();
    g2.unlock().await.unwrap();
    let ttl = lock.remaining_ttl().await.unwrap().unwrap();
    // Without the re-arm it would be ~2.1 s.
    assert!(ttl > Duration::from_millis(2600), "{ttl:?}");
    g1.unlock().await.unwrap();
}

#[tokio::test]
async fn a_bounded_wait_on_a_held_lock_gives_up_on_time() {
    let ctx = Ctx::new();
    let holder = ctx.client().await.lock("busy").unwrap();
    let waiter = ctx.client().await.lock("busy").unwrap();
    let guard = holder.lock().await.unwrap();
    let wait = Duration::from_millis(1500);
    let started = Instant::now();
    assert!(waiter.try_lock_for(wait).await.unwrap().is_none());
    let took = started.elapsed();
    assert!(took >= wait, "gave up early: {took:?}");
    assert!(
        took < wait + Duration::from_millis(500),
        "gave up late: {took:?}"
    );
    let err = waiter
        .lock_within(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TimedOut { .. }), "{err:?}");
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn try_lock_succeeds_at_once_when_free_and_fails_at_once_when_held() {
    let ctx = Ctx::new();
    let a = ctx.client().await.lock("try").unwrap();
    let b = ctx.client().await.lock("try").unwrap();
    let started = Instant::now();
    let guard = a.try_lock().await.unwrap().expect("free");
    assert!(b.try_lock().await.unwrap().is_none());
    assert!(b.try_lock_for(Duration::ZERO).await.unwrap().is_none());
    // At once: not after the holder's lease (30 s).
    assert!(started.elapsed() < Duration::from_secs(5));
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn force_unlock_frees_the_lock_and_wakes_waiters() {
    let ctx = Ctx::new();
    let holder = ctx.client().await.lock("forced").unwrap();
    let local_waiter = holder.clone();
    let remote = ctx.client().await.lock("forced").unwrap();
    let guard = holder.lock().await.unwrap(); // watchdog lease: 30 s
    let waiting = tokio::spawn(async move {
        let g = remote.lock().await.unwrap();
        g.unlock().await.unwrap();
    });
    let waiting_locally = tokio::spawn(async move {
        let g = local_waiter.lock().await.unwrap();
        g.unlock().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // let both queue
    assert!(holder.force_unlock().await.unwrap());
    tokio::time::timeout(Duration::from_secs(3), async {
        waiting.await.unwrap();
        waiting_locally.await.unwrap();
    })
    .await
    .expect("waiters are woken by the force unlock, long before the 30 s lease");
    assert!(
        !holder.force_unlock().await.unwrap(),
        "nothing left to free"
    );
    assert_not_held(guard.unlock().await.unwrap_err());
}

#[tokio::test]
async fn a_dropped_guard_is_released_in_the_background() {
    let ctx = Ctx::new();
    let a = ctx.client().await.lock("dropped").unwrap();
    let b = ctx.client().await.lock("dropped").unwrap();
    let guard = a.lock().await.unwrap();
    drop(guard);
    let g = b
        .try_lock_for(Duration::from_secs(3))
        .await
        .unwrap()
        .expect("released by drop, long before the 30 s lease");
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn cancelled_acquires_leave_no_lock_no_renewal_and_no_subscription() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let raw = ctx.raw().await;

    // (a) Cancelled while waiting on a held lock.
    let holder = ctx.client().await.lock("cancel").unwrap();
    let guard = holder.lock().await.unwrap();
    let lock = client.lock("cancel").unwrap();
    for _ in 0..5 {
        assert!(
            tokio::time::timeout(Duration::from_millis(100), lock.lock())
                .await
                .is_err()
        );
    }
    assert_eq!(client.stats().subscribed_channels, 0);
    assert!(
        testkit::eventually(Duration::from_secs(3), || {
            let mut raw = raw.clone();
            async move { subscribers(&mut raw, &channel("cancel")).await == 0 }
        })
        .await,
        "the release channel stays subscribed"
    );
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());

    // (b) Cancelled at random points of an uncontended acquire, including
    // after the script was sent: whatever it took is given back.
    let free = client.lock("cancel-free").unwrap();
    for i in 0..300u64 {
        let budget = Duration::from_micros(i % 150);
        if let Ok(Ok(g)) = tokio::time::timeout(budget, free.lock()).await {
            g.unlock().await.unwrap();
        }
    }
    assert!(
        testkit::eventually(Duration::from_secs(3), || {
            let free = free.clone();
            async move { !free.is_locked().await.unwrap() }
        })
        .await,
        "a cancelled acquire left the lock held"
    );
    assert_eq!(client.stats().held_locks, 0, "no renewal left registered");
}

#[tokio::test]
async fn an_unreachable_redis_is_an_error_never_not_acquired() {
    let mut ctx = Ctx::new();
    let settings = Settings::default()
        .set_response_timeout(Duration::from_millis(500))
        .set_connection_timeout(Duration::from_millis(500));
    let client = ctx.client_with(settings).await;
    let lock = client.lock("down").unwrap();

    // Paused: connected, but nothing answers.
    let server = ctx.server_of("down");
    server.pause();
    let err = lock.try_lock().await.unwrap_err();
    assert!(
        matches!(err, Error::Redis(_)) && err.is_retryable(),
        "{err:?}"
    );
    server.resume();

    // Killed: nothing listens.
    server.kill();
    for attempt in [lock.try_lock().await.err(), lock.lock().await.err()] {
        let err = attempt.expect("must not acquire without Redis");
        assert!(matches!(err, Error::Redis(_)), "{err:?}");
    }
    assert!(matches!(
        lock.try_lock_for(Duration::from_secs(1)).await,
        Err(Error::Redis(_))
    ));

    // Back again: the same client recovers.
    server.restart();
    assert!(
        lockable_within(&lock, Duration::from_secs(5)).await,
        "client did not reconnect"
    );
}

#[tokio::test]
async fn a_reentry_keeps_the_lease_mode_of_the_first_acquisition() {
    let ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(Duration::from_millis(900)).await;
    let watchdog = client.lock("mode").unwrap();
    let fixed = watchdog
        .clone()
        .with_lease(Duration::from_millis(300))
        .unwrap();
    let outer = watchdog.lock().await.unwrap();
    let inner = fixed.lock().await.unwrap(); // same task: a re-entry
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        watchdog.is_held_by_me().await.unwrap(),
        "the watchdog still renews it"
    );
    assert!(!inner.is_lost());
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
}

#[tokio::test]
async fn two_clients_sharing_an_owner_hold_the_lock_until_both_release() {
    let ctx = Ctx::new();
    let owner = Owner::from_id("shared-worker").unwrap();
    let first = ctx.client().await.lock("shared-owner").unwrap();
    let second = ctx.client().await.lock("shared-owner").unwrap();
    let (first, second) = (first.with_owner(owner.clone()), second.with_owner(owner));
    let stranger = ctx.client().await.lock("shared-owner").unwrap();

    let a = first.lock().await.unwrap();
    // The same owner through another client: a re-entry in Redis (count 2).
    let b = tokio::time::timeout(Duration::from_secs(1), second.lock())
        .await
        .expect("the same owner does not wait")
        .unwrap();
    assert_eq!(a.fencing_token(), b.fencing_token());
    let mut raw = ctx.raw().await;
    let hold = hold_in_redis(&mut raw, "shared-owner").await.unwrap();
    assert_eq!((hold.count, hold.owner.as_str()), (2, "shared-worker"));

    a.unlock().await.unwrap();
    let hold = hold_in_redis(&mut raw, "shared-owner").await.unwrap();
    assert_eq!(hold.count, 1, "one hold given back, one left");
    assert!(stranger.try_lock().await.unwrap().is_none());
    b.unlock().await.unwrap();
    assert!(!stranger.is_locked().await.unwrap());
    stranger
        .try_lock()
        .await
        .unwrap()
        .expect("free")
        .unlock()
        .await
        .unwrap();
}

#[tokio::test]
async fn locking_survives_a_function_flush() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.lock("flushed-batch").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    let mut raw = ctx.raw().await;
    let _: String = query(&mut raw, &["FUNCTION", "FLUSH"]).await;
    let guard = lock.lock().await.unwrap();
    assert!(lock.is_held_by_me().await.unwrap());
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}
