//! The fair lock: family 1–4, family detail 3–13.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hasp::Settings;

use crate::child::ChildProcess;
use crate::helpers::{lock_key, query, Ctx};

fn fair_key(name: &str) -> String {
    format!("{}:fair", lock_key(name))
}

async fn line_len(ctx: &Ctx, name: &str) -> i64 {
    let mut raw = ctx.raw().await;
    query(&mut raw, &["ZCARD", &format!("{}:queue", fair_key(name))]).await
}

/// The server's clock in milliseconds (`TIME`).
async fn server_ms(raw: &mut crate::helpers::Raw) -> i64 {
    let time: Vec<String> = query(raw, &["TIME"]).await;
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

async fn wait_for_line(ctx: &Ctx, name: &str, len: i64) {
    let reached = testkit::eventually(Duration::from_secs(5), || async {
        line_len(ctx, name).await == len
    })
    .await;
    assert!(reached, "the line of {name} never reached {len}");
}

/// Family 1, family detail 3: waiters of three clients (ten tasks each) acquire
/// in exactly the order they started waiting; nobody is overtaken.
#[tokio::test]
async fn waiters_across_clients_acquire_in_order_of_arrival() {
    let ctx = Ctx::new();
    let clients = [ctx.client().await, ctx.client().await, ctx.client().await];
    let lock = clients[0].fair_lock("queue").unwrap();
    let blocker = lock.lock().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..30 {
        let lock = clients[i % 3].fair_lock("queue").unwrap();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            order.lock().unwrap().push(i);
            guard.unlock().await.unwrap();
        }));
        wait_for_line(&ctx, "queue", i as i64 + 1).await;
    }
    blocker.unlock().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("every waiter is served")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..30).collect::<Vec<_>>());
    // Research 8: with nobody waiting, no line is left.
    assert_eq!(line_len(&ctx, "queue").await, 0);
    let mut raw = ctx.raw().await;
    let keys: i64 = query(&mut raw, &["EXISTS", &format!("{}:due", fair_key("queue"))]).await;
    assert_eq!(keys, 0);
}

/// Research 4: 100 tasks over two clients, each holding 20 ms with a 5 s
/// lease, are all served (Redisson #2883 served about 100 of 500).
#[tokio::test]
async fn a_hundred_tasks_over_two_clients_are_all_served() {
    let ctx = Ctx::new();
    let clients = [ctx.client().await, ctx.client().await];
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let lock = clients[i % 2]
                .fair_lock("busy")
                .unwrap()
                .with_lease(Duration::from_secs(5))
                .unwrap();
            let served = served.clone();
            tokio::spawn(async move {
                let guard = lock.lock().await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
                guard.unlock().await.unwrap();
                served.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("served")
            .unwrap();
    }
    assert_eq!(served.load(std::sync::atomic::Ordering::Acquire), 100);
}

/// Family 2, 4 and 18, family detail 6: waiters whose processes are killed (three
/// of them, at the head of the line and between live waiters of two
/// clients) leave it within one waiter TTL by the server's clock; the live
/// waiters then acquire in the order they arrived, without a message.
#[tokio::test]
async fn killed_waiters_leave_the_line_and_the_live_keep_their_order() {
    let ctx = Ctx::new();
    let clients = [ctx.client().await, ctx.client().await];
    let lock = clients[0].fair_lock("heads").unwrap();
    let holder = lock.lock().await.unwrap();
    let mut children = Vec::new();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut live = Vec::new();
    let mut queued = 0;
    for i in 0..3 {
        let mut child = ChildProcess::spawn("wait-fair", &ctx.urls(), "heads");
        child.wait_for("WAITING", Duration::from_secs(20)).await;
        queued += 1;
        wait_for_line(&ctx, "heads", queued).await;
        children.push(child);
        let lock = clients[i % 2].fair_lock("heads").unwrap();
        let order = order.clone();
        live.push(tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            order.lock().unwrap().push(i);
            let at = Instant::now();
            guard.unlock().await.unwrap();
            at
        }));
        queued += 1;
        wait_for_line(&ctx, "heads", queued).await;
    }
    for child in &mut children {
        child.kill();
    }
    holder.unlock().await.unwrap();
    let released = Instant::now();
    let mut first = None;
    for task in live {
        let at = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("every live waiter acquires")
            .unwrap();
        first.get_or_insert(at);
    }
    // The children's places last 900 ms (their waiter TTL).
    let after = first.unwrap().saturating_duration_since(released);
    assert!(after <= Duration::from_millis(900 + 1500), "{after:?}");
    assert_eq!(
        *order.lock().unwrap(),
        [0, 1, 2],
        "live waiters kept their order"
    );
    assert_eq!(line_len(&ctx, "heads").await, 0);
}

/// Research 5 and 7: a live waiter that waits many waiter TTLs keeps its
/// place (its client refreshes it), and every place ends no later than
/// server time + waiter TTL.
#[tokio::test]
async fn a_live_waiter_keeps_its_place_and_places_stay_bounded() {
    let ctx = Ctx::new();
    let ttl = Duration::from_millis(300);
    let client = ctx
        .client_with(Settings::default().set_waiter_ttl(ttl))
        .await;
    let lock = client.fair_lock("patient").unwrap();
    let holder = lock.lock().await.unwrap();
    let first = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await.unwrap().unlock().await.unwrap() }
    });
    wait_for_line(&ctx, "patient", 1).await;
    let mut raw = ctx.raw().await;
    let due = format!("{}:due", fair_key("patient"));
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(200)).await; // 1.6 s: 5 TTLs
        let scores: Vec<(String, f64)> =
            query(&mut raw, &["ZRANGE", &due, "0", "-1", "WITHSCORES"]).await;
        // The clock is read after the places: a refresh between the two
        // reads (milliseconds apart on a loaded machine) then counts from
        // a time no later than this one.
        let now_ms = server_ms(&mut raw).await;
        assert_eq!(scores.len(), 1, "the live waiter kept its place");
        let ends = scores[0].1 as i64;
        assert!(
            ends <= now_ms + 300 + 5,
            "a place ends {} ms ahead",
            ends - now_ms
        );
    }
    holder.unlock().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), first)
        .await
        .expect("woken")
        .unwrap();
}

/// Family 3, family detail 9 and 11: `try_lock` never queues (it fails while the
/// lock is held, or while anyone waits); re-entry by the holder is
/// immediate even with waiters in line.
#[tokio::test]
async fn try_lock_never_queues_and_reentry_is_immediate() {
    let ctx = Ctx::new();
    let (a, b) = (ctx.client().await, ctx.client().await);
    let mine = a.fair_lock("door").unwrap();
    let theirs = b.fair_lock("door").unwrap();
    let guard = mine.lock().await.unwrap();
    assert!(theirs.try_lock().await.unwrap().is_none());
    assert_eq!(line_len(&ctx, "door").await, 0, "a try does not queue");

    let waiter = tokio::spawn({
        let theirs = theirs.clone();
        async move { theirs.lock().await.unwrap() }
    });
    wait_for_line(&ctx, "door", 1).await;
    let started = Instant::now();
    let again = mine.lock().await.unwrap();
    // At once: not after the holder's lease.
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(again.fencing_token(), guard.fencing_token());
    let first_token = guard.fencing_token();
    again.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    let theirs_guard = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap();
    // Research 13: the next owner gets a greater token.
    assert!(theirs_guard.fencing_token() > first_token);
    theirs_guard.unlock().await.unwrap();

    // Free, but someone (a place that lasts a minute) waits: a try fails.
    let mut raw = ctx.raw().await;
    let (queue, due) = (
        format!("{}:queue", fair_key("door")),
        format!("{}:due", fair_key("door")),
    );
    let far = (server_ms(&mut raw).await + 60_000).to_string();
    let _: () = query(&mut raw, &["ZADD", &queue, "1", "1|c:other/1"]).await;
    let _: () = query(&mut raw, &["ZADD", &due, &far, "1|c:other/1"]).await;
    assert!(!mine.is_locked().await.unwrap());
    assert!(mine.try_lock().await.unwrap().is_none());
}

/// Research 8: a waiter that gives up (its bound, or cancelled) removes its
/// own place.
#[tokio::test]
async fn a_waiter_that_gives_up_leaves_the_line() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.fair_lock("impatient").unwrap();
    let guard = lock.lock().await.unwrap();
    let other = ctx.client().await.fair_lock("impatient").unwrap();
    assert!(other
        .try_lock_for(Duration::from_millis(200))
        .await
        .unwrap()
        .is_none());
    assert_eq!(line_len(&ctx, "impatient").await, 0);
    let cancelled = tokio::spawn({
        let other = other.clone();
        async move { other.lock().await }
    });
    wait_for_line(&ctx, "impatient", 1).await;
    cancelled.abort();
    wait_for_line(&ctx, "impatient", 0).await;
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

/// Family 3, family detail 10: a release wakes only the head of the line: twenty
/// waiters, one wake-up message naming one waiter per release.
#[tokio::test]
async fn a_release_wakes_only_the_head() {
    if crate::helpers::on_cluster() {
        return; // counted with a plain SUBSCRIBE, not sharded channels
    }
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.fair_lock("bell").unwrap();
    let holder = lock.lock().await.unwrap();
    let mut pubsub = redis::Client::open(ctx.control_urls()[0].as_str())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub
        .subscribe(format!("{}:released", fair_key("bell")))
        .await
        .unwrap();
    let others = [ctx.client().await, ctx.client().await];
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let lock = others[i % 2].fair_lock("bell").unwrap();
            tokio::spawn(async move {
                let guard = lock.lock().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.unlock().await.unwrap();
            })
        })
        .collect();
    wait_for_line(&ctx, "bell", 20).await;
    holder.unlock().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
    }
    let mut messages = pubsub.on_message();
    let mut wakes = Vec::new();
    while let Ok(Some(msg)) =
        tokio::time::timeout(Duration::from_millis(300), messages.next()).await
    {
        wakes.push(msg.get_payload::<String>().unwrap());
    }
    // 21 releases; the last frees the lock with nobody in line.
    assert_eq!(wakes.len(), 20, "{wakes:?}");
    for wake in &wakes {
        assert!(wake.starts_with('>') && !wake.contains(','), "{wake}");
    }
}

/// Research 12: purging dead places is bounded per call (100), so a line of
/// 1,000 dead waiters is gone within ten operations.
#[tokio::test]
async fn a_thousand_dead_places_are_purged_a_hundred_per_call() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.fair_lock("graveyard").unwrap();
    let (queue, due) = (
        format!("{}:queue", fair_key("graveyard")),
        format!("{}:due", fair_key("graveyard")),
    );
    let mut raw = ctx.raw().await;
    let mut fill = redis::pipe();
    for i in 0..1000 {
        let member = format!("1|c:dead/{i:04}");
        fill.cmd("ZADD")
            .arg(&queue)
            .arg(i + 1)
            .arg(&member)
            .ignore();
        fill.cmd("ZADD").arg(&due).arg(1).arg(&member).ignore(); // long past
    }
    let () = fill.query_async(&mut raw).await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_none(), "900 still ahead");
    assert_eq!(line_len(&ctx, "graveyard").await, 900);
    let mut calls = 1;
    let guard = loop {
        calls += 1;
        if let Some(guard) = lock.try_lock().await.unwrap() {
            break guard;
        }
        assert!(calls <= 10, "still not purged after {calls} calls");
    };
    assert_eq!(calls, 10);
    assert_eq!(line_len(&ctx, "graveyard").await, 0);
    guard.unlock().await.unwrap();
}
