//! A client that follows the master of a Sentinel service (multi 20).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hasp::sentinel::{MasterConnection, OnSwitch, Sentinels};
use hasp::{Client, Error};
use testkit::{SentinelGroup, SENTINEL_SERVICE};

use crate::helpers::quick;

async fn sentinel_client(group: &SentinelGroup) -> Client {
    sentinel_client_with(group, quick()).await
}

async fn sentinel_client_with(group: &SentinelGroup, settings: hasp::Settings) -> Client {
    let urls = group.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let settings = settings.set_watchdog_timeout(Duration::from_millis(3_000));
    Client::open_sentinel(&urls, SENTINEL_SERVICE, settings)
        .await
        .expect("open through sentinel")
}

/// multi 20: a client made through Sentinel locks on the current master,
/// follows a failover to the new one (new acquisitions land there), and
/// re-checks the holds it had: a hold the new master has (replicated) stays
/// held, renewed and releasable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_failover() {
    let group = SentinelGroup::start(1, 3);
    let client = sentinel_client(&group).await;
    follows_a_failover(&group, &client).await;
}

/// multi 20 and lock 35: the same over TLS, to the sentinels (`rediss://`)
/// and to the masters they name, trusting a private CA. Every server's
/// certificate names only `redis.sentinel.test`, not the addresses the
/// sentinels announce: the client verifies each by that name, which its
/// settings give, and without it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_failover_over_tls() {
    let dir = std::env::temp_dir().join(format!("hasp-sentinel-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = testkit::TestCa::create(&dir).unwrap();
    let options = ca
        .issue_server_options("named", &["redis.sentinel.test"], false)
        .unwrap();
    let group = SentinelGroup::start_with_tls(1, 3, Some(options));
    assert!(group.urls()[0].starts_with("rediss://"));
    let trust = hasp::Tls::new().with_ca_file(ca.ca_file()).unwrap();
    let urls = group.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let unnamed = quick()
        .set_tls(trust.clone())
        .set_connection_timeout(Duration::from_secs(2));
    let refused = Client::open_sentinel(&urls, SENTINEL_SERVICE, unnamed).await;
    let error = refused.expect_err("verified without the name").to_string();
    assert!(error.contains("not valid for name"), "{error}");

    let named = trust.with_server_name("redis.sentinel.test").unwrap();
    let client = sentinel_client_with(&group, quick().set_tls(named)).await;
    follows_a_failover(&group, &client).await;
    drop(group);
    let _ = std::fs::remove_dir_all(dir);
}

async fn follows_a_failover(group: &SentinelGroup, client: &Client) {
    let lock = client.lock("kept").unwrap();
    let guard = lock.lock().await.unwrap();
    let old_port = group.master_port();
    // The hold reached the replica before the failover.
    assert!(
        testkit::eventually(Duration::from_secs(5), || async {
            group
                .servers
                .iter()
                .filter(|s| s.port() != Some(old_port))
                .all(|s| s.cli(&["EXISTS", "hasp:{kept}"]) == "1")
        })
        .await
    );

    let new_port = group.failover();
    assert_ne!(new_port, old_port);
    // New acquisitions reach the new master within moments (the client
    // moves when a sentinel announces the switch; until then the old master
    // still takes writes, and a write it refuses is a retryable error).
    let other = client.lock("after").unwrap();
    let new_master = group.master();
    let started = Instant::now();
    let moved = loop {
        match other.try_lock().await {
            Ok(Some(g)) if new_master.cli(&["EXISTS", "hasp:{after}"]) == "1" => break g,
            // Taken on the old master before the switch: its release may
            // find it gone (the client moved meanwhile), which is right.
            Ok(Some(g)) => drop(g.unlock().await),
            Err(e) if e.is_retryable() => {}
            other => panic!("unexpected: {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never reached the new master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    moved.unlock().await.unwrap();

    // The replicated hold is still held and renewed on the new master.
    tokio::time::sleep(Duration::from_millis(4_000)).await; // over a lease
    assert!(
        !guard.is_lost(),
        "a replicated hold was lost across the failover"
    );
    assert_eq!(group.master().cli(&["EXISTS", "hasp:{kept}"]), "1");
    guard.unlock().await.unwrap();
    assert_eq!(group.master().cli(&["EXISTS", "hasp:{kept}"]), "0");
}

/// multi 20 and faults 5: a hold the new master does not have (the
/// failover lost it) is found lost after the client moves, and its release
/// reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_the_new_master_lacks_is_reported_lost() {
    let group = SentinelGroup::start(1, 3);
    let client = sentinel_client(&group).await;
    let guard = client.lock("dropped").unwrap().lock().await.unwrap();
    let old_port = group.master_port();
    let replica = group
        .servers
        .iter()
        .find(|s| s.port() != Some(old_port))
        .unwrap();
    assert!(
        testkit::eventually(Duration::from_secs(5), || async {
            replica.cli(&["EXISTS", "hasp:{dropped}"]) == "1"
        })
        .await
    );
    group.failover();
    // What an asynchronous replica could have missed: the key is gone on
    // the new master.
    group.master().cli(&["DEL", "hasp:{dropped}"]);
    // The client moves with its next write (a renewal at the latest).
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lost hold was not reported");
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));
}

/// multi 20: questions to a sentinel share one connection to it, made
/// again (the question asked again) when the sentinel dropped it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_to_a_sentinel_share_one_connection() {
    let group = SentinelGroup::start(0, 1);
    let sentinel = &group.sentinels[0];
    // Each `cli` call is a connection of its own, counted too.
    let received = || -> u64 {
        let stats = sentinel.cli(&["INFO", "stats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("the sentinel's connection count")
    };
    let urls = group.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let sentinels = Sentinels::new(&urls, SENTINEL_SERVICE, None).unwrap();
    let master_port = group.master_port();

    let before = received();
    for _ in 0..5 {
        let master = sentinels.master().await.unwrap();
        assert_eq!(
            master.addr().to_string(),
            format!("127.0.0.1:{master_port}")
        );
    }
    // One connection for five questions, and the count's own.
    assert_eq!(received() - before, 2);

    // The sentinel drops every client: the next question finds its
    // connection broken and is asked again on a new one.
    sentinel.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    let before = received();
    sentinels
        .master()
        .await
        .expect("asked again on a new connection");
    sentinels.master().await.unwrap();
    assert_eq!(received() - before, 2);
}

/// multi 20: an application's own connection to the master
/// (`sentinel::MasterConnection`) follows a failover. Its hook sees each
/// master before any command goes there, with the master left; a hook that
/// fails fails the waiting command, and the next command runs it again;
/// the master left is kept until taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_connection_follows_a_failover() {
    let group = SentinelGroup::start(1, 3);
    let urls = group.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let sentinels = Sentinels::new(&urls, SENTINEL_SERVICE, None)
        .unwrap()
        .with_timeout(Duration::from_secs(2));
    let mut conn =
        MasterConnection::connect(sentinels, Duration::from_secs(2), Duration::from_secs(2))
            .await
            .unwrap();
    let address = |port: u16| format!("127.0.0.1:{port}");
    // What the hook saw: (the master left, the new one), and whether the
    // new one held the key `mark` then (no command had gone there yet).
    type Seen = Vec<(Option<String>, String)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let refuse_next = Arc::new(AtomicBool::new(true));
    let hook: OnSwitch = {
        let (seen, refuse_next) = (seen.clone(), refuse_next.clone());
        Arc::new(move |left, new| {
            let (seen, refuse_next) = (seen.clone(), refuse_next.clone());
            Box::pin(async move {
                let mut new_conn = new.clone();
                let marked: bool = redis::cmd("EXISTS")
                    .arg("mark")
                    .query_async(&mut new_conn)
                    .await?;
                assert!(!marked, "a command reached the master before its hook");
                seen.lock().unwrap().push((
                    left.map(|l| l.info().addr().to_string()),
                    new.info().addr().to_string(),
                ));
                if refuse_next.swap(false, Ordering::SeqCst) {
                    return Err(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "refused by the hook",
                    )));
                }
                Ok(())
            })
        })
    };
    conn.on_switch(hook);
    let old_port = group.master_port();
    let set = |conn: &mut MasterConnection| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("SET")
                .arg("mark")
                .arg("1")
                .query_async::<()>(&mut conn)
                .await
        }
    };
    // The hook refuses the current master once: that command fails and
    // nothing reaches the server; the next runs the hook again.
    let refused = set(&mut conn).await.unwrap_err();
    assert!(
        refused.to_string().contains("refused by the hook"),
        "{refused}"
    );
    assert_eq!(group.master().cli(&["EXISTS", "mark"]), "0");
    set(&mut conn).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        [(None, address(old_port)), (None, address(old_port))]
    );
    assert!(conn.take_left_master().is_none());
    group.master().cli(&["DEL", "mark"]);

    let new_port = group.failover();
    assert_ne!(new_port, old_port);
    // Commands reach the new master within moments; one that fails
    // because the master moved fails, and is not sent again.
    let new_master = group.master();
    let started = Instant::now();
    while new_master.cli(&["EXISTS", "mark"]) != "1" {
        if let Err(e) = set(&mut conn).await {
            assert!(
                e.is_io_error()
                    || e.is_timeout()
                    || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "unexpected: {e}"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reached the new master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(last, (Some(address(old_port)), address(new_port)));
    let left = conn.take_left_master().expect("the master left is kept");
    assert_eq!(left.info().addr().to_string(), address(old_port));
    assert!(conn.take_left_master().is_none(), "taken once");
}

/// A `MasterConnection` refuses a zero timeout before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_connection_checks_its_timeouts() {
    let sentinels = Sentinels::new(&["redis://127.0.0.1:1/"], "svc", None).unwrap();
    for (connect, respond) in [(0, 1), (1, 0)] {
        let result = MasterConnection::connect(
            sentinels.clone(),
            Duration::from_secs(connect),
            Duration::from_secs(respond),
        )
        .await;
        assert!(
            matches!(result, Err(Error::InvalidArgument { .. })),
            "{result:?}"
        );
    }
}

/// Bad input to `open_sentinel` is refused before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_sentinel_checks_its_input() {
    let invalid = |r: Result<Client, Error>| matches!(r, Err(Error::InvalidArgument { .. }));
    assert!(invalid(Client::open_sentinel(&[], "svc", quick()).await));
    assert!(invalid(
        Client::open_sentinel(&["redis://127.0.0.1:1/"], "", quick()).await
    ));
    assert!(invalid(
        Client::open_sentinel(&["not a url"], "svc", quick()).await
    ));
}
