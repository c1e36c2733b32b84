//! Faults 10–17: each fault of the harness and its expected outcome.

use std::time::{Duration, Instant};

use hasp::{Client, Settings};
use testkit::{now_us, Direction, Event, FaultProxy, History, Mode, RedisServer, ServerOptions};

use crate::bounded;
use crate::child::{belief_end_us, ChildProcess};
use crate::helpers::*;

/// Faults 10: a holder process killed with SIGKILL frees its lock
/// within one lease (fixed lease; the watchdog case is in the spec suite).
#[tokio::test]
async fn a_killed_holder_with_a_lease_frees_the_lock_within_the_lease() {
    bounded(Duration::from_secs(15), async {
        let ctx = Ctx::new();
        let history = History::default();
        let mut child = ChildProcess::spawn(
            "hold",
            &[
                ("HASP_CHILD_URL", ctx.server().url()),
                ("HASP_CHILD_LOCK", "killed".into()),
                ("HASP_CHILD_LEASE_MS", "1000".into()),
            ],
            &history,
        );
        child.line("HELD", Duration::from_secs(5)).await;
        child.kill();
        let killed = Instant::now();
        let lock = ctx.client().await.lock("killed").unwrap();
        let guard = lock.lock_within(Duration::from_secs(5)).await.unwrap();
        let after = killed.elapsed();
        println!("figure: holder SIGKILLed, lease 1 s: taken over after {after:?}");
        // Within the lease, with slack for a loaded machine.
        assert!(after <= Duration::from_millis(1000 + 1500), "{after:?}");
        guard.unlock().await.unwrap();
    })
    .await;
}

/// Faults 13: Redis restarted with AOF `always` while a lock is held
/// and another client waits: the hold survives with its lease (no loss
/// reported), and the waiter gets the lock after the release.
#[tokio::test]
async fn with_aof_always_a_restart_loses_nothing() {
    bounded(Duration::from_secs(15), async {
        let mut server = RedisServer::start_with(ServerOptions::default().with_aof("always"));
        let settings = Settings::default()
            .set_watchdog_timeout(Duration::from_millis(1500))
            .set_response_timeout(Duration::from_millis(500));
        let holder = Client::open_with(&server.url(), settings.clone())
            .await
            .unwrap();
        let waiter = Client::open_with(&server.url(), settings).await.unwrap();
        let lock = holder.lock("durable").unwrap();
        let guard = lock.lock().await.unwrap();
        let token = guard.fencing_token();
        let waiting = tokio::spawn(async move {
            let lock = waiter.lock("durable").unwrap();
            let guard = lock.lock_within(Duration::from_secs(10)).await.unwrap();
            let got = (guard.fencing_token(), Instant::now());
            guard.unlock().await.unwrap();
            got
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        server.restart();
        tokio::time::sleep(Duration::from_millis(1500)).await; // renewals go on
        assert!(!guard.is_lost());
        assert!(lock.is_held_by_me().await.unwrap());
        let released = Instant::now();
        guard.unlock().await.unwrap();
        let (next, acquired) = waiting.await.unwrap();
        assert!(next > token);
        let waited = acquired.saturating_duration_since(released);
        println!(
            "figure: AOF always restart: hold kept, waiter got it {waited:?} after the release"
        );
        // Woken by the release, not by the lease (30 s) running out.
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    })
    .await;
}

/// Faults 14: a holder cut off (proxy black-hole) for longer than its
/// lease learns of the loss no later than its belief end, which comes
/// before another client can take the lock: the two beliefs do not overlap.
#[tokio::test]
async fn a_partitioned_holder_stops_believing_before_another_takes_over() {
    bounded(Duration::from_secs(15), async {
        let ctx = Ctx::new();
        let (proxy, cut) = crate::through_proxy(&ctx, Duration::from_millis(900)).await;
        let history = History::default();
        let guard = cut.lock("split").unwrap().lock().await.unwrap();
        history.push(Event::Acquired {
            holder: "cut".into(),
            token: guard.fencing_token(),
            at: now_us(),
        });
        proxy.set(Direction::Both, Mode::BlackHole);
        let other = ctx.client().await.lock("split").unwrap();
        let (taken, ()) = tokio::join!(other.lock_within(Duration::from_secs(5)), guard.lost());
        let taken = taken.unwrap();
        history.push(Event::Acquired {
            holder: "other".into(),
            token: taken.fencing_token(),
            at: now_us(),
        });
        history.push(Event::Lost {
            holder: "cut".into(),
            at: belief_end_us(&guard),
        });
        taken.unlock().await.unwrap();
        history.push(Event::Released {
            holder: "other".into(),
            at: now_us(),
        });
        let report = history.check();
        let events = history.events();
        if let (Some(Event::Acquired { at: other_at, .. }), Some(Event::Lost { at: lost_at, .. })) =
            (events.iter().find(|e| matches!(e, Event::Acquired { holder, .. } if holder == "other")),
             events.iter().find(|e| matches!(e, Event::Lost { .. })))
        {
            println!(
                "figure: partition 900 ms watchdog: belief ended {} µs before the other client acquired",
                *other_at as i64 - *lost_at as i64
            );
        }
        assert_eq!(report.overlaps, 0, "{:?}", history.events());
        assert_eq!(report.duplicate_tokens, 0);
    })
    .await;
}

/// Faults 15: Redis blocked (`DEBUG SLEEP`) for less than the lease:
/// nothing is lost and operations resume.
#[tokio::test]
async fn a_redis_pause_shorter_than_the_lease_loses_nothing() {
    bounded(Duration::from_secs(15), async {
        let ctx = Ctx::new();
        let client = ctx
            .client_with(
                Settings::default()
                    .set_watchdog_timeout(Duration::from_millis(2400))
                    .set_response_timeout(Duration::from_secs(2)),
            )
            .await;
        let lock = client.lock("nap").unwrap();
        let guard = lock.lock().await.unwrap();
        let napping = {
            let args = ctx.server().cli_args();
            tokio::task::spawn_blocking(move || {
                std::process::Command::new("redis-cli")
                    .args(args)
                    .args(["DEBUG", "SLEEP", "0.5"])
                    .output()
                    .unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let other = ctx.client().await.lock("nap").unwrap();
        assert!(other.try_lock().await.unwrap().is_none());
        napping.await.unwrap();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!guard.is_lost());
        assert!(lock.is_held_by_me().await.unwrap());
        guard.unlock().await.unwrap();
    })
    .await;
}

/// Faults 15: every client's commands held (`CLIENT PAUSE`) for less
/// than the lease: renewals wait and go through, nothing is lost, and a
/// release made meanwhile takes effect when the pause ends.
#[tokio::test]
async fn a_client_pause_shorter_than_the_lease_loses_nothing() {
    bounded(Duration::from_secs(15), async {
        let ctx = Ctx::new();
        let client = ctx
            .client_with(
                Settings::default()
                    .set_watchdog_timeout(Duration::from_millis(1500))
                    .set_response_timeout(Duration::from_secs(2)),
            )
            .await;
        let lock = client.lock("held-up").unwrap();
        let guard = lock.lock().await.unwrap();
        ctx.server().client_pause(700); // past a renewal period (500 ms)
        let paused = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        guard.unlock().await.unwrap(); // waits out the pause
        assert!(paused.elapsed() >= Duration::from_millis(600));
        let other = ctx.client().await.lock("held-up").unwrap();
        assert!(other.try_lock().await.unwrap().is_some());
        assert!(!lock.is_held_by_me().await.unwrap());
    })
    .await;
}

/// Faults 15 (and 12): Redis blocked for longer than the lease: the
/// key expires meanwhile (Redis's clock runs on), the holder learns of the
/// loss, and another owner can take the lock.
#[tokio::test]
async fn a_redis_pause_longer_than_the_lease_is_a_loss() {
    bounded(Duration::from_secs(15), async {
        let ctx = Ctx::new();
        let client = ctx.fast_watchdog_client(Duration::from_millis(600)).await;
        let guard = client.lock("long-nap").unwrap().lock().await.unwrap();
        let args = ctx.server().cli_args();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("redis-cli")
                .args(args)
                .args(["DEBUG", "SLEEP", "1.2"])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(2), guard.lost())
            .await
            .expect("the loss is noticed");
        let other = ctx.client().await.lock("long-nap").unwrap();
        assert!(lockable_within(&other, Duration::from_secs(2)).await);
        assert_not_held(guard.unlock().await.unwrap_err());
    })
    .await;
}

/// Faults 17: with the pub/sub connection killed while tasks wait, the
/// waiters still get the lock soon after the release (they re-subscribe and
/// are woken), not when the holder's 30 s lease would have run out.
#[tokio::test]
async fn waiters_whose_pubsub_connection_was_killed_still_get_the_release() {
    bounded(Duration::from_secs(15), async {
        let ctx = Ctx::new();
        let holder = ctx.client().await; // watchdog 30 s
        let waiting = ctx.client().await;
        let guard = holder.lock("subscribed").unwrap().lock().await.unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let lock = waiting.lock("subscribed").unwrap();
                tokio::spawn(async move {
                    let guard = lock.lock_within(Duration::from_secs(10)).await.unwrap();
                    let at = Instant::now();
                    guard.unlock().await.unwrap();
                    at
                })
            })
            .collect();
        let raw = ctx.raw().await;
        let subscribed = testkit::eventually(Duration::from_secs(3), || {
            let mut raw = raw.clone();
            async move { subscribers(&mut raw, &channel("subscribed")).await == 1 }
        })
        .await;
        assert!(subscribed);
        ctx.server().cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        let resubscribed = testkit::eventually(Duration::from_secs(3), || {
            let mut raw = raw.clone();
            async move { subscribers(&mut raw, &channel("subscribed")).await == 1 }
        })
        .await;
        assert!(resubscribed);
        let released = Instant::now();
        guard.unlock().await.unwrap();
        for waiter in waiters {
            let got = waiter.await.unwrap();
            println!(
                "figure: pub/sub killed while waiting: acquired {:?} after the release",
                got.duration_since(released)
            );
            assert!(got.duration_since(released) < Duration::from_secs(2));
        }
        let left = testkit::eventually(Duration::from_secs(3), || {
            let mut raw = raw.clone();
            async move { subscribers(&mut raw, &channel("subscribed")).await == 0 }
        })
        .await;
        assert!(left, "no subscription left behind");
    })
    .await;
}

/// One failover (faults 16): `names` locks acquired on a master whose
/// replication stream is held back, the master killed, the replica
/// promoted; returns (acquisitions the first client believes it has,
/// duplicates: of those, how many a second client then takes on the
/// promoted replica).
async fn failover(replica_ack: Option<Duration>, names: usize) -> (usize, usize) {
    let mut master = RedisServer::start_tcp();
    let link = FaultProxy::start(&master); // the replication stream
    let replica = RedisServer::start_with(ServerOptions {
        transport: testkit::Transport::Tcp,
        replica_of: Some(link.port()),
        ..ServerOptions::default()
    });
    let linked = testkit::eventually(Duration::from_secs(10), || {
        let up = replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up");
        async move { up }
    })
    .await;
    assert!(linked, "the replica never linked");
    let mut settings = Settings::default();
    if let Some(timeout) = replica_ack {
        settings = settings.set_replica_ack(1, timeout);
    }
    let first = Client::open_with(&master.url(), settings).await.unwrap();
    let warm = first.lock("warm").unwrap();
    warm.lock().await.unwrap().unlock().await.unwrap();

    link.set(Direction::ToClient, Mode::BlackHole); // the replica lags
    let locks: Vec<_> = (0..names)
        .map(|i| first.lock(&format!("dup-{i}")).unwrap())
        .collect();
    let results = futures_util::future::join_all(locks.iter().map(|l| l.try_lock())).await;
    let mut believed = Vec::new();
    for (i, result) in results.into_iter().enumerate() {
        match result {
            Ok(Some(guard)) => believed.push((i, guard)),
            Err(hasp::Error::NotReplicated {
                acked: 0,
                wanted: 1,
            }) => {}
            other => panic!("unexpected outcome: {other:?}"),
        }
    }
    master.kill();
    link.close_all();
    replica.cli(&["REPLICAOF", "NO", "ONE"]);
    let second = Client::open(&replica.url()).await.unwrap();
    let mut duplicates = 0;
    for (i, _guard) in &believed {
        let lock = second.lock(&format!("dup-{i}")).unwrap();
        if let Some(guard) = lock.try_lock().await.unwrap() {
            duplicates += 1;
            guard.unlock().await.unwrap();
        }
    }
    (believed.len(), duplicates)
}

/// Faults 16: master killed right after acquisitions its replica had
/// not received, replica promoted. Without replica acknowledgement every
/// such acquisition has a duplicate holder; with `set_replica_ack(1, 100
/// ms)` none is believed, so none is duplicated. (Latency cost: see the
/// lock benchmark's `wait` section.)
#[tokio::test]
async fn replica_acknowledgement_prevents_duplicate_holders_after_a_failover() {
    bounded(Duration::from_secs(40), async {
        let (believed, duplicates) = failover(None, 20).await;
        println!("without replica ack: {believed} believed, {duplicates} duplicated");
        assert_eq!(believed, 20);
        assert_eq!(duplicates, 20, "asynchronous replication lost them all");
        let (believed, duplicates) = failover(Some(Duration::from_millis(100)), 20).await;
        println!("with replica ack: {believed} believed, {duplicates} duplicated");
        assert_eq!((believed, duplicates), (0, 0));
    })
    .await;
}

/// Faults 16: with a healthy replica, acquisitions and renewals are
/// confirmed and work as usual.
#[tokio::test]
async fn with_a_healthy_replica_acknowledged_locks_work_as_usual() {
    bounded(Duration::from_secs(20), async {
        let master = RedisServer::start_tcp();
        let _replica = RedisServer::start_replica_of(&master);
        let client = Client::open_with(
            &master.url(),
            Settings::default()
                .set_watchdog_timeout(Duration::from_millis(900))
                .set_replica_ack(1, Duration::from_millis(200)),
        )
        .await
        .unwrap();
        let lock = client.lock("replicated").unwrap();
        let guard = lock.lock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(2000)).await; // renewals
        assert!(!guard.is_lost());
        let waiter = {
            let lock = lock.clone().with_owner(hasp::Owner::new());
            tokio::spawn(async move { lock.lock_within(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        guard.unlock().await.unwrap();
        waiter.await.unwrap().unwrap().unlock().await.unwrap();
    })
    .await;
}

/// With replica acknowledgement, an acquisition too few replicas confirmed
/// is undone, and a caller that waits tries again while its wait lasts:
/// right after a replica attaches (the master counts it only once it
/// acknowledges, within about a second) `lock_within` still gets the lock.
/// The error comes when the wait runs out, not before nor a try's
/// time-out after (lock 10); a single try answers it at once.
#[tokio::test]
async fn an_unconfirmed_acquisition_is_tried_again_while_the_wait_lasts() {
    bounded(Duration::from_secs(60), async {
        let master = RedisServer::start_tcp();
        let settings = Settings::default().set_replica_ack(1, Duration::from_millis(100));
        let client = Client::open_with(&master.url(), settings).await.unwrap();
        let _replica = RedisServer::start_replica_of(&master);
        let lock = client.lock("just-attached").unwrap();
        let guard = lock.lock_within(Duration::from_secs(20)).await.unwrap();
        guard.unlock().await.unwrap();

        // A replica that never confirms: the wait runs out with the error.
        let link_master = RedisServer::start_tcp();
        let link = FaultProxy::start(&link_master);
        let lagging = RedisServer::start_with(ServerOptions {
            transport: testkit::Transport::Tcp,
            replica_of: Some(link.port()),
            ..ServerOptions::default()
        });
        let linked = testkit::eventually(Duration::from_secs(10), || {
            let up = lagging
                .cli(&["INFO", "replication"])
                .contains("master_link_status:up");
            async move { up }
        })
        .await;
        assert!(linked, "the replica never linked");
        link.set(Direction::ToClient, Mode::BlackHole);
        // Redis ends a `WAIT` that timed out at its next timer event, up
        // to 1/hz late (100 ms at the default hz 10): finer here, so that
        // what is measured is when the client's try ends.
        link_master.cli(&["CONFIG", "SET", "hz", "100"]);
        let settings = Settings::default().set_replica_ack(1, Duration::from_millis(100));
        let client = Client::open_with(&link_master.url(), settings)
            .await
            .unwrap();
        let lock = client.lock("never-confirmed").unwrap();
        // Waits that end at different points of a try (each takes the
        // acknowledgement's 100 ms, 50 ms apart).
        for wait in [530, 560, 590, 620].map(Duration::from_millis) {
            let started = Instant::now();
            let outcome = lock.lock_within(wait).await;
            let took = started.elapsed();
            assert!(
                matches!(outcome, Err(hasp::Error::NotReplicated { .. })),
                "{outcome:?}"
            );
            assert!(took >= wait, "gave up after {took:?} of a {wait:?} wait");
            // No try runs past the deadline: the last one's `WAIT` ends
            // by it.
            println!("figure: a {wait:?} wait with replicas that never confirm took {took:?}");
            assert!(
                took < wait + Duration::from_millis(50),
                "gave up {:?} after the deadline",
                took - wait
            );
        }
        assert!(matches!(
            lock.try_lock().await,
            Err(hasp::Error::NotReplicated { .. })
        ));
        let raw = redis::Client::open(link_master.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let undone = testkit::eventually(Duration::from_secs(10), || {
            let mut raw = raw.clone();
            async move {
                let exists: i64 = redis::cmd("EXISTS")
                    .arg(lock_key("never-confirmed"))
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                exists == 0
            }
        })
        .await;
        assert!(undone, "an unconfirmed acquisition is undone");
    })
    .await;
}
