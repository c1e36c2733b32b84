//! The database lock against real PostgreSQL, MariaDB and SQLite: the
//! "Table lock" section of `docs/guarantees.md` (cited as "table N") and
//! the lock lines as far as they apply, each scenario on each backend, plus a holder process
//! killed with SIGKILL and a PostgreSQL restart.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasp_sql::Owner;
use hasp_sql::{Error, SqlClient, SqlSettings};
use testkit::{MariaDbServer, PostgresServer};

/// A private SQLite file, removed afterwards.
struct SqliteFile(std::path::PathBuf);

impl SqliteFile {
    fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        Self(std::env::temp_dir().join(format!("hasp-sql-{}-{n}.db", std::process::id())))
    }

    fn url(&self) -> String {
        format!("sqlite://{}?mode=rwc", self.0.display())
    }
}

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

async fn client(url: &str, settings: SqlSettings) -> SqlClient {
    let client = SqlClient::open(url, settings).await.expect("open");
    client.migrate().await.expect("migrate");
    client
}

/// Two clients of the database at `url`, default settings.
async fn two_clients(url: &str) -> (SqlClient, SqlClient) {
    (
        client(url, SqlSettings::default()).await,
        client(url, SqlSettings::default()).await,
    )
}

/// Every scenario, in turn, on the database at `url`.
async fn scenarios(url: &str) {
    migrations_are_idempotent_and_the_table_is_the_users(url).await;
    one_owner_at_a_time_reentrant_and_fenced(url).await;
    expiry_is_the_databases_and_a_late_release_is_not_held(url).await;
    waits_are_bounded_and_woken(url).await;
    a_waiter_reads_a_held_row_and_writes_once_it_looks_free(url).await;
    a_burst_of_waiters_in_one_client_writes_once(url).await;
    an_exact_count_under_contention(url).await;
    the_watchdog_keeps_a_hold_and_a_taken_row_fires_the_loss(url).await;
    names_are_exact(url).await;
    counts_ttl_and_force(url).await;
    a_cancelled_wait_leaves_nothing_held(url).await;
    many_holds_are_renewed_in_batches(url).await;
}

/// Lock 3, 5, 8, 9 and 12 on a table: the hold count 0 → 1 → 2 → 1 → 0;
/// "held by me" only for the owner; the remaining TTL is about the lease
/// and a re-entry re-arms it; force-unlock frees it and wakes a waiter.
async fn counts_ttl_and_force(url: &str) {
    let c = client(url, SqlSettings::default()).await;
    let me = c
        .lock("counted")
        .unwrap()
        .with_owner(Owner::new())
        .with_lease(Duration::from_secs(10))
        .unwrap();
    let other = c.lock("counted").unwrap().with_owner(Owner::new());
    assert_eq!(me.hold_count().await.unwrap(), 0);
    assert_eq!(me.remaining_ttl().await.unwrap(), None);
    let first = me.lock().await.unwrap();
    assert_eq!(me.hold_count().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = me.lock().await.unwrap();
    assert_eq!(me.hold_count().await.unwrap(), 2);
    let ttl = me.remaining_ttl().await.unwrap().expect("held");
    assert!(
        ttl > Duration::from_millis(9500),
        "a re-entry re-arms: {ttl:?}"
    );
    assert!(me.is_held_by_me().await.unwrap());
    assert!(!other.is_held_by_me().await.unwrap());
    second.unlock().await.unwrap();
    assert_eq!(me.hold_count().await.unwrap(), 1);
    first.unlock().await.unwrap();
    assert_eq!(me.hold_count().await.unwrap(), 0);
    assert!(!me.is_held_by_me().await.unwrap());

    let held = me.lock().await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.lock_within(Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(other.force_unlock().await.unwrap());
    let taken = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("woken")
        .unwrap()
        .expect("acquired after the force");
    assert!(taken.fencing_token() > held.fencing_token());
    assert!(matches!(
        held.unlock().await.unwrap_err(),
        Error::NotHeld { .. }
    ));
    assert!(
        other.force_unlock().await.unwrap(),
        "the waiter's hold is freed"
    );
    assert!(matches!(
        taken.unlock().await.unwrap_err(),
        Error::NotHeld { .. }
    ));
    assert!(!other.force_unlock().await.unwrap());
}

/// Lock 13 on a table: a pending acquire that is dropped leaves no lock held.
async fn a_cancelled_wait_leaves_nothing_held(url: &str) {
    let c = client(url, SqlSettings::default()).await;
    let holder = c.lock("cancelled").unwrap().with_owner(Owner::new());
    let guard = holder.lock().await.unwrap();
    let waiter = c.lock("cancelled").unwrap().with_owner(Owner::new());
    let pending = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    pending.abort();
    let _ = pending.await;
    guard.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_locked().await.unwrap(),
        "nothing held after the cancel"
    );
}

/// Lock 15 and 17 on a table: many holds without a lease are renewed, 100 per
/// statement, for several watchdog timeouts; none is lost. The timeout is
/// 2 s: a renewal may come over a second late (SQLite's single writer,
/// behind 250 acquisitions, on a loaded machine) and still be in time.
async fn many_holds_are_renewed_in_batches(url: &str) {
    let settings = SqlSettings::default().set_watchdog_timeout(Duration::from_secs(2));
    let c = client(url, settings).await;
    let owner = Owner::new();
    let mut guards = Vec::new();
    for i in 0..250 {
        let lock = c
            .lock(&format!("many-{i}"))
            .unwrap()
            .with_owner(owner.clone());
        guards.push(lock.lock().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(5_000)).await;
    for guard in &guards {
        assert!(!guard.is_lost(), "{} was lost", guard.name());
    }
    for guard in guards {
        guard.unlock().await.unwrap();
    }
}

/// Table 7: the table is created once (a second run changes nothing), with
/// a name the user chooses; a bad name is refused before any statement.
async fn migrations_are_idempotent_and_the_table_is_the_users(url: &str) {
    let settings = SqlSettings::default().set_table("my_locks");
    let c = client(url, settings.clone()).await;
    c.migrate().await.unwrap();
    let guard = c.lock("m").unwrap().lock().await.unwrap();
    c.migrate().await.unwrap();
    guard.unlock().await.unwrap();
    let err = SqlClient::open(url, SqlSettings::default().set_table("x; drop table y"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}

/// Table 1, 2, 4, 5: one owner at a time; the holder re-enters (the row
/// counts holds); the last release frees it for another owner; tokens grow
/// on every take-over and a re-entry keeps its token.
async fn one_owner_at_a_time_reentrant_and_fenced(url: &str) {
    let (a, b) = two_clients(url).await;
    let mine = a.lock("exclusive").unwrap().with_owner(Owner::new());
    let theirs = b.lock("exclusive").unwrap().with_owner(Owner::new());
    let first = mine.lock().await.unwrap();
    let again = mine.lock().await.unwrap();
    assert_eq!(first.fencing_token(), again.fencing_token());
    assert!(theirs.try_lock().await.unwrap().is_none());
    again.unlock().await.unwrap();
    assert!(theirs.try_lock().await.unwrap().is_none(), "one hold left");
    let token = first.fencing_token();
    first.unlock().await.unwrap();
    assert!(!mine.is_locked().await.unwrap());
    let next = theirs.try_lock().await.unwrap().expect("free");
    assert!(next.fencing_token() > token);
    let next_token = next.fencing_token();
    next.unlock().await.unwrap();
    let third = mine.lock().await.unwrap();
    assert!(third.fencing_token() > next_token);
    third.unlock().await.unwrap();
}

/// Table 3 and 4: a fixed lease ends by the database's clock (another
/// owner gets in after it, not before); the late release of the first
/// holder changes nothing and is `NotHeld`.
async fn expiry_is_the_databases_and_a_late_release_is_not_held(url: &str) {
    let c = client(url, SqlSettings::default()).await;
    let short = c
        .lock("leased")
        .unwrap()
        .with_owner(Owner::new())
        .with_lease(Duration::from_millis(500))
        .unwrap();
    let guard = short.lock().await.unwrap();
    let taken = Instant::now();
    let other = c.lock("leased").unwrap().with_owner(Owner::new());
    let next = other
        .try_lock_for(Duration::from_secs(3))
        .await
        .unwrap()
        .expect("free after the lease");
    let after = taken.elapsed();
    assert!(
        after >= Duration::from_millis(400) && after < Duration::from_millis(1600),
        "{after:?}"
    );
    assert!(guard.is_lost());
    let err = guard.unlock().await.unwrap_err();
    assert!(matches!(err, Error::NotHeld { .. }), "{err:?}");
    assert!(other.is_locked().await.unwrap(), "the new holder kept it");
    next.unlock().await.unwrap();
}

/// Table 6: a bounded wait returns not acquired at its deadline; waiters
/// are woken by a release (NOTIFY on PostgreSQL, back-off elsewhere).
async fn waits_are_bounded_and_woken(url: &str) {
    let (a, b) = two_clients(url).await;
    let holder = a.lock("wait").unwrap().with_owner(Owner::new());
    let guard = holder.lock().await.unwrap();
    let waiter = b.lock("wait").unwrap().with_owner(Owner::new());
    let started = Instant::now();
    assert!(waiter
        .try_lock_for(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(2300),
        "{waited:?}"
    );
    let err = waiter
        .lock_within(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TimedOut { .. }), "{err:?}");

    let task = tokio::spawn(async move {
        let guard = waiter.lock().await.unwrap();
        let at = Instant::now();
        guard.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(700)).await; // backed off to its cap
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let at = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter gets it")
        .unwrap();
    // Woken, or at the latest after one capped back-off (500 ms, jittered
    // up to 750), with slack for a loaded machine: not left to wait on.
    let after = at.saturating_duration_since(released);
    assert!(after < Duration::from_secs(2), "{after:?}");
}

/// Table 6 (waiters retry with back-off), and what that retrying costs
/// the database: a waiter's retry reads the row and sends its acquiring
/// statement (a write, which on SQLite queues behind and in front of every
/// other writer, the holder's renewals included) only once the row looks
/// free. So a waiter that outlives a 1.5 s lease writes twice: its first
/// try and the one that takes the expired row.
async fn a_waiter_reads_a_held_row_and_writes_once_it_looks_free(url: &str) {
    let (a, b) = two_clients(url).await;
    let holder = a
        .lock("probed")
        .unwrap()
        .with_owner(Owner::new())
        .with_lease(Duration::from_millis(1500))
        .unwrap();
    let held = holder.lock().await.unwrap();
    let waiter = b.lock("probed").unwrap().with_owner(Owner::new());
    let before = b.stats();
    let guard = waiter.lock_within(Duration::from_secs(10)).await.unwrap();
    let after = b.stats();
    assert!(guard.fencing_token() > held.fencing_token());
    let (attempts, probes) = (
        after.attempts - before.attempts,
        after.probes - before.probes,
    );
    assert_eq!(attempts, 2, "probes {probes}");
    // PostgreSQL sleeps up to 1 s at a time (it is woken by NOTIFY), the
    // others back off from 5 ms: one probe or more each way.
    assert!(probes >= 1, "{probes}");
    guard.unlock().await.unwrap();
    assert!(matches!(held.unlock().await, Err(Error::NotHeld { .. })));
}

/// Table 6, as above, for a burst (the buyers of one item): tasks of one
/// client that start waiting for a name other tasks of the client already
/// wait for read the row first, so the burst sends one acquiring statement
/// while the row is held, not one per task; all of them get it once it is
/// released.
async fn a_burst_of_waiters_in_one_client_writes_once(url: &str) {
    let (a, b) = two_clients(url).await;
    let held = a
        .lock("burst")
        .unwrap()
        .with_owner(Owner::new())
        .lock()
        .await
        .unwrap();
    let before = b.stats();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let lock = b.lock("burst").unwrap().with_owner(Owner::new());
            tokio::spawn(async move {
                let guard = lock.lock_within(Duration::from_secs(30)).await.unwrap();
                guard.unlock().await.unwrap();
            })
        })
        .collect();
    // Until each of the 8 has looked at the row at least once (all but the
    // first start by reading it).
    let looked = testkit::eventually(Duration::from_secs(20), || async {
        b.stats().probes - before.probes >= 8
    })
    .await;
    assert!(looked, "{:?}", b.stats());
    assert_eq!(b.stats().attempts - before.attempts, 1, "{:?}", b.stats());
    held.unlock().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("every waiter gets it")
            .unwrap();
    }
}

/// Table 2: two clients × eight tasks doing read → yield → write on a shared
/// counter under the lock end with the exact count.
async fn an_exact_count_under_contention(url: &str) {
    let clients = [
        client(url, SqlSettings::default()).await,
        client(url, SqlSettings::default()).await,
    ];
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let lock = clients[t % 2].lock("counter").unwrap();
            let counter = counter.clone();
            tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = lock.lock().await.unwrap();
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    guard.unlock().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("done")
            .unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 160);
}

/// Table 1 (loss signal), lock spec's watchdog lines: a hold without a lease
/// outlives several watchdog timeouts; a row taken behind the holder's back
/// fires its loss signal within a renewal period, also when the taker is
/// the same owner through another client (table 5: a new token).
async fn the_watchdog_keeps_a_hold_and_a_taken_row_fires_the_loss(url: &str) {
    let settings = SqlSettings::default().set_watchdog_timeout(Duration::from_millis(600));
    let c = client(url, settings.clone()).await;
    let lock = c.lock("renewed").unwrap().with_owner(Owner::new());
    let guard = lock.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!guard.is_lost(), "renewed");
    let other = c.lock("renewed").unwrap().with_owner(Owner::new());
    assert!(other.try_lock().await.unwrap().is_none());
    guard.unlock().await.unwrap();

    // The row is expired behind the holder's back: its renewal finds it
    // taken over and fires the loss signal.
    let guard = lock.lock().await.unwrap();
    let stolen = c.lock("renewed").unwrap().with_owner(Owner::new());
    force_expire(url, "renewed").await;
    let stealer = stolen.try_lock().await.unwrap().expect("expired row taken");
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the loss is signalled");
    assert!(matches!(
        guard.unlock().await.unwrap_err(),
        Error::NotHeld { .. }
    ));
    stealer.unlock().await.unwrap();

    // Expired again, and taken by the *same* owner through another client:
    // a new hold with a new token. Renewing that row must not keep the
    // first hold alive (its token is stale).
    let owner = Owner::new();
    let guard = lock.clone().with_owner(owner.clone()).lock().await.unwrap();
    force_expire(url, "renewed").await;
    let second = client(url, settings).await;
    let again = second
        .lock("renewed")
        .unwrap()
        .with_owner(owner)
        .try_lock()
        .await
        .unwrap()
        .expect("expired row taken");
    assert!(again.fencing_token() > guard.fencing_token());
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the stale hold's loss is signalled");
    assert!(!again.is_lost());
    again.unlock().await.unwrap();
}

/// Expires the row of `name` by hand (an operator, or a clock jump).
async fn force_expire(url: &str, name: &str) {
    let sql = "UPDATE hasp_locks SET expires_at = 1 WHERE name = ";
    if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("{sql}$1")))
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
    } else if url.starts_with("mysql") {
        let pool = sqlx::MySqlPool::connect(url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("{sql}?")))
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
    } else {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("{sql}?1")))
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
    }
}

/// Research 3: names are exact on every backend.
async fn names_are_exact(url: &str) {
    let c = client(url, SqlSettings::default()).await;
    let mut guards = Vec::new();
    for name in ["A", "a", "a ", "ａ"] {
        let lock = c.lock(name).unwrap().with_owner(Owner::new());
        guards.push(lock.try_lock().await.unwrap().expect(name));
    }
    for guard in guards {
        guard.unlock().await.unwrap();
    }
    assert!(matches!(c.lock(""), Err(Error::InvalidArgument { .. })));
    assert!(matches!(
        c.lock("n").unwrap().with_lease(Duration::ZERO),
        Err(Error::InvalidArgument { .. })
    ));
}

#[tokio::test]
async fn sqlite() {
    let file = SqliteFile::new();
    scenarios(&file.url()).await;
}

#[tokio::test]
async fn postgres() {
    let server = PostgresServer::start();
    scenarios(&server.url()).await;
}

#[tokio::test]
async fn mariadb() {
    let server = MariaDbServer::start();
    scenarios(&server.url()).await;
}

/// Table 8: a holder process killed with SIGKILL: another owner acquires
/// within one watchdog timeout, on each backend.
#[tokio::test]
async fn a_killed_holder_frees_its_lock_within_one_lease() {
    let file = SqliteFile::new();
    let pg = PostgresServer::start();
    let maria = MariaDbServer::start();
    for url in [file.url(), pg.url(), maria.url()] {
        let c = client(&url, SqlSettings::default()).await;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_holds_until_killed",
                "--ignored",
                "--nocapture",
            ])
            .env("HASP_SQL_CHILD_URL", &url)
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
        assert!(held, "the child took the lock on {url}");
        let lock = c.lock("orphan").unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await; // it renews
        assert!(lock.try_lock().await.unwrap().is_none(), "{url}");
        child.kill().unwrap();
        child.wait().unwrap();
        let killed = Instant::now();
        let guard = lock
            .lock_within(Duration::from_secs(5))
            .await
            .expect("freed after the holder died");
        assert!(
            killed.elapsed() <= Duration::from_millis(900 + 700),
            "{url}"
        );
        guard.unlock().await.unwrap();
    }
}

#[tokio::test]
#[ignore = "helper run in a child process by another test"]
async fn child_holds_until_killed() {
    let Ok(url) = std::env::var("HASP_SQL_CHILD_URL") else {
        return;
    };
    let settings = SqlSettings::default().set_watchdog_timeout(Duration::from_millis(900));
    let c = client(&url, settings).await;
    let guard = c.lock("orphan").unwrap().lock().await.unwrap();
    println!("HELD {}", guard.fencing_token());
    std::future::pending::<()>().await;
}

/// Table 8: a PostgreSQL restart shorter than the lease loses nothing: the
/// row is committed, renewals resume, and nobody else gets in.
#[tokio::test]
async fn a_short_database_restart_loses_nothing() {
    let mut server = PostgresServer::start();
    let url = server.url();
    let settings = SqlSettings::default().set_watchdog_timeout(Duration::from_secs(6));
    let c = client(&url, settings).await;
    let guard = c.lock("durable").unwrap().lock().await.unwrap();
    let token = guard.fencing_token();
    server.stop(false);
    server.try_restart().expect("restart");
    let other = client(&url, SqlSettings::default())
        .await
        .lock("durable")
        .unwrap();
    assert!(other.try_lock().await.unwrap().is_none(), "still held");

    // Lock 14 on a table: with the database down, an acquire is an error, never
    // "not acquired" (and never success).
    server.stop(false);
    let err = other.try_lock().await.unwrap_err();
    assert!(matches!(err, Error::Db(_)), "{err:?}");
    server.try_restart().expect("restart");
    tokio::time::sleep(Duration::from_secs(5)).await; // a renewal after the restart
    assert!(!guard.is_lost());
    assert!(other.try_lock().await.unwrap().is_none());
    guard.unlock().await.unwrap();
    let next = other.try_lock().await.unwrap().expect("free");
    assert!(next.fencing_token() > token);
    next.unlock().await.unwrap();
}
