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

/// Lock 25, for acquisitions that share one run of the acquisition
/// script: a call's fenced acquisitions of free locks go to Redis together,
/// and each gets a token from its own name's counter, written into its
/// lock's value and greater than the name's earlier tokens;
/// a lock among them that is held is refused without touching the holder.
#[tokio::test]
async fn acquisitions_sent_together_each_get_their_own_token() {
    let ctx = Ctx::new();
    let mut raw = ctx.raw().await;
    let holder = ctx.client().await.lock("together-held").unwrap();
    let held = holder.lock().await.unwrap();
    let client = ctx.client().await;
    let names = ["together-0", "together-1", "together-2", "together-3"];
    let locks: Vec<_> = names.iter().map(|n| client.lock(n).unwrap()).collect();
    let other = client.lock("together-held").unwrap();
    // Script runs on one server (a cluster's acquisitions go through the
    // function, one call per node).
    let mut runs = async || match on_cluster() {
        true => 0,
        false => {
            let info: String = query(&mut raw, &["INFO", "commandstats"]).await;
            info.lines()
                .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse::<u64>().unwrap())
        }
    };
    let before = runs().await;
    // Polled together, before the client's lane runs: queued for one call.
    let (g0, g1, g2, g3, refused) = tokio::join!(
        locks[0].try_lock(),
        locks[1].try_lock(),
        locks[2].try_lock(),
        locks[3].try_lock(),
        other.try_lock(),
    );
    let after = runs().await;
    assert!(refused.unwrap().is_none(), "a held lock is refused");
    let guards = [g0, g1, g2, g3].map(|g| g.unwrap().expect("a free lock is taken"));
    for (name, guard) in names.iter().zip(&guards) {
        let value: String = query(&mut raw, &["GET", &lock_key(name)]).await;
        assert!(
            value.ends_with(&format!(" {}", guard.fencing_token())),
            "{name}: {value:?} carries the guard's token {}",
            guard.fencing_token()
        );
    }
    assert!(
        after - before < 5,
        "five acquisitions sent together took {} script runs",
        after - before
    );
    assert!(!held.is_lost(), "the holder keeps its lock");
    let value: String = query(&mut raw, &["GET", &lock_key("together-held")]).await;
    assert!(value.ends_with(&format!(" {}", held.fencing_token())));
    let tokens = guards.map(|g| g.fencing_token());
    for lock in &locks {
        lock.force_unlock().await.unwrap();
    }
    // Taken together again: each name's token grew.
    let again = tokio::join!(
        locks[0].try_lock(),
        locks[1].try_lock(),
        locks[2].try_lock(),
        locks[3].try_lock(),
    );
    let again = [again.0, again.1, again.2, again.3].map(|g| g.unwrap().expect("free again"));
    for ((name, first), next) in names.iter().zip(tokens).zip(&again) {
        assert!(
            next.fencing_token() > first,
            "{name}: {} <= {first}",
            next.fencing_token()
        );
    }
    held.unlock().await.unwrap();
}
