//! RedLock: a majority of N independent servers (multi 10–16).

use std::time::{Duration, Instant};

use hasp::{Client, Error, Owner, RedLock};
use testkit::{Direction, Mode};

use crate::helpers::{quick, Servers};

/// multi 10: acquire succeeds with a majority (3 of 5 free), and when it
/// fails (3 of 5 held by another owner) nothing of this owner is left on
/// any server. Fewer than 3 servers, or a quorum below the majority, is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_acquires_and_a_failure_leaves_nothing() {
    let servers = Servers::start(5);
    let clients = servers.clients(quick()).await;
    let other = Owner::new();
    let blockers: Vec<_> = futures_util::future::join_all(clients[..2].iter().map(|c| async {
        c.lock("m")
            .unwrap()
            .with_owner(other.clone())
            .lock()
            .await
            .unwrap()
    }))
    .await;
    let lock = RedLock::new("m", &clients).unwrap();
    assert_eq!(lock.quorum(), 3);
    let guard = lock.try_lock().await.unwrap().expect("3 of 5 are free");
    assert_eq!(guard.fencing().parts().len(), 3);
    guard.unlock().await.unwrap();

    let third = clients[2].lock("m").unwrap().with_owner(other.clone());
    let blocker = third.lock().await.unwrap();
    assert!(lock.try_lock().await.unwrap().is_none());
    assert!(
        servers
            .gone_everywhere_but_held_by(&[0, 1, 2], "m", Duration::from_secs(2))
            .await,
        "a key of the failed acquire was left"
    );
    blocker.unlock().await.unwrap();
    for b in blockers {
        b.unlock().await.unwrap();
    }

    assert!(matches!(
        RedLock::new("m", &clients[..2]),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(lock.with_quorum(2).is_err());
    assert!(lock.with_quorum(6).is_err());
    assert_eq!(lock.with_quorum(5).unwrap().quorum(), 5);
}

/// multi 11: the validity runs on the monotonic clock from before the
/// first request: the guard's validity end is the send time + lease −
/// drift, and the loss signal fires when it passes unextended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_validity_ends_on_time_without_extension() {
    let servers = Servers::start(3);
    let clients = servers.clients(quick()).await;
    let lease = Duration::from_millis(800);
    let lock = RedLock::new("v", &clients)
        .unwrap()
        .with_lease(lease)
        .unwrap();
    let drift = Duration::from_millis(8 + 2);
    let before = Instant::now();
    let guard = lock.lock().await.unwrap();
    let after = Instant::now();
    assert!(guard.valid_until() >= before + lease - drift);
    assert!(guard.valid_until() <= after + lease - drift);
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("no loss signal");
    let late = Instant::now().saturating_duration_since(guard.valid_until());
    assert!(guard.is_lost());
    assert!(late < Duration::from_millis(500), "signalled {late:?} late");
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

/// multi 12: requests go to all servers at once with a per-server timeout
/// much smaller than the lease: one paused server of five costs that
/// timeout, not the client's response timeout; three paused make acquire
/// fail with an error naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_are_asked_at_once_with_a_per_server_timeout() {
    let servers = Servers::start(5);
    let clients = servers.clients(quick()).await;
    let lock = RedLock::new("t", &clients)
        .unwrap()
        .with_server_timeout(Duration::from_millis(100))
        .unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    servers.servers[4].pause();
    let started = Instant::now();
    let guard = lock.try_lock().await.unwrap().expect("4 of 5 answer");
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    guard.unlock().await.unwrap();

    servers.servers[2].pause();
    servers.servers[3].pause();
    let started = Instant::now();
    match lock.try_lock().await {
        Err(Error::ServersFailed {
            servers: failed, ..
        }) => assert_eq!(failed.len(), 3),
        other => panic!("expected ServersFailed, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    for i in 2..5 {
        servers.servers[i].resume();
    }
    assert!(servers.gone_everywhere("t", Duration::from_secs(3)).await);
}

/// multi 13: retries wait a random delay, cut short by a release message:
/// with a 2 s retry delay, a waiter gets the lock soon after the holder
/// releases; a bounded wait is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_jittered_and_woken_by_releases() {
    let servers = Servers::start(3);
    let clients = servers.clients(quick()).await;
    let lock = RedLock::new("j", &clients)
        .unwrap()
        .with_retry_delay(Duration::from_secs(2))
        .unwrap();
    let holder = lock.with_owner(Owner::new());
    let held = holder.lock().await.unwrap();

    let started = Instant::now();
    assert!(lock
        .try_lock_for(Duration::from_millis(700))
        .await
        .unwrap()
        .is_none());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_millis(1_000),
        "{waited:?}"
    );
    let timed_out = lock.lock_within(Duration::from_millis(50)).await;
    assert!(
        matches!(&timed_out, Err(hasp::Error::TimedOut { name, .. }) if name == "j"),
        "{:?}",
        timed_out.map(|_| ())
    );

    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let guard = lock.lock().await.unwrap();
            let at = Instant::now();
            guard.unlock().await.unwrap();
            at
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    held.unlock().await.unwrap();
    let after = waiter.await.unwrap().duration_since(released);
    assert!(
        after < Duration::from_millis(600),
        "woken {after:?} after the release"
    );
}

/// multi 14: the lock renews itself while a majority extends; when a
/// majority is gone (3 of 5 killed) the extension fails, the loss is
/// signalled and the keys left (a minority) are released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_needs_a_majority() {
    let mut servers = Servers::start(5);
    let settings = quick().set_watchdog_timeout(Duration::from_millis(900));
    let clients = servers.clients(settings).await;
    let lock = RedLock::new("x", &clients)
        .unwrap()
        .with_server_timeout(Duration::from_millis(100))
        .unwrap();
    let guard = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(!guard.is_lost());
    assert_eq!(servers.holding("x"), 5);

    for i in 2..5 {
        servers.servers[i].kill();
    }
    let killed = Instant::now();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("no loss signal");
    assert!(
        killed.elapsed() < Duration::from_millis(1_500),
        "{:?}",
        killed.elapsed()
    );
    assert!(
        testkit::eventually(Duration::from_secs(2), || async {
            !servers.exists(0, "x") && !servers.exists(1, "x")
        })
        .await,
        "the minority's keys were not released"
    );
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

/// multi 15: with five servers, a client cut off from two acquires and
/// extends; cut off from three it cannot; two clients on opposite sides of
/// a 2/3 partition never both hold the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_lets_only_the_majority_side_hold() {
    let servers = Servers::start(5);
    // A server's answer gets 300 ms, a lease 1.5 s: beside two CPU hogs a
    // reachable server once took longer than 100 ms, and the majority side
    // failed to acquire.
    let settings = quick().set_watchdog_timeout(Duration::from_millis(1_500));
    let (proxies_x, clients_x) = servers.proxied_clients(settings.clone()).await;
    let (proxies_y, clients_y) = servers.proxied_clients(settings).await;
    let timeout = Duration::from_millis(300);
    let x = RedLock::new("p", &clients_x)
        .unwrap()
        .with_server_timeout(timeout)
        .unwrap();
    let y = RedLock::new("p", &clients_y)
        .unwrap()
        .with_server_timeout(timeout)
        .unwrap();
    x.lock().await.unwrap().unlock().await.unwrap();
    y.lock().await.unwrap().unlock().await.unwrap();

    // X reaches servers 0 and 1 only; Y reaches 2, 3 and 4.
    for proxy in &proxies_x[2..] {
        proxy.set(Direction::Both, Mode::BlackHole);
    }
    for proxy in &proxies_y[..2] {
        proxy.set(Direction::Both, Mode::BlackHole);
    }
    assert!(x.try_lock().await.is_err(), "the minority side acquired");
    let guard = y
        .try_lock()
        .await
        .unwrap()
        .expect("the majority side acquires");
    tokio::time::sleep(Duration::from_millis(2_000)).await; // extended across
    assert!(!guard.is_lost());
    assert!(x.try_lock().await.is_err());
    guard.unlock().await.unwrap();
    for p in proxies_x.iter().chain(&proxies_y) {
        p.set(Direction::Both, Mode::Pass);
    }
    drop((clients_x, clients_y));
}

/// multi 16: the limits, shown: two of three servers restarted without
/// persistence forget a held lock and a second owner gets it — but its
/// fencing vector supersedes the first holder's, so a fenced resource
/// refuses the stale holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_is_caught_by_fencing() {
    let mut servers = Servers::start(3);
    let clients: Vec<Client> = servers.clients(quick()).await;
    let lock = RedLock::new("r", &clients)
        .unwrap()
        .with_lease(Duration::from_secs(30))
        .unwrap();
    let first = lock.with_owner(Owner::new()).lock().await.unwrap();
    servers.servers[0].restart();
    servers.servers[1].restart();
    let second = testkit::eventually(Duration::from_secs(5), || async {
        matches!(lock.with_owner(Owner::new()).try_lock().await, Ok(Some(_)))
    })
    .await;
    assert!(
        second,
        "the restarted majority did not grant the lock again"
    );
    let again = lock.with_owner(Owner::new()).lock().await.unwrap();
    assert!(again.fencing().supersedes(first.fencing()));
    assert!(!first.fencing().supersedes(again.fencing()));
    drop(again);
    drop(first);
}

/// multi 14: an extension re-takes the key a restarted
/// server lost, if it is free: a lock held on 5 of 5 whose servers are
/// restarted without persistence one at a time, rounds apart, is never
/// lost and ends with its key on all five.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_servers_are_taken_again_by_the_extension() {
    let mut servers = Servers::start(5);
    let settings = quick().set_watchdog_timeout(Duration::from_millis(900));
    let clients = servers.clients(settings).await;
    let lock = RedLock::new("again", &clients)
        .unwrap()
        .with_server_timeout(Duration::from_millis(150))
        .unwrap();
    let guard = lock.lock().await.unwrap();
    for i in 0..5 {
        servers.servers[i].restart();
        assert!(!servers.exists(i, "again"));
        assert!(
            testkit::eventually(Duration::from_secs(3), || async {
                servers.exists(i, "again")
            })
            .await,
            "server {i}'s key was not taken again"
        );
        assert!(!guard.is_lost(), "lost after restarting server {i}");
    }
    assert_eq!(servers.holding("again"), 5);
    guard.unlock().await.unwrap();
    assert_eq!(servers.holding("again"), 0);
}

/// multi 11: a holder cut off from every server learns
/// of the loss by its validity end at the latest (sooner if an extension
/// round fails first), with no server reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_from_every_server_learns_at_the_validity_end() {
    let servers = Servers::start(3);
    let settings = quick().set_watchdog_timeout(Duration::from_millis(900));
    let (proxies, clients) = servers.proxied_clients(settings).await;
    let lock = RedLock::new("cut", &clients)
        .unwrap()
        .with_server_timeout(Duration::from_millis(100))
        .unwrap();
    let guard = lock.lock().await.unwrap();
    for proxy in &proxies {
        proxy.set(Direction::Both, Mode::BlackHole);
    }
    let cut = Instant::now();
    let deadline = guard.valid_until();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("no loss signal while cut off");
    let now = Instant::now();
    assert!(
        now.saturating_duration_since(deadline) < Duration::from_millis(300),
        "signalled {:?} after the validity end",
        now.saturating_duration_since(deadline)
    );
    assert!(
        cut.elapsed() < Duration::from_millis(1_200),
        "{:?}",
        cut.elapsed()
    );
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

/// Bad input to either kind gets a clear error before any Redis call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_before_any_call() {
    let servers = Servers::start(3);
    let clients = servers.clients(quick()).await;
    let invalid = |r: Result<_, Error>| matches!(r, Err(Error::InvalidArgument { .. }));

    assert!(invalid(RedLock::new("", &clients).map(|_| ())));
    let lock = RedLock::new("in", &clients).unwrap();
    assert!(invalid(lock.with_lease(Duration::ZERO).map(|_| ())));
    assert!(invalid(
        lock.with_lease(Duration::from_millis(2)).map(|_| ())
    ));
    assert!(invalid(
        lock.with_lease(Duration::from_secs(u64::MAX)).map(|_| ())
    ));
    assert!(invalid(lock.with_retry_delay(Duration::ZERO).map(|_| ())));
    assert!(invalid(lock.with_min_validity(Duration::ZERO).map(|_| ())));
    assert!(invalid(
        lock.with_server_timeout(Duration::ZERO).map(|_| ())
    ));
    assert!(invalid(
        lock.with_server_timeout(Duration::from_secs(20))
            .map(|_| ())
    ));
    assert!(invalid(lock.try_lock_for(Duration::MAX).await.map(|_| ())));
    // A chosen server timeout is kept by a later lease, or refused with it.
    let chosen = lock
        .with_server_timeout(Duration::from_millis(400))
        .unwrap();
    assert!(invalid(
        chosen.with_lease(Duration::from_millis(500)).map(|_| ())
    ));
    assert!(chosen.with_lease(Duration::from_secs(2)).is_ok());

    let multi = hasp::MultiLock::new(clients.iter().map(|c| c.lock("in").unwrap())).unwrap();
    assert!(invalid(
        multi.clone().with_lease(Duration::ZERO).map(|_| ())
    ));
    assert!(invalid(
        multi
            .clone()
            .with_server_timeout(Duration::ZERO)
            .map(|_| ())
    ));
    assert!(invalid(multi.try_lock_for(Duration::MAX).await.map(|_| ())));
    assert_eq!(servers.holding("in"), 0);
}
