//! Names nobody uses any more leave nothing in Redis: once every lease and
//! documented tombstone has ended, the keys a name used are gone, for
//! every kind (`docs/guarantees.md`, lock 29 and family detail 2).

use std::time::Duration;

use hasp::{AdaptiveLease, Owner, Settings};

use crate::helpers::{query, Ctx};

/// Names per kind: enough that a key left per name cannot hide.
const NAMES: usize = 200;
/// The lease (and watchdog timeout) of every hold below.
const LEASE: Duration = Duration::from_millis(300);

/// Every key on every server of the deployment, counted with `SCAN` (which
/// never returns a key whose expiry has passed, whether or not Redis has
/// reclaimed it yet).
async fn keys(ctx: &Ctx) -> Vec<String> {
    let mut found = Vec::new();
    for url in ctx.control_urls() {
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
        if !matches!(&role[0], redis::Value::BulkString(r) if r == b"master") {
            continue; // a replica's keys are its master's
        }
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .unwrap();
            found.extend(batch);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    found.sort();
    found
}

/// Waits until only `expected` (sorted) is left, and says what was left if
/// it never is. The bound is generous: the leases are 300 ms.
async fn assert_left(ctx: &Ctx, expected: &[String], what: &str) {
    let ok = testkit::eventually(Duration::from_secs(30), || async {
        keys(ctx).await == expected
    })
    .await;
    let left = keys(ctx).await;
    assert!(
        ok,
        "{what}: {} keys left where {} were expected, e.g. {:?}",
        left.len(),
        expected.len(),
        left.iter().take(5).collect::<Vec<_>>()
    );
}

async fn short_lease_client(ctx: &Ctx) -> hasp::Client {
    ctx.client_with(
        Settings::default()
            .set_watchdog_timeout(LEASE)
            .set_response_timeout(Duration::from_secs(5))
            .set_adaptive_lease(
                AdaptiveLease::default()
                    .set_initial(LEASE)
                    .set_min(LEASE)
                    .set_max(LEASE)
                    .set_renew_floor(LEASE / 3)
                    .set_history_ttl(Duration::from_secs(1)),
            ),
    )
    .await
}

/// Locks (watchdog and leased, released and left to expire, re-entered,
/// handed off to a waiter), plain locks, fair locks and adaptive locks:
/// nothing is left of any name.
#[tokio::test]
async fn idle_locks_leave_no_key() {
    let ctx = Ctx::new();
    let client = short_lease_client(&ctx).await;
    for i in 0..NAMES {
        let lock = client.lock(&format!("idle:{i}")).unwrap();
        let guard = lock.lock().await.unwrap();
        match i % 4 {
            0 => guard.unlock().await.unwrap(),
            1 => {
                let again = lock.lock().await.unwrap();
                again.unlock().await.unwrap();
                guard.unlock().await.unwrap();
            }
            2 => {
                // Handed off to a waiter of the same client, then released.
                let other = lock.clone().with_owner(Owner::new());
                let waiter = tokio::spawn(async move { other.lock().await });
                tokio::time::sleep(Duration::from_millis(2)).await;
                guard.unlock().await.unwrap();
                waiter.await.unwrap().unwrap().unlock().await.unwrap();
            }
            _ => {
                // A leased hold that is never released: it runs out.
                let leased = lock.with_lease(LEASE).unwrap();
                drop(guard);
                std::mem::forget(leased.lock().await.unwrap());
            }
        }
        let plain = client.plain_lock(&format!("idle-plain:{i}")).unwrap();
        match i % 3 {
            0 => plain.lock().await.unwrap().unlock().await.unwrap(),
            1 => drop(plain.lock().await.unwrap()), // released in the background
            _ => std::mem::forget(plain.with_lease(LEASE).unwrap().lock().await.unwrap()),
        }
        let fair = client.fair_lock(&format!("idle-fair:{i}")).unwrap();
        fair.lock().await.unwrap().unlock().await.unwrap();
        let adaptive = client
            .lock(&format!("idle-adaptive:{i}"))
            .unwrap()
            .with_adaptive_lease("idle-class")
            .unwrap();
        adaptive.lock().await.unwrap().unlock().await.unwrap();
    }
    assert_left(&ctx, &[], "locks, plain locks, fair locks, adaptive locks").await;
}

/// Read-write locks (reads, writes, a downgrade): nothing is left.
#[tokio::test]
async fn idle_rw_locks_leave_no_key() {
    let ctx = Ctx::new();
    let client = short_lease_client(&ctx).await;
    for i in 0..NAMES {
        let rw = client.rw_lock(&format!("idle-rw:{i}")).unwrap();
        let write = rw.write().await.unwrap();
        if i % 2 == 0 {
            let read = rw.read().await.unwrap();
            write.unlock().await.unwrap();
            read.unlock().await.unwrap();
        } else {
            write.unlock().await.unwrap();
            rw.read().await.unwrap().unlock().await.unwrap();
        }
    }
    assert_left(&ctx, &[], "read-write locks").await;
}

/// Semaphores keep only the capacity a caller set (a capacity set with an
/// expiry goes too); latches keep nothing once completed and their
/// tombstone has ended.
#[tokio::test]
async fn idle_semaphores_and_latches_keep_only_what_was_asked() {
    let ctx = Ctx::new();
    let client = short_lease_client(&ctx).await;
    let mut capacities = Vec::new();
    for i in 0..NAMES {
        let name = format!("idle-sem:{i}");
        let sem = client.semaphore(&name).unwrap().with_lease(LEASE).unwrap();
        if i % 2 == 0 {
            assert!(sem.try_set_capacity(2).await.unwrap());
            capacities.push(format!("{}:sem", crate::helpers::lock_key(&name)));
        } else {
            assert!(sem.try_set_capacity_for(2, LEASE * 2).await.unwrap());
        }
        sem.acquire(1).await.unwrap().release().await.unwrap();
        std::mem::forget(sem.acquire(1).await.unwrap()); // runs out
        let latch = client
            .latch(&format!("idle-latch:{i}"))
            .unwrap()
            .with_tombstone(LEASE)
            .unwrap();
        assert!(latch.try_set_count_for(2, LEASE * 10).await.unwrap());
        latch.count_down_once("a").await.unwrap();
        latch.count_down_once("b").await.unwrap();
    }
    capacities.sort();
    assert_left(&ctx, &capacities, "semaphores and latches").await;

    // What a caller made to stay is still what it was.
    let mut raw = ctx.raw().await;
    let cap: i64 = query(&mut raw, &["HGET", &capacities[0], ":cap"]).await;
    assert_eq!(cap, 2);
}
