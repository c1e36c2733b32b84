//! Lock 15–20: lease renewal by the watchdog.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hasp::Settings;

use crate::helpers::*;

const WATCHDOG: Duration = Duration::from_millis(900);

#[tokio::test]
async fn a_lock_without_lease_never_expires_while_its_client_lives() {
    let ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(WATCHDOG).await;
    let other = ctx.client().await.lock("long").unwrap();
    let lock = client.lock("long").unwrap();
    let guard = lock.lock().await.unwrap();
    // Five watchdog timeouts: without renewal it would have expired at 0.9 s.
    tokio::time::sleep(WATCHDOG * 5).await;
    assert!(lock.is_held_by_me().await.unwrap());
    assert!(other.try_lock().await.unwrap().is_none());
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
}

/// Not a test of its own: `a_dead_holders_lock_frees_within_one_watchdog_timeout`
/// runs it in a child process, which it then kills.
#[tokio::test]
#[ignore = "helper run in a child process by another test"]
async fn child_process_holds_a_lock_until_killed() {
    let Ok(url) = std::env::var("HASP_CHILD_URL") else {
        return;
    };
    let settings = Settings::default().set_watchdog_timeout(WATCHDOG);
    let urls: Vec<String> = url.split(',').map(str::to_owned).collect();
    let client = open(&urls, settings).await.unwrap();
    let guard = client.lock("orphan").unwrap().lock().await.unwrap();
    println!("HELD {}", guard.fencing_token());
    std::future::pending::<()>().await;
}

#[tokio::test]
async fn a_dead_holders_lock_frees_within_one_watchdog_timeout() {
    let ctx = Ctx::new();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "watchdog::child_process_holds_a_lock_until_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("HASP_CHILD_URL", ctx.urls().join(","))
        .env(crate::helpers::CA_FILE_VAR, crate::helpers::ca_file())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let held = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.starts_with("HELD"))
    })
    .await
    .unwrap();
    assert!(held, "child never took the lock");

    let lock = ctx.client().await.lock("orphan").unwrap();
    // Alive, the child keeps renewing past its watchdog timeout.
    tokio::time::sleep(WATCHDOG * 2).await;
    assert!(lock.try_lock().await.unwrap().is_none());

    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let guard = lock
        .lock_within(Duration::from_secs(5))
        .await
        .expect("freed after the holder died");
    let freed_after = killed.elapsed();
    assert!(
        freed_after <= WATCHDOG + Duration::from_millis(300),
        "{freed_after:?}"
    );
    guard.unlock().await.unwrap();
}

/// Lock 17: 10,000 held locks cost about 10,000 / 100 renewal calls
/// per period. The client's lanes (4 by default) each renew their own
/// locks, in calls of at most 100: a round is 100 calls per node, plus at
/// most one part-filled call per lane but the first.
#[tokio::test]
async fn ten_thousand_locks_cost_one_script_call_per_hundred_per_period() {
    let ctx = Ctx::new();
    let watchdog = Duration::from_secs(3); // renew period 1 s
    let client = ctx.fast_watchdog_client(watchdog).await;
    let mut raw = ctx.raw().await;
    // A call carries the operations of one node: on a 3-master cluster a
    // batch of 100 renewals is three calls.
    let nodes = if on_cluster() { 3 } else { 1 };
    let locks: Vec<_> = (0..10_000)
        .map(|i| client.lock(&format!("many-{i}")).unwrap())
        .collect();
    let server_start = ctx.batch_calls().await;
    let mut guards = Vec::with_capacity(locks.len());
    for chunk in locks.chunks(1000) {
        let got = futures_util::future::join_all(chunk.iter().map(|l| l.lock())).await;
        guards.extend(got.into_iter().map(Result::unwrap));
    }
    assert_eq!(client.stats().held_locks, 10_000);
    let acquired_at = std::time::Instant::now();
    let acquire_calls = ctx.batch_calls().await - server_start;
    // Concurrent acquisitions are batched (on one server, those of a call
    // that carries few operations go as the acquisition script instead):
    // far fewer function calls than locks.
    assert!(
        acquire_calls <= 2_000 * nodes,
        "{acquire_calls} script calls for 10,000 concurrent acquisitions"
    );
    let server_start = server_start + acquire_calls;
    let native_before = client.stats().native_ops;
    let conditional = !on_cluster() && has_conditional_commands(&mut raw).await;

    // Let three renewal rounds happen, then compare the client's count of
    // renewal calls with what the server executed.
    let three_rounds = testkit::eventually(Duration::from_secs(6), || {
        let c = client.clone();
        async move { c.stats().renew_calls >= 300 * nodes }
    })
    .await;
    assert!(three_rounds, "renewal rounds are missing");
    let elapsed = acquired_at.elapsed();
    let client_calls = client.stats().renew_calls;
    // The lanes' last calls of a round may still be on the wire: compare
    // once the server has caught up with the client's count, between two
    // rounds (a loaded machine may take most of a period for a round).
    let seen = std::sync::Mutex::new((0, 0));
    let server_agrees = conditional
        || testkit::eventually(Duration::from_secs(30), || {
            let (ctx, client, seen) = (&ctx, &client, &seen);
            async move {
                let expected = server_start + client.stats().renew_calls;
                let server = ctx.batch_calls().await;
                *seen.lock().unwrap() = (server, expected);
                server == expected
            }
        })
        .await;
    let (server, counted) = *seen.lock().unwrap();
    if conditional {
        // Each renewal is one conditional SET, 100 to a pipeline: no
        // function call at all.
        let server = ctx.batch_calls().await;
        assert_eq!(server, server_start, "renewals called the function");
        assert!(
            client.stats().native_ops - native_before >= 30_000,
            "three rounds of 10,000 native renewals"
        );
    } else {
        assert!(
            server_agrees,
            "the server ran {server} script calls, the client counted {counted}"
        );
    }
    // Read just after the 300th call, so within the third round.
    let extra = if on_cluster() { 0 } else { 3 * 3 };
    assert!(
        (300 * nodes..=300 * nodes + extra).contains(&client_calls),
        "{client_calls} calls in three rounds of 10,000 locks: 100 per node and round"
    );
    // Rounds come once per period (1 s), not faster.
    assert!(elapsed >= Duration::from_millis(1900), "{elapsed:?}");
    // Every lock is still alive.
    for name in ["many-0", "many-5000", "many-9999"] {
        let ttl: i64 = query(&mut raw, &["PTTL", &lock_key(name)]).await;
        assert!(ttl > 1000, "{name}: {ttl}");
    }
    for g in guards {
        g.unlock().await.unwrap();
    }
}

#[tokio::test]
async fn renewal_stops_after_the_last_release() {
    let ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(Duration::from_millis(300)).await;
    let mut raw = ctx.raw().await;
    let lock = client.lock("stop").unwrap();
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(client.stats().renew_calls > 0, "renewal while held");
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    assert_eq!(client.stats().held_locks, 0);
    let calls = client.stats().renew_calls;
    tokio::time::sleep(Duration::from_millis(800)).await; // several periods
    assert_eq!(
        client.stats().renew_calls,
        calls,
        "renewal traffic after release"
    );
    let exists: i64 = query(&mut raw, &["EXISTS", &lock_key("stop")]).await;
    assert_eq!(exists, 0, "renewal resurrected the key");
}

#[tokio::test]
async fn a_holder_learns_promptly_that_its_lock_was_deleted() {
    let ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(WATCHDOG).await;
    let mut raw = ctx.raw().await;
    let guard = client.lock("deleted").unwrap().lock().await.unwrap();
    assert!(!guard.is_lost());
    let _: i64 = query(&mut raw, &["DEL", &lock_key("deleted")]).await;
    tokio::time::timeout(WATCHDOG, guard.lost())
        .await
        .expect("loss noticed within one renewal period");
    assert!(guard.is_lost());
    assert_not_held(guard.unlock().await.unwrap_err());
}

#[tokio::test]
async fn a_holder_learns_that_a_redis_restart_lost_its_lock_and_later_locks_renew() {
    let mut ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(WATCHDOG).await;
    let lock = client.lock("restart").unwrap();
    let guard = lock.lock().await.unwrap();
    ctx.server_of("restart").restart(); // no persistence: the lock and the functions are gone
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss noticed after the restart");
    assert_not_held(guard.unlock().await.unwrap_err());

    // A lock taken after the restart is renewed (the function library
    // reloaded when not found). A restarted cluster node serves its slots again only once
    // it has rejoined: until then the client answers a retryable error.
    assert!(lockable_within(&lock, Duration::from_secs(10)).await);
    let guard = lock.lock().await.unwrap();
    tokio::time::sleep(WATCHDOG * 3).await;
    assert!(lock.is_held_by_me().await.unwrap());
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn renewal_survives_a_function_flush() {
    let ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(WATCHDOG).await;
    let mut raw = ctx.raw().await;
    let lock = client.lock("flushed").unwrap();
    let guard = lock.lock().await.unwrap();
    let _: String = query(&mut raw, &["FUNCTION", "FLUSH"]).await;
    tokio::time::sleep(WATCHDOG * 3).await;
    assert!(lock.is_held_by_me().await.unwrap());
    assert!(!guard.is_lost());
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_holder_learns_that_its_lease_ran_out_while_redis_was_paused() {
    let mut ctx = Ctx::new();
    let client = ctx
        .client_with(
            Settings::default()
                .set_watchdog_timeout(Duration::from_millis(600))
                .set_response_timeout(Duration::from_millis(300)),
        )
        .await;
    let guard = client.lock("paused").unwrap().lock().await.unwrap();
    let server = ctx.server_of("paused");
    server.pause();
    tokio::time::sleep(Duration::from_millis(1500)).await; // > lease, renewals time out
    server.resume();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("loss noticed after the pause");
    assert_not_held(guard.unlock().await.unwrap_err());
}

/// The name of hasp's batch function on the servers (`FUNCTION LIST`).
async fn batch_function(raw: &mut Raw) -> String {
    let libraries: Vec<redis::Value> = query(raw, &["FUNCTION", "LIST"]).await;
    let text = format!("{libraries:?}");
    let start = text.find("hasp_").expect("hasp's library is loaded");
    text[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// A renewal racing its own release (as reported against Redisson): a
/// renewal of a released hold that reaches Redis after its owner took the
/// lock again must not re-arm the new hold's lease (here: stretch a 2 s
/// lease to the watchdog's, or cut it short). The renewal is sent as the
/// watchdog sends it, with the released hold's token, straight to the
/// batch function, so the race is not left to chance.
#[tokio::test]
async fn a_renewal_of_a_released_hold_does_not_touch_the_owners_next_hold() {
    let ctx = Ctx::new();
    let client = ctx.client().await;
    let owner = hasp::Owner::new();
    let lock = client.lock("renew-race").unwrap().with_owner(owner.clone());
    let first = lock.lock().await.unwrap();
    let released = first.fencing_token();
    first.unlock().await.unwrap();
    let leased = lock.clone().with_lease(Duration::from_secs(2)).unwrap();
    let second = leased.lock().await.unwrap();
    assert!(second.fencing_token() > released);

    let mut raw = ctx.raw().await;
    let function = batch_function(&mut raw).await;
    let key = lock_key("renew-race");
    let renew = |token: u64| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&function)
            .arg(1)
            .arg(&key)
            .arg(client.id())
            .arg("e")
            .arg(owner.id())
            .arg(30_000)
            .arg(token);
        cmd
    };
    let late: Vec<i64> = renew(released).query_async(&mut raw).await.unwrap();
    assert_eq!(late, [0], "a renewal of the released hold was applied");
    let ttl: i64 = query(&mut raw, &["PTTL", &key]).await;
    assert!(
        ttl > 0 && ttl <= 2_000,
        "the new hold's lease became {ttl} ms"
    );
    assert!(!second.is_lost());
    // The new hold's own renewal is applied.
    let own: Vec<i64> = renew(second.fencing_token())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(own, [1]);
    second.unlock().await.unwrap();
}

/// A loss signal racing a re-acquisition (as reported against
/// redis-semaphore): a hold that ran out is signalled lost, and the hold
/// its owner takes again afterwards is not, also when every hold is
/// checked at once after the client's connections were closed.
#[tokio::test]
async fn the_loss_of_an_old_hold_is_not_signalled_on_the_owners_new_hold() {
    let ctx = Ctx::new();
    let client = ctx.fast_watchdog_client(WATCHDOG).await;
    let owner = hasp::Owner::new();
    let lock = client.lock("lost-race").unwrap().with_owner(owner);
    let old = lock
        .clone()
        .with_lease(Duration::from_millis(150))
        .unwrap()
        .lock()
        .await
        .unwrap();
    old.lost().await;
    let new = lock.lock_within(Duration::from_secs(10)).await.unwrap();
    assert_ne!(new.fencing_token(), old.fencing_token());
    // Every hold checked at once, and several renewal rounds.
    for url in ctx.control_urls() {
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal") // not this connection: SKIPME is on by default
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let signalled = tokio::time::timeout(WATCHDOG * 3, new.lost()).await;
    assert!(signalled.is_err(), "the new hold was signalled lost");
    assert!(!new.is_lost());
    assert!(old.is_lost());
    assert!(lock.is_held_by_me().await.unwrap());
    new.unlock().await.unwrap();
    assert_not_held(old.unlock().await.unwrap_err());
}
