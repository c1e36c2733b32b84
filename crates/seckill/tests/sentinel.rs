//! The service on a Sentinel service (`docs/guarantees.md`, service 7 and
//! 18): its Redis connection, its locks and its pipeline follow a failover
//! to the new master, and back again; a master sells only once its sale
//! state was verified for the data it holds.

use seckill::testing as support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seckill::auth::Tokens;
use seckill::db::Database;
use seckill::service::Service;
use seckill::settings::Settings;
use seckill::store::{ReplicaAck, SENTINEL_SCHEME};
use serde_json::Value;
use testkit::{SentinelGroup, SENTINEL_SERVICE};

const SECRET: &str = "sentinel-test-secret-001";

/// One purchase's answer.
#[derive(Debug, Clone)]
struct Answer {
    user: i64,
    status: u16,
    order: Option<i64>,
    /// How many master switches the test had made when it was sent.
    switches: usize,
    retry_after: Option<String>,
    body: Value,
}

/// What a sale through master switches came to.
#[derive(Debug)]
struct Run {
    answers: Vec<Answer>,
    /// Accepted orders that never reached the database.
    lost: usize,
    /// Orders the pipeline dead-lettered.
    dead_letters: u64,
    /// Users accepted twice.
    rebought: usize,
    /// Orders stored.
    stored: usize,
    stock: i64,
}

impl Run {
    fn accepted(&self) -> usize {
        self.answers.iter().filter(|a| a.status == 200).count()
    }

    fn assert_every_accepted_order_stored(&self) {
        assert_eq!(self.rebought, 0, "buyers accepted twice");
        assert_eq!(self.dead_letters, 0, "accepted orders the database refused");
        assert_eq!(self.lost, 0, "accepted orders never stored");
    }

    fn figures(&self, what: &str) {
        let codes: BTreeMap<String, usize> = self.answers.iter().filter(|a| a.status != 200).fold(
            Default::default(),
            |mut codes, a| {
                *codes
                    .entry(format!("{} {}", a.status, a.body["code"]))
                    .or_default() += 1;
                codes
            },
        );
        println!(
            "figure: {what}: {} requests, {} accepted, {} stored, {} lost, {} dead letters, \
             {} users accepted twice, stock {}; refusals {codes:?}",
            self.answers.len(),
            self.accepted(),
            self.stored,
            self.lost,
            self.dead_letters,
            self.rebought,
            self.stock,
        );
    }
}

/// How the master moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// `SENTINEL FAILOVER`, the next one once the master left behind follows
    /// the new one (the sentinels demoted it and it synchronised): it holds
    /// the new master's data.
    Failover,
    /// `SENTINEL FAILOVER`, the next one at once: the master left behind may
    /// not have been demoted yet, and holds its own data as it was at the
    /// switch.
    FailoverAtOnce,
    /// The master is killed (SIGKILL) and the sentinels promote the replica
    /// once they agree it is down.
    Kill,
}

/// Two instances sell one voucher of `stock` units on a Sentinel service
/// (one master, one replica (two to kill the master), three sentinels) while the master moves
/// `switches` times by `how` (to the replica, then back, ...), each once
/// purchases have been accepted for a while on the current one. Buyers are
/// new users, and every fifth request is an earlier buyer trying again
/// (which must be refused). Returns once the pipelines have drained.
async fn sell_through_switches(
    stock: i64,
    switches: usize,
    ack: Option<ReplicaAck>,
    how: Move,
) -> Run {
    testkit::logs();
    // A killed master leaves the new one a replica to confirm to only if
    // there were two.
    let replicas = if how == Move::Kill { 2 } else { 1 };
    let mut group = SentinelGroup::start(replicas, 3);
    let hosts: Vec<String> = group
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("{SENTINEL_SCHEME}{}/{SENTINEL_SERVICE}", hosts.join(","));
    let dir = std::env::temp_dir().join(format!(
        "seckill-sentinel-{}-{}-{}-{how:?}",
        std::process::id(),
        switches,
        ack.is_some()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let database = format!("sqlite://{}/shop.db", dir.display());
    let mut services = Vec::new();
    for consumer in ["a", "b"] {
        services.push(
            Service::start(Settings {
                replica_ack: ack,
                consumer: consumer.into(),
                ..support::settings(url.clone(), &database, SECRET)
            })
            .await
            .unwrap(),
        );
    }
    let bases: Arc<Vec<String>> = Arc::new(
        services
            .iter()
            .map(|s| format!("http://{}", s.addr()))
            .collect(),
    );
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let voucher = support::open_voucher(&http, &bases[0], &tokens, "Failover sale", stock).await;

    let stop = Arc::new(AtomicBool::new(false));
    let switched = Arc::new(AtomicUsize::new(0));
    let next_user = Arc::new(AtomicI64::new(1));
    let answers = Arc::new(Mutex::new(Vec::<Answer>::new()));
    let buyers: Vec<_> = (0..8usize)
        .map(|n| {
            let (http, bases, tokens) = (http.clone(), bases.clone(), tokens.clone());
            let (stop, switched, next_user, answers) = (
                stop.clone(),
                switched.clone(),
                next_user.clone(),
                answers.clone(),
            );
            tokio::spawn(async move {
                let mut sent = 0usize;
                let mut mine = Vec::new();
                while !stop.load(Ordering::Acquire) {
                    sent += 1;
                    // Every fifth request: one of this buyer's earlier
                    // accepted users asks again.
                    let user = match (sent % 5, mine.len()) {
                        (0, len) if len > 0 => mine[sent / 5 % len],
                        _ => next_user.fetch_add(1, Ordering::Relaxed),
                    };
                    let switches = switched.load(Ordering::Acquire);
                    let base = &bases[(n + sent) % bases.len()];
                    let r = support::purchase(&http, base, &tokens, voucher, user).await;
                    let status = r.status().as_u16();
                    let retry_after = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let body: Value = r.json().await.unwrap_or(Value::Null);
                    let order = body["order_id"]
                        .as_str()
                        .and_then(|id| id.parse::<i64>().ok());
                    if status == 200 {
                        mine.push(user);
                    }
                    answers.lock().unwrap().push(Answer {
                        user,
                        status,
                        order,
                        switches,
                        retry_after,
                        body,
                    });
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    let accepted_since = |switches: usize| {
        answers
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.status == 200 && a.switches == switches)
            .count()
    };
    let mut followed = true;
    for switch in 0..=switches {
        // Purchases accepted on this master for a while (bounded: a service
        // that never follows fails here).
        followed &= testkit::eventually(Duration::from_secs(90), || async {
            accepted_since(switch) >= 150
        })
        .await;
        if switch == switches || !followed {
            break;
        }
        let old = group.master_port();
        if how == Move::Kill {
            let master = group.servers.iter_mut().find(|s| s.port() == Some(old));
            master.expect("the master is in the group").kill();
            switched.store(switch + 1, Ordering::Release);
            // Once another is promoted, the killed machine comes back (as
            // an operator brings it back) and the sentinels make it a
            // replica of the new master: with acknowledgement from every
            // replica, purchases go on once it has caught up.
            let promoted = tokio::task::block_in_place(|| {
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                while std::time::Instant::now() < deadline {
                    if group.master_port() != old {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                false
            });
            assert!(promoted, "the sentinels never promoted a replica");
            let master = group.servers.iter_mut().find(|s| s.port() == Some(old));
            tokio::task::block_in_place(|| master.expect("the killed master").restart());
            continue;
        }
        let new = tokio::task::block_in_place(|| group.failover());
        assert_ne!(old, new);
        switched.store(switch + 1, Ordering::Release);
        if how == Move::Failover && switch + 1 < switches {
            assert!(
                tokio::task::block_in_place(|| {
                    group.wait_until_replica(old, Duration::from_secs(60))
                }),
                "the former master never followed the new one"
            );
        }
    }
    stop.store(true, Ordering::Release);
    for buyer in buyers {
        buyer.await.unwrap();
    }
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    assert!(
        followed,
        "purchases were not accepted again after a switch: {} accepted in all",
        answers.iter().filter(|a| a.status == 200).count()
    );
    for a in &answers {
        assert!(
            a.status == 200 || a.status == 503 || a.status == 409,
            "user {}: {} {}",
            a.user,
            a.status,
            a.body
        );
        assert!(
            a.status != 503 || a.retry_after.is_some(),
            "a 503 without Retry-After: {}",
            a.body
        );
    }

    // Every accepted order reaches the database; nothing else does but
    // orders whose answer was a 503 (an unknown outcome).
    let accepted: HashSet<i64> = answers.iter().filter_map(|a| a.order).collect();
    let unknown: HashSet<i64> = answers
        .iter()
        .filter(|a| a.status == 503)
        .map(|a| a.user)
        .collect();
    let db = Database::connect(&database).await.unwrap();
    let dead_letters = || services.iter().map(Service::dead_letters).sum::<u64>();
    // Until every accepted order is stored (a count would not do: orders
    // whose answer was a 503 are stored too, so the database can hold as
    // many orders as were accepted while some accepted ones are still on
    // their way), or one was dead-lettered (which fails below).
    testkit::eventually(Duration::from_secs(60), || async {
        let stored: HashSet<i64> = db.order_ids(voucher).await.unwrap().into_iter().collect();
        accepted.is_subset(&stored) || dead_letters() > 0
    })
    .await;
    let stored: HashSet<i64> = db.order_ids(voucher).await.unwrap().into_iter().collect();
    for seckill::db::OrderBuyer {
        order_id: order,
        user_id: user,
    } in db.voucher_orders(voucher).await.unwrap()
    {
        assert!(
            accepted.contains(&order) || unknown.contains(&user),
            "order {order} of user {user} stored, but never accepted"
        );
    }
    let mut users = HashSet::new();
    let rebought = answers
        .iter()
        .filter(|a| a.status == 200 && !users.insert(a.user))
        .count();
    let run = Run {
        lost: accepted.difference(&stored).count(),
        dead_letters: dead_letters(),
        rebought,
        stored: stored.len(),
        stock,
        answers,
    };
    for service in services {
        service.stop().await.unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
    run
}

/// Purchases keep coming while Sentinel moves the master to the replica
/// and, once the former master follows it, back to the former master (a
/// failback: it still has the purchase script it had before, and the data
/// it copied). Every answer is a 200, a 409 (an earlier buyer refused) or
/// a 503 (never another 5xx), purchases are accepted again on each new
/// master, and each one's sale state is verified against the database
/// before it sells: no buyer is accepted twice, no accepted order is
/// refused by the database, and every accepted order is stored. Without
/// replica acknowledgement too: the orders the master left behind took
/// until the switch are taken over from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failback_under_load_stores_every_accepted_order() {
    let run = sell_through_switches(1_000_000, 2, None, Move::Failover).await;
    run.figures("failback after resync, no replica ack");
    run.assert_every_accepted_order_stored();
}

/// The same with replica acknowledgement on (the README's production
/// advice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failback_under_load_stores_every_accepted_order_with_replica_ack() {
    let ack = ReplicaAck {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };
    let run = sell_through_switches(1_000_000, 2, Some(ack), Move::Failover).await;
    run.figures("failback after resync, replica ack 1");
    run.assert_every_accepted_order_stored();
}

/// A failback at once, before the sentinels have demoted the former
/// master: it comes back with its own data as it was at the first switch
/// (every sale since missing), which is verified before it sells.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failback_to_a_master_never_demoted_never_sells_from_its_old_state() {
    let run = sell_through_switches(1_000_000, 2, None, Move::FailoverAtOnce).await;
    run.figures("failback at once, no replica ack");
    run.assert_every_accepted_order_stored();
}

/// The master killed under load: from the kill until the sentinels have
/// promoted a replica every purchase is a 503 with `Retry-After` (the
/// service cannot tell; the sentinels name no master for a while), never a
/// 500, and purchases are accepted again on the new master (the killed
/// one comes back as its replica). With acknowledgement from every replica
/// every accepted order is stored, whichever replica is promoted (with
/// fewer, an order is kept only if a replica that confirmed it is the one
/// promoted, which Sentinel judges by offsets it polled a moment before:
/// the README's durability table); without it, the orders the killed
/// master had not passed on are lost, which this reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_a_503_until_the_sentinels_promote_another() {
    let ack = ReplicaAck {
        replicas: 2,
        timeout: Duration::from_millis(100),
    };
    let run = sell_through_switches(1_000_000, 1, Some(ack), Move::Kill).await;
    run.figures("master killed, replica ack 2 of 2");
    run.assert_every_accepted_order_stored();
    let run = sell_through_switches(1_000_000, 1, None, Move::Kill).await;
    run.figures("master killed, no replica ack");
    assert_eq!(run.dead_letters, 0, "accepted orders the database refused");
}
