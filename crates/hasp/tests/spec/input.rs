//! Lock 27–28: input validation and opaque names.

use std::time::Duration;

use hasp::{Client, Error, Settings};

use crate::helpers::*;

fn assert_invalid<T: std::fmt::Debug>(r: Result<T, Error>, argument: &str) {
    match r {
        Err(Error::InvalidArgument { argument: a, .. }) if a == argument => {}
        other => panic!("expected InvalidArgument({argument}), got {other:?}"),
    }
}

#[tokio::test]
async fn bad_arguments_are_rejected_before_any_redis_call() {
    let mut ctx = Ctx::new();
    let client = ctx.client().await;
    // With the server gone, any Redis call would fail with Error::Redis:
    // getting InvalidArgument proves validation came first.
    ctx.server_of("any").kill();

    assert_invalid(client.lock(""), "name");
    assert_invalid(client.lock(&"x".repeat(1025)), "name");
    let lock = client.lock(&"x".repeat(1024)).unwrap();
    assert_invalid(lock.clone().with_lease(Duration::ZERO), "lease");
    assert_invalid(
        lock.clone().with_lease(Duration::from_secs(8 * 24 * 3600)),
        "lease",
    );
    assert_invalid(lock.clone().with_lease(Duration::MAX), "lease");
    assert_invalid(lock.try_lock_for(Duration::MAX).await, "wait");
    assert_invalid(lock.lock_within(Duration::MAX).await, "wait");
    assert_invalid(hasp::Owner::from_id(":t").map_err(Error::from), "owner");

    let urls = ctx.urls();
    for (settings, argument) in [
        (Settings::default().set_prefix("a{b}"), "prefix"),
        (Settings::default().set_prefix(""), "prefix"),
        (
            Settings::default().set_watchdog_timeout(Duration::ZERO),
            "watchdog_timeout",
        ),
        (Settings::default().set_renew_batch(0), "renew_batch"),
        (Settings::default().set_lanes(0), "lanes"),
        (Settings::default().set_lanes(65), "lanes"),
        (
            Settings::default().set_max_lease(Duration::MAX),
            "max_lease",
        ),
    ] {
        assert_invalid(open(&urls, settings).await, argument);
    }
    assert_invalid(Client::open("not a url").await, "url");
}

#[tokio::test]
async fn the_longest_response_timeout_allowed_works() {
    let ctx = Ctx::new();
    // Redis's largest millisecond count is accepted; no deadline derived
    // from it may overflow a clock reading.
    let longest = Duration::from_millis(i64::MAX as u64);
    let settings = Settings::default().set_response_timeout(longest);
    let client = open(&ctx.urls(), settings).await.unwrap();
    let lock = client.plain_lock("patient").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    let lock = client.lock("patient-fenced").unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
}

#[tokio::test]
async fn a_sub_millisecond_lease_is_rounded_up_never_sent_as_zero() {
    let ctx = Ctx::new();
    let lock = ctx
        .client()
        .await
        .lock("tiny")
        .unwrap()
        .with_lease(Duration::from_nanos(1))
        .unwrap();
    // PEXPIRE 0 would delete the key at once and the acquire script would
    // still report success; rounding up keeps it alive for 1 ms.
    let guard = lock.lock().await.unwrap();
    assert!(guard.fencing_token() >= 1);
    drop(guard);
}

#[tokio::test]
async fn names_are_opaque_and_never_collide() {
    let ctx = Ctx::new();
    let mut raw = ctx.raw().await;
    let a = ctx.client().await;
    let b = ctx.client().await;
    let names = [
        "plain",
        "with space",
        "colon:sep",
        "{braced}",
        "a{b}",
        "a%7Bb%7D",
        "}{",
        "%",
        "%25",
        "锁/ключ/🔒",
        "hasp:{x}:fence",
    ];
    let mut guards = Vec::new();
    for name in names {
        guards.push(a.lock(name).unwrap().lock().await.unwrap());
    }
    for name in names {
        // Each name is its own lock: held, and by a, not by b.
        assert!(
            b.lock(name).unwrap().try_lock().await.unwrap().is_none(),
            "{name}"
        );
        let exists: i64 = query(&mut raw, &["EXISTS", &lock_key(name)]).await;
        assert_eq!(exists, 1, "{name} is not at its documented key");
    }
    let keys: Vec<String> = query(&mut raw, &["KEYS", "hasp:*"]).await;
    // One hash and one fence counter per name: no two names share a key.
    assert_eq!(keys.len(), names.len() * 2, "{keys:?}");
    for g in guards {
        g.unlock().await.unwrap();
    }
}

#[tokio::test]
async fn a_custom_prefix_moves_every_key() {
    let ctx = Ctx::new();
    let mut raw = ctx.raw().await;
    let client = ctx
        .client_with(Settings::default().set_prefix("shop"))
        .await;
    let g = client.lock("n").unwrap().lock().await.unwrap();
    let keys: Vec<String> = query(&mut raw, &["KEYS", "*"]).await;
    let mut keys = keys;
    keys.sort();
    assert_eq!(
        keys,
        vec!["shop:{n}".to_owned(), "shop:{n}:fence".to_owned()]
    );
    g.unlock().await.unwrap();
}
