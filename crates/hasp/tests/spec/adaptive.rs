//! The adaptive lease: the "Adaptive lease" section of `docs/guarantees.md`
//! (its lines cited as "adaptive N"). The estimator's arithmetic is unit-tested in
//! `src/core/adaptive.rs`.

use std::time::{Duration, Instant, SystemTime};

use hasp::{AdaptiveLease, Error, Settings};

use crate::helpers::{lock_key, query, Ctx};

/// A client that learns fast: leases from 200 ms, renewed 50 ms before
/// their end at the latest.
async fn learning_client(ctx: &Ctx) -> hasp::Client {
    let adaptive = AdaptiveLease::default()
        .set_min(Duration::from_millis(200))
        .set_renew_floor(Duration::from_millis(50));
    ctx.client_with(Settings::default().set_adaptive_lease(adaptive))
        .await
}

fn history_key(class: &str) -> String {
    format!("{}:lease", lock_key(class))
}

async fn pttl(ctx: &Ctx, name: &str) -> i64 {
    let mut raw = ctx.raw().await;
    query(&mut raw, &["PTTL", &lock_key(name)]).await
}

/// Holds `lock` for `held`, `times` times.
async fn sections(lock: &hasp::Lock, held: Duration, times: usize) {
    for _ in 0..times {
        let guard = lock.lock().await.unwrap();
        tokio::time::sleep(held).await;
        guard.unlock().await.unwrap();
    }
}

/// Adaptive 1, 2 and 6: a class learns from the full
/// releases of all its names; before that a lease is the initial one (the
/// watchdog timeout); the figures are readable, and live in a hash of the
/// class's slot with an expiry, stamped by the server's clock.
#[tokio::test]
async fn a_class_learns_its_lease_from_its_holds_and_shows_why() {
    let ctx = Ctx::new();
    let client = learning_client(&ctx).await;
    let first = client
        .lock("order:1")
        .unwrap()
        .with_adaptive_lease("order")
        .unwrap();
    let guard = first.lock().await.unwrap();
    assert!(
        pttl(&ctx, "order:1").await > 29_000,
        "untaught: the initial lease"
    );
    guard.unlock().await.unwrap();

    for user in 2..22 {
        let lock = client
            .lock(&format!("order:{user}"))
            .unwrap()
            .with_adaptive_lease("order")
            .unwrap();
        sections(&lock, Duration::from_millis(30), 1).await;
    }
    let learned = client.learned_lease("order").await.unwrap();
    assert!(learned.samples >= 20, "{learned:?}");
    assert!(
        learned.srtt >= Duration::from_millis(15) && learned.srtt < Duration::from_millis(200),
        "{learned:?}"
    );
    assert!(
        learned.lease >= Duration::from_millis(200) && learned.lease < Duration::from_millis(1000),
        "{learned:?}"
    );
    // The next hold of the class gets it.
    let next = client
        .lock("order:99")
        .unwrap()
        .with_adaptive_lease("order")
        .unwrap();
    let guard = next.lock().await.unwrap();
    let ttl = pttl(&ctx, "order:99").await;
    let lease = learned.lease.as_millis() as i64;
    assert!(ttl <= lease && ttl > lease - 100, "{ttl} vs {lease}");
    guard.unlock().await.unwrap();

    // The shared history: readable, with an expiry, stamped by the server.
    let mut raw = ctx.raw().await;
    let fields: std::collections::HashMap<String, String> =
        query(&mut raw, &["HGETALL", &history_key("order")]).await;
    for field in ["srtt", "rttvar", "samples", "updated_at"] {
        assert!(fields.contains_key(field), "{field} in {fields:?}");
    }
    let history_ttl: i64 = query(&mut raw, &["PTTL", &history_key("order")]).await;
    assert!(history_ttl > 23 * 3_600_000, "{history_ttl}");
    let time: Vec<String> = query(&mut raw, &["TIME"]).await;
    let server_ms = time[0].parse::<u64>().unwrap() * 1000;
    let stamped = learned
        .updated_at
        .expect("written")
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(stamped <= server_ms + 1000 && stamped + 10_000 > server_ms);
}

/// Adaptive 3: an overrun raises the lease at once, so the same long
/// section right after it needs no renewal; a hold dropped without release
/// teaches nothing.
#[tokio::test]
async fn an_overrun_raises_the_lease_at_once() {
    let ctx = Ctx::new();
    let client = learning_client(&ctx).await;
    let lock = client
        .lock("report")
        .unwrap()
        .with_adaptive_lease("report")
        .unwrap();
    sections(&lock, Duration::from_millis(10), 20).await;
    let before = client.learned_lease("report").await.unwrap();
    assert!(before.lease < Duration::from_millis(400), "{before:?}");

    drop(lock.lock().await.unwrap()); // dropped: no sample
    let dropped = client.learned_lease("report").await.unwrap();
    assert_eq!(dropped.samples, before.samples);

    sections(&lock, Duration::from_millis(800), 1).await; // renewed: an overrun
    let after = client.learned_lease("report").await.unwrap();
    assert!(after.lease >= Duration::from_millis(1200), "{after:?}");
    let renewals = client.stats().renew_calls;
    sections(&lock, Duration::from_millis(800), 1).await;
    assert_eq!(
        client.stats().renew_calls,
        renewals,
        "the second long section needed no renewal"
    );
}

/// Adaptive 4: a holder running about 8× its learned lease
/// keeps the lock throughout (renewed by the client's scheduler, in its
/// batches), another owner spinning on `try_lock` never gets it, and
/// nothing is renewed once the hold is released.
#[tokio::test]
async fn a_holder_that_outlasts_its_learned_lease_keeps_the_lock() {
    let ctx = Ctx::new();
    let client = learning_client(&ctx).await;
    let lock = client
        .lock("long")
        .unwrap()
        .with_adaptive_lease("long")
        .unwrap();
    sections(&lock, Duration::from_millis(20), 20).await;
    let lease = client.learned_lease("long").await.unwrap().lease;
    assert!(lease < Duration::from_millis(400), "{lease:?}");

    let rival = ctx.client().await.lock("long").unwrap();
    let guard = lock.lock().await.unwrap();
    let until = Instant::now() + Duration::from_secs(2);
    let mut tries = 0;
    while Instant::now() < until {
        tries += 1;
        assert!(
            rival.try_lock().await.unwrap().is_none(),
            "taken after {tries} tries"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!guard.is_lost());
    let renewed = client.stats().renew_calls;
    assert!(renewed >= 4, "about 2 s / lease renewals: {renewed}");
    guard.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(client.stats().renew_calls, renewed, "renewed after release");
}

/// Adaptive 5: many short holds in adaptive mode cost no renewal
/// call at all, where watchdog mode sends its periodic batches.
#[tokio::test]
async fn short_holds_in_adaptive_mode_cost_no_renewals() {
    let ctx = Ctx::new();
    // Leases of a second or more: a hold of at most 45 ms outlasts none of
    // them even when a busy machine delays its replies by hundreds of
    // milliseconds; the watchdog renews every 400 ms, well within the
    // second or more that 40 holds per task take.
    let settings = || {
        Settings::default()
            .set_watchdog_timeout(Duration::from_millis(1_200))
            .set_adaptive_lease(
                AdaptiveLease::default()
                    .set_initial(Duration::from_secs(1))
                    .set_min(Duration::from_secs(1))
                    .set_max(Duration::from_secs(2))
                    .set_renew_floor(Duration::from_millis(100)),
            )
    };
    let adaptive = ctx.client_with(settings()).await;
    let watchdog = ctx.client_with(settings()).await;
    let run = |client: hasp::Client, adaptive: bool| async move {
        let tasks: Vec<_> = (0..50)
            .map(|t| {
                let lock = client.lock(&format!("short:{t}")).unwrap();
                let lock = if adaptive {
                    lock.with_adaptive_lease("short").unwrap()
                } else {
                    lock
                };
                tokio::spawn(async move {
                    for i in 0..40u64 {
                        let guard = lock.lock().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(5 + (t + i) % 40)).await;
                        guard.unlock().await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        client.stats().renew_calls
    };
    let adaptive_calls = run(adaptive, true).await;
    let watchdog_calls = run(watchdog, false).await;
    assert_eq!(adaptive_calls, 0);
    assert!(watchdog_calls > 0, "the watchdog renewed periodically");
}

/// Adaptive 2: a shared history that is absurd is ignored (no lease
/// outside [min, max]) and overwritten by the next merge with samples.
#[tokio::test]
async fn an_absurd_shared_history_is_ignored_and_overwritten() {
    let ctx = Ctx::new();
    let mut raw = ctx.raw().await;
    let key = history_key("odd");
    let _: () = query(
        &mut raw,
        &[
            "HSET",
            &key,
            "srtt",
            "-5",
            "rttvar",
            "nan",
            "samples",
            "x",
            "updated_at",
            "9",
        ],
    )
    .await;
    let client = learning_client(&ctx).await;
    let learned = client.learned_lease("odd").await.unwrap();
    assert_eq!(learned.samples, 0);
    assert_eq!(learned.lease, Duration::from_secs(30), "the initial lease");
    let lock = client
        .lock("odd")
        .unwrap()
        .with_adaptive_lease("odd")
        .unwrap();
    sections(&lock, Duration::from_millis(20), 3).await;
    let learned = client.learned_lease("odd").await.unwrap();
    assert!(learned.samples >= 3 && learned.lease < Duration::from_secs(1));
    let srtt: String = query(&mut raw, &["HGET", &key, "srtt"]).await;
    assert!(srtt.parse::<f64>().unwrap() > 0.0, "overwritten: {srtt}");
}

/// Adaptive 1: invalid settings are refused before any connection.
#[tokio::test]
async fn invalid_adaptive_settings_are_refused() {
    let ctx = Ctx::new();
    for adaptive in [
        AdaptiveLease::default().set_min(Duration::from_secs(60)),
        AdaptiveLease::default()
            .set_min(Duration::from_millis(100))
            .set_renew_floor(Duration::from_millis(50)),
        AdaptiveLease::default().set_max(Duration::from_secs(8 * 24 * 3600)),
        AdaptiveLease::default().set_gains(0.0, 0.25),
    ] {
        let err = crate::helpers::open(
            &ctx.urls(),
            Settings::default().set_adaptive_lease(adaptive),
        )
        .await
        .expect_err("refused");
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    }
    let client = ctx.client().await;
    let err = client
        .lock("x")
        .unwrap()
        .with_adaptive_lease("")
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}
