//! Lock 30–34: the plain lock, and operations sent as native commands.

use std::time::Duration;

use hasp::{Owner, Settings};

use crate::helpers::*;

fn plain_key(name: &str) -> String {
    format!("{}:plain", lock_key(name))
}

#[tokio::test]
async fn a_plain_lock_excludes_others_is_reentered_and_leaves_no_counter() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let other = ctx.client().await.plain_lock("plain").unwrap();
    let lock = client.plain_lock("plain").unwrap();
    let mut raw = ctx.raw().await;

    let outer = lock.lock().await.unwrap();
    let inner = tokio::time::timeout(Duration::from_secs(5), lock.lock())
        .await
        .expect("re-entry must not block")
        .unwrap();
    assert_eq!(lock.hold_count(), 2);
    assert!(other.try_lock().await.unwrap().is_none());
    // A lock of the same name is another lock.
    let fenced = client.lock("plain").unwrap().try_lock().await.unwrap();
    assert!(fenced.is_some(), "a lock of the same name is distinct");
    fenced.unwrap().unlock().await.unwrap();

    let value: Option<String> = query(&mut raw, &["GET", &plain_key("plain")]).await;
    assert!(
        value.is_some_and(|v| v.starts_with("1 ")),
        "one hold in Redis"
    );
    inner.unlock().await.unwrap();
    assert!(
        other.try_lock().await.unwrap().is_none(),
        "one hold remains"
    );
    outer.unlock().await.unwrap();

    let theirs = other.try_lock().await.unwrap().expect("free after both");
    theirs.unlock().await.unwrap();
    let counter: i64 = query(
        &mut raw,
        &["EXISTS", &format!("{}:fence", plain_key("plain"))],
    )
    .await;
    assert_eq!(counter, 0, "a plain lock writes no fencing counter");
    let left: i64 = query(&mut raw, &["EXISTS", &plain_key("plain")]).await;
    assert_eq!(left, 0, "released");
}

#[tokio::test]
async fn a_free_plain_lock_is_taken_without_a_script_and_released_natively_where_the_server_can() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let lock = client.plain_lock("native").unwrap();
    let mut raw = ctx.raw().await;
    let conditional = !on_cluster() && has_conditional_commands(&mut raw).await;

    // Warm up (the client's connections are made, the function loaded).
    lock.lock().await.unwrap().unlock().await.unwrap();
    let calls_before = ctx.batch_calls().await;
    let stats_before = client.stats();
    const PAIRS: u64 = 20;
    for _ in 0..PAIRS {
        let guard = lock.lock().await.unwrap();
        guard.unlock().await.unwrap();
    }
    let calls = ctx.batch_calls().await - calls_before;
    let stats = client.stats();
    let native = stats.native_ops - stats_before.native_ops;
    if on_cluster() {
        // A cluster's calls go through the function per node.
        assert_eq!(native, 0);
        return;
    }
    assert_eq!(calls, 0, "a plain pair never calls the batch function");
    assert_eq!(native, 2 * PAIRS, "acquisitions and releases native");
    assert_eq!(stats.native_fallbacks, stats_before.native_fallbacks);
    let scripts = ctx.command_calls("evalsha").await;
    if conditional {
        assert_eq!(scripts, 0, "Valkey 9: DELIFEQ, no script at all");
    } else {
        assert_eq!(
            scripts,
            PAIRS + 1,
            "Redis 7.0: one compare-and-delete per release"
        );
    }
}

#[tokio::test]
async fn a_free_locks_acquisition_is_one_small_script_and_its_last_release_one_native_command() {
    let ctx = Ctx::new();
    if on_cluster() {
        return; // a cluster's calls go through the function
    }
    let client = ctx.client().await;
    let lock = client.lock("fenced").unwrap();
    let first = lock.lock().await.unwrap();
    let token = first.fencing_token();
    first.unlock().await.unwrap();
    let before = client.stats().native_ops;
    let calls_before = ctx.batch_calls().await;
    let guard = lock.lock().await.unwrap();
    assert!(guard.fencing_token() > token, "a fresh, greater token");
    guard.unlock().await.unwrap();
    assert_eq!(
        client.stats().native_ops - before,
        2,
        "the acquisition and the release"
    );
    assert_eq!(
        ctx.batch_calls().await - calls_before,
        0,
        "a free lock's pair never calls the batch function"
    );
    assert!(!lock.is_locked().await.unwrap());
}

/// A held lock of either kind.
enum Held {
    Plain(hasp::PlainGuard),
    Fenced(hasp::Guard),
}

impl Held {
    /// One try by a fresh owner; released at once if it got the lock.
    async fn try_take(client: &hasp::Client, plain: bool, name: &str) -> bool {
        if plain {
            let lock = client.plain_lock(name).unwrap();
            match lock.try_lock().await.unwrap() {
                Some(guard) => guard.unlock().await.is_ok(),
                None => false,
            }
        } else {
            let lock = client.lock(name).unwrap();
            match lock.try_lock().await.unwrap() {
                Some(guard) => guard.unlock().await.is_ok(),
                None => false,
            }
        }
    }

    async fn take(client: &hasp::Client, plain: bool, name: &str, owner: Owner) -> Self {
        let wait = Duration::from_secs(20);
        if plain {
            let lock = client.plain_lock(name).unwrap().with_owner(owner);
            Held::Plain(lock.lock_within(wait).await.unwrap())
        } else {
            let lock = client.lock(name).unwrap().with_owner(owner);
            Held::Fenced(lock.lock_within(wait).await.unwrap())
        }
    }

    async fn unlock(self) {
        self.release().await.unwrap();
    }

    async fn release(self) -> hasp::Result<()> {
        match self {
            Held::Plain(guard) => guard.unlock().await,
            Held::Fenced(guard) => guard.unlock().await,
        }
    }
}

/// The key of either kind's lock called `name`.
fn key_of(plain: bool, name: &str) -> String {
    if plain {
        plain_key(name)
    } else {
        lock_key(name)
    }
}

#[tokio::test]
async fn a_release_that_finds_the_hold_re_entered_through_another_client_falls_back_and_keeps_that_hold(
) {
    let ctx = Ctx::new();
    let first = ctx.client().await;
    let second = ctx.client().await;
    let stranger = ctx.client().await;
    let mut raw = ctx.raw().await;
    for plain in [true, false] {
        let name = format!("re-entered-{plain}");
        let owner = Owner::new();
        // Once first, so that the next hold's release may go native.
        Held::take(&first, plain, &name, owner.clone())
            .await
            .unlock()
            .await;
        let mine = Held::take(&first, plain, &name, owner.clone()).await;
        // The same owner through another client: Redis counts two holds,
        // so the value is no longer the one `first` wrote.
        let theirs = Held::take(&second, plain, &name, owner.clone()).await;
        let value: String = query(&mut raw, &["GET", &key_of(plain, &name)]).await;
        assert!(value.starts_with("2 "), "plain {plain}: two holds: {value}");
        let fallbacks = first.stats().native_fallbacks;
        mine.unlock().await;
        if !on_cluster() {
            assert_eq!(
                first.stats().native_fallbacks - fallbacks,
                1,
                "plain {plain}: the native release found two holds, and the function released one"
            );
        }
        let value: String = query(&mut raw, &["GET", &key_of(plain, &name)]).await;
        assert!(
            value.starts_with("1 "),
            "plain {plain}: one hold left: {value}"
        );
        let other = Held::try_take(&stranger, plain, &name).await;
        assert!(
            !other,
            "plain {plain}: still held by the other client's hold"
        );
        theirs.unlock().await;
        assert!(
            Held::try_take(&stranger, plain, &name).await,
            "plain {plain}: free once both holds are given back"
        );
    }
}

#[tokio::test]
async fn a_release_that_finds_the_lock_taken_over_falls_back_and_touches_nothing() {
    let ctx = Ctx::new();
    let holder = ctx.client().await;
    let usurper = ctx.client().await;
    let mut raw = ctx.raw().await;
    for plain in [true, false] {
        let name = format!("taken-over-{plain}");
        Held::take(&holder, plain, &name, Owner::new())
            .await
            .unlock()
            .await;
        // Held in the watchdog's mode: the holder's own belief lasts, so
        // only Redis can tell it the lock is no longer its.
        let mine = Held::take(&holder, plain, &name, Owner::new()).await;
        let key = key_of(plain, &name);
        let _: i64 = query(&mut raw, &["DEL", &key]).await;
        let theirs = Held::take(&usurper, plain, &name, Owner::new()).await;
        let value: String = query(&mut raw, &["GET", &key]).await;
        let fallbacks = holder.stats().native_fallbacks;
        assert_not_held(mine.release().await.unwrap_err());
        if !on_cluster() {
            assert_eq!(
                holder.stats().native_fallbacks - fallbacks,
                1,
                "plain {plain}: the native release found another owner's hold, and the function said so"
            );
        }
        let after: String = query(&mut raw, &["GET", &key]).await;
        assert_eq!(
            after, value,
            "plain {plain}: the new holder's lock untouched"
        );
        theirs.unlock().await;
    }
}

#[tokio::test]
async fn a_release_that_finds_a_waiter_flagged_falls_back_and_wakes_it() {
    let ctx = Ctx::new();
    let holder = ctx.client().await;
    let waiter = ctx.client().await;
    let raw = ctx.raw().await;
    for plain in [true, false] {
        let name = format!("contended-{plain}");
        // Once first, so that the next hold's release may go native.
        Held::take(&holder, plain, &name, Owner::new())
            .await
            .unlock()
            .await;
        let held = Held::take(&holder, plain, &name, Owner::new()).await;
        let waiting = {
            let waiter = waiter.clone();
            let name = name.clone();
            tokio::spawn(async move { Held::take(&waiter, plain, &name, Owner::new()).await })
        };
        // The waiter has flagged itself once the lock's value names it.
        let key = if plain {
            plain_key(&name)
        } else {
            lock_key(&name)
        };
        let flagged = testkit::eventually(Duration::from_secs(20), || {
            let mut raw = raw.clone();
            let key = key.clone();
            async move {
                let value: Option<String> = query(&mut raw, &["GET", &key]).await;
                value.is_some_and(|v| v.split(' ').nth(2) != Some("-"))
            }
        })
        .await;
        assert!(flagged, "the waiter flags itself on the lock");
        let fallbacks = holder.stats().native_fallbacks;
        // The lease is the watchdog's (30 s): only the release's message
        // wakes the waiter within its 20 s wait.
        held.unlock().await;
        waiting.await.unwrap().unlock().await;
        if !on_cluster() {
            assert_eq!(
                holder.stats().native_fallbacks - fallbacks,
                1,
                "plain {plain}: the native release found the flag, and the function released"
            );
        }
    }
}

#[tokio::test]
async fn the_watchdog_renews_a_plain_lock_natively_where_the_server_can() {
    let ctx = Ctx::new();
    let client = ctx
        .client_with(
            Settings::default()
                .set_watchdog_timeout(Duration::from_millis(600))
                .set_response_timeout(Duration::from_millis(500)),
        )
        .await;
    let mut raw = ctx.raw().await;
    let conditional = !on_cluster() && has_conditional_commands(&mut raw).await;
    let lock = client.plain_lock("renewed").unwrap();
    let guard = lock.lock().await.unwrap();
    let before = client.stats().native_ops;
    // Three leases: the hold lives only if it was renewed.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    assert!(!guard.is_lost(), "renewed while held");
    let ttl: i64 = query(&mut raw, &["PTTL", &plain_key("renewed")]).await;
    assert!(ttl > 0, "still held in Redis");
    if conditional {
        assert!(
            client.stats().native_ops - before >= 2,
            "renewals went as SET … IFEQ"
        );
    }
    guard.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn an_operation_finding_its_script_gone_falls_back_to_the_function_and_the_scripts_come_back()
{
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let plain = client.plain_lock("flushed").unwrap();
    let fenced = client.lock("flushed").unwrap();
    plain.lock().await.unwrap().unlock().await.unwrap();
    fenced.lock().await.unwrap().unlock().await.unwrap();
    let mut raw = ctx.raw().await;
    let conditional = !on_cluster() && has_conditional_commands(&mut raw).await;
    let _: String = query(&mut raw, &["SCRIPT", "FLUSH"]).await;
    let fallbacks = client.stats().native_fallbacks;
    let guard = fenced.lock().await.unwrap();
    guard.unlock().await.unwrap();
    let guard = plain.lock().await.unwrap();
    guard.unlock().await.unwrap();
    assert!(!plain.is_locked().await.unwrap(), "released all the same");
    assert!(!fenced.is_locked().await.unwrap(), "released all the same");
    if on_cluster() {
        return;
    }
    // NOSCRIPT for the lock's acquisition script, and on Redis 7.0 for
    // the compare-and-delete of a release; each then went through the
    // function, and the scripts were loaded again.
    let lost = client.stats().native_fallbacks - fallbacks;
    assert!(
        (1..=3).contains(&lost),
        "{lost} fallbacks (conditional commands: {conditional})"
    );
    let (fallbacks, native) = (client.stats().native_fallbacks, client.stats().native_ops);
    fenced.lock().await.unwrap().unlock().await.unwrap();
    plain.lock().await.unwrap().unlock().await.unwrap();
    assert_eq!(
        client.stats().native_fallbacks,
        fallbacks,
        "the scripts are back"
    );
    assert_eq!(
        client.stats().native_ops - native,
        4,
        "both pairs native again"
    );
}

#[tokio::test]
async fn a_renewal_that_finds_the_plain_lock_taken_over_falls_back_and_the_hold_is_lost() {
    let ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(Duration::from_millis(600)).await;
    let usurper = ctx.client().await;
    let mut raw = ctx.raw().await;
    let conditional = !on_cluster() && has_conditional_commands(&mut raw).await;
    let lock = client.plain_lock("renewal-taken-over").unwrap();
    let guard = lock.lock().await.unwrap();
    let _: i64 = query(&mut raw, &["DEL", &plain_key("renewal-taken-over")]).await;
    let theirs = usurper
        .plain_lock("renewal-taken-over")
        .unwrap()
        .lock_within(Duration::from_secs(20))
        .await
        .unwrap();
    let fallbacks = client.stats().native_fallbacks;
    // The next renewal (a third of 600 ms from now) finds the lock another
    // owner's: the hold is lost, and nothing of the new holder's changes.
    tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the renewal finds the hold gone");
    if conditional {
        assert!(
            client.stats().native_fallbacks > fallbacks,
            "the SET … IFEQ found another value, and the function said so"
        );
    }
    assert!(!theirs.is_lost());
    theirs
        .unlock()
        .await
        .expect("the new holder's hold untouched");
}
