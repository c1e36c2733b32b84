//! Lock 21–24: waiting for a held lock.

use std::time::{Duration, Instant};

use crate::helpers::*;

/// Holder releases a watchdog-mode lock (30 s lease): a waiter that only
/// polled or waited for the TTL would take seconds; one woken by the release
/// takes about a round trip.
async fn hand_off_time(holder: hasp::Lock, waiter: hasp::Lock) -> Duration {
    let guard = holder.lock().await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let waiting = tokio::spawn(async move {
        let g = waiter.lock().await.unwrap();
        let acquired = Instant::now();
        g.unlock().await.unwrap();
        let _ = tx.send(());
        acquired
    });
    tokio::time::sleep(Duration::from_millis(200)).await; // let it subscribe and wait
    guard.unlock().await.unwrap();
    let released = Instant::now();
    let acquired = waiting.await.unwrap();
    rx.await.unwrap();
    acquired.saturating_duration_since(released)
}

#[tokio::test]
async fn a_waiter_in_another_client_is_woken_by_the_release() {
    let ctx = Ctx::new();
    let holder = ctx.client().await.lock("handoff").unwrap();
    let waiter = ctx.client().await.lock("handoff").unwrap();
    for _ in 0..5 {
        let t = hand_off_time(holder.clone(), waiter.clone()).await;
        // Woken by the release, not by the lease (30 s) running out.
        assert!(t < Duration::from_secs(3), "hand-off took {t:?}");
    }
}

#[tokio::test]
async fn a_waiter_in_the_same_client_is_woken_by_the_release() {
    let ctx = Ctx::new();
    let lock = ctx.client().await.lock("handoff-local").unwrap();
    for _ in 0..5 {
        let t = hand_off_time(lock.clone(), lock.clone()).await;
        // Woken by the release, not by the lease (30 s) running out.
        assert!(t < Duration::from_secs(3), "hand-off took {t:?}");
    }
}

#[tokio::test]
async fn waiters_of_one_client_share_one_subscription_and_leave_none_behind() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let mut raw = ctx.raw().await;
    let holder = ctx.client().await.lock("shared-sub").unwrap();
    let guard = holder.lock().await.unwrap();
    let lock = client.lock("shared-sub").unwrap();
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let lock = lock.clone();
            tokio::spawn(async move {
                let g = lock.lock().await.unwrap();
                g.unlock().await.unwrap();
            })
        })
        .collect();
    let subscribed = testkit::eventually(Duration::from_secs(3), || {
        let mut raw = raw.clone();
        async move { subscribers(&mut raw, &channel("shared-sub")).await == 1 }
    })
    .await;
    assert!(subscribed, "expected exactly one subscription");
    assert_eq!(client.stats().subscribed_channels, 1);
    guard.unlock().await.unwrap();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .expect("every waiter served")
            .unwrap();
    }
    assert_eq!(client.stats().subscribed_channels, 0);
    let gone = testkit::eventually(Duration::from_secs(3), || {
        let mut raw = raw.clone();
        async move { subscribers(&mut raw, &channel("shared-sub")).await == 0 }
    })
    .await;
    assert!(gone, "a channel stayed subscribed");
    let all = channels(&mut raw).await;
    assert!(all.is_empty(), "{all:?}");
}

#[tokio::test]
async fn a_waiter_that_gets_no_message_acquires_when_the_lease_runs_out() {
    // A lease that runs out publishes nothing: the waiter must rely on the
    // TTL it was told when it failed.
    let ctx = Ctx::new();
    let lease = Duration::from_millis(800);
    let holder = ctx
        .client()
        .await
        .lock("silent")
        .unwrap()
        .with_lease(lease)
        .unwrap();
    let waiter = ctx.client().await.lock("silent").unwrap();
    let guard = holder.lock().await.unwrap();
    let started = Instant::now();
    let g = waiter
        .lock_within(Duration::from_secs(5))
        .await
        .expect("acquired after the lease");
    let waited = started.elapsed();
    assert!(waited >= lease - Duration::from_millis(100), "{waited:?}");
    assert!(waited < lease + Duration::from_secs(2), "{waited:?}");
    g.unlock().await.unwrap();
    drop(guard);
}

#[tokio::test]
async fn tasks_across_clients_increment_a_shared_counter_exactly() {
    const CLIENTS: usize = 3;
    const TASKS: usize = 6;
    const ROUNDS: usize = 40;
    let ctx = Ctx::new();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = ctx.client().await;
        for _ in 0..TASKS {
            let lock = client.lock("counter").unwrap();
            let mut raw = ctx.raw().await;
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let g = lock.lock().await.unwrap();
                    let n: Option<i64> = redis::cmd("GET")
                        .arg("counter-value")
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                    tokio::task::yield_now().await; // widen the race window
                    let _: () = redis::cmd("SET")
                        .arg("counter-value")
                        .arg(n.unwrap_or(0) + 1)
                        .query_async(&mut raw)
                        .await
                        .unwrap();
                    g.unlock().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("no task starves")
            .unwrap();
    }
    let mut raw = ctx.raw().await;
    let n: i64 = query(&mut raw, &["GET", "counter-value"]).await;
    assert_eq!(n, (CLIENTS * TASKS * ROUNDS) as i64);
}

#[tokio::test]
async fn a_task_queued_behind_a_waiter_that_gives_up_still_gets_a_silently_expiring_lock() {
    // The newcomer queues behind a local waiter without asking Redis; the
    // waiter ahead leaves, and the lock then expires without any message.
    let ctx = Ctx::new();
    let holder = ctx
        .client()
        .await
        .lock("expiring")
        .unwrap()
        .with_lease(Duration::from_millis(1500))
        .unwrap();
    let local = ctx.client().await.lock("expiring").unwrap();
    let held = holder.lock().await.unwrap();
    let impatient = {
        let local = local.clone();
        tokio::spawn(async move { local.try_lock_for(Duration::from_millis(300)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await; // let it queue first
    let started = Instant::now();
    let guard = local
        .lock_within(Duration::from_secs(5))
        .await
        .expect("acquired once the lease ran out, not after the 30 s watchdog timeout");
    assert!(impatient.await.unwrap().unwrap().is_none());
    assert!(
        started.elapsed() < Duration::from_millis(2600),
        "{:?}",
        started.elapsed()
    );
    guard.unlock().await.unwrap();
    drop(held);
}

/// The waiting flag of a lock (a client id, or `*` for several; `None`
/// while no client waits, or the lock is free).
async fn waiting_flag(raw: &mut Raw, name: &str) -> Option<String> {
    hold_in_redis(raw, name)
        .await
        .map(|hold| hold.flag)
        .filter(|flag| flag != "-")
}

#[tokio::test]
async fn a_release_hands_the_lock_to_a_waiter_of_its_client_in_the_same_call() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.lock("direct").unwrap();
    let mut raw = ctx.raw().await;
    let held = lock.lock().await.unwrap();
    let first_token = held.fencing_token();
    let asked_before = ctx.batch_calls().await;
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap() })
    };
    // The waiter asks once, subscribes, asks again, then waits: two calls.
    assert!(
        testkit::eventually(Duration::from_secs(5), || {
            let ctx = &ctx;
            async move { ctx.batch_calls().await - asked_before >= 2 }
        })
        .await
    );
    assert!(waiting_flag(&mut raw, "direct").await.is_some());
    let before = ctx.batch_calls().await;
    held.unlock().await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("handed over at once, not after the 30 s lease")
        .unwrap();
    assert_eq!(
        ctx.batch_calls().await - before,
        1,
        "the release call also acquired for the waiter"
    );
    assert!(handed.fencing_token() > first_token, "a fresh token");
    let hold = hold_in_redis(&mut raw, "direct").await.unwrap();
    assert_eq!((hold.count, hold.owner.as_str()), (1, handed.owner().id()));
    assert!(lock.is_locked().await.unwrap());
    handed.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn hand_offs_within_a_client_yield_to_a_waiter_of_another_client() {
    // Four tasks of one client take turns on a lock, 30 times each; a task
    // of another client takes it 10 times meanwhile. Handing the lock from
    // task to task inside the first client would starve it until all 120
    // turns are done; yielding, the clients take turns.
    const TASKS: usize = 4;
    const TURNS: usize = 30;
    const OUTSIDER_TURNS: usize = 10;
    let ctx = Ctx::new();
    let busy = ctx.client().await;
    let turns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut raw = ctx.raw().await;
    let first = busy.lock("fair").unwrap().lock().await.unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let lock = busy.lock("fair").unwrap();
            let turns = turns.clone();
            tokio::spawn(async move {
                for _ in 0..TURNS {
                    let g = lock.lock().await.unwrap();
                    turns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    g.unlock().await.unwrap();
                }
            })
        })
        .collect();
    // Let the busy client's tasks queue first (its first waiter flags the
    // lock), then the other client's task comes.
    assert!(
        testkit::eventually(Duration::from_secs(5), || {
            let mut raw = raw.clone();
            async move { waiting_flag(&mut raw, "fair").await.is_some() }
        })
        .await
    );
    let other = ctx.client().await.lock("fair").unwrap();
    let outsider = tokio::spawn(async move {
        for _ in 0..OUTSIDER_TURNS {
            let g = other.lock().await.unwrap();
            g.unlock().await.unwrap();
        }
    });
    assert!(
        testkit::eventually(Duration::from_secs(5), || {
            let mut raw = raw.clone();
            async move { waiting_flag(&mut raw, "fair").await.as_deref() == Some("*") }
        })
        .await,
        "two clients wait"
    );
    first.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), outsider)
        .await
        .expect("the other client gets the lock, 10 times")
        .unwrap();
    let served_before = turns.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        served_before < TASKS * TURNS / 2,
        "the other client waited for {served_before} of {} turns",
        TASKS * TURNS
    );
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        turns.load(std::sync::atomic::Ordering::SeqCst),
        TASKS * TURNS
    );
    let left: i64 = query(&mut raw, &["EXISTS", &lock_key("fair")]).await;
    assert_eq!(left, 0, "free at the end");
}
