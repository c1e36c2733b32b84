//! Faults 18 (and the runs that found the defects): several client processes, each with
//! many tasks locking a few names, writing to a fenced register while they
//! hold, cancelling some acquires; meanwhile a nemesis kills connections
//! (`CLIENT KILL`), pauses Redis for less than the lease, restarts it (AOF
//! `always`), and kills and respawns client processes. Afterwards: no
//! overlapping beliefs, no token issued twice, no stale write accepted, no
//! acquire that waited out its bound, no lock and no subscription left.
//!
//! `HASP_FAULTS_MIX_SECS` (default 8), `HASP_MIX_PROCESSES` (3) and
//! `HASP_MIX_TASKS` (8 per process) scale it; the closing notes quote a
//! 60 s run with 3 × 32 tasks:
//! `HASP_FAULTS_MIX_SECS=60 HASP_MIX_TASKS=32 cargo test --release -p hasp --test faults mix -- --nocapture`.
//!
//! Client processes are killed, not paused: a process frozen between its
//! check of `is_lost` and its write is the case fencing exists for, shown
//! on its own in `fencing`.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hasp::{Client, Error};
use rand::Rng;
use testkit::{now_us, Event, FencedRegister, History, RedisServer, ServerOptions};

use crate::bounded;
use crate::child::{belief_end_us, ChildProcess};

const NAMES: usize = 4;
const WATCHDOG_MS: u64 = 1500;
/// The bound of every acquire; none may run out (it would mean a waiter
/// slept through releases).
const ACQUIRE_BOUND: Duration = Duration::from_secs(6);

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key).map_or(default, |v| v.parse().unwrap())
}

/// The child's part: `HASP_MIX_TASKS` tasks until standard input closes.
pub async fn child(client: Client) {
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::spawn({
        let stop = stop.clone();
        move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::Release);
        }
    });
    let id = std::env::var("HASP_CHILD_ID").unwrap();
    let register = std::env::var("HASP_CHILD_REGISTER").unwrap();
    let tasks = env_or("HASP_MIX_TASKS", 8);
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let (client, stop) = (client.clone(), stop.clone());
            let (id, register) = (id.clone(), register.clone());
            tokio::spawn(async move { task(client, stop, format!("{id}t{t}"), register).await })
        })
        .collect();
    let mut timeouts = 0;
    for worker in workers {
        timeouts += worker.await.unwrap();
    }
    let stats = client.stats();
    println!(
        "STATS held={} subscribed={} timeouts={timeouts}",
        stats.held_locks, stats.subscribed_channels
    );
}

/// One task's loop; returns how many acquires ran out their bound.
async fn task(client: Client, stop: Arc<AtomicBool>, me: String, register: String) -> u32 {
    let mut register = testkit::RegisterClient::connect(&register).await;
    let mut timeouts = 0;
    while !stop.load(Ordering::Acquire) {
        let name = format!("mix-{}", rand::rng().random_range(0..NAMES));
        let holder = format!("{me}@{name}");
        let lock = client.lock(&name).unwrap();
        let cancel_after = rand::rng()
            .random_bool(0.2)
            .then(|| Duration::from_millis(rand::rng().random_range(0..20)));
        let waiting_since = now_us();
        let acquired = match cancel_after {
            Some(after) => match tokio::time::timeout(after, lock.lock()).await {
                Ok(result) => result,
                Err(_) => continue, // cancelled: nothing may be left behind
            },
            None => lock.lock_within(ACQUIRE_BOUND).await,
        };
        let guard = match acquired {
            Ok(guard) => guard,
            Err(Error::TimedOut { .. }) => {
                timeouts += 1;
                println!("TIMEOUT {holder} {waiting_since} {}", now_us());
                continue;
            }
            Err(_) => continue, // Redis unreachable: an error, never a hold
        };
        let token = guard.fencing_token();
        println!(
            "{}",
            Event::Acquired {
                holder: holder.clone(),
                token,
                at: now_us(),
            }
            .to_line()
        );
        let writes = rand::rng().random_range(1..=3);
        for _ in 0..writes {
            if guard.is_lost() {
                break;
            }
            let accepted = register.write(&name, &holder, token).await;
            let at = now_us();
            let wrote = Event::Wrote {
                holder: holder.clone(),
                token,
                accepted,
                at,
            };
            println!("{}", wrote.to_line());
            let pause = Duration::from_millis(rand::rng().random_range(0..4));
            tokio::time::sleep(pause).await;
        }
        let end = now_us().min(belief_end_us(&guard));
        println!("{}", Event::Released { holder, at: end }.to_line());
        let _ = guard.unlock().await;
    }
    timeouts
}

struct Children {
    server_url: String,
    register: String,
    history: History,
    /// Every line of every child that is not an event.
    lines: Arc<std::sync::Mutex<Vec<String>>>,
    running: Vec<(String, ChildProcess)>,
    spawned: usize,
    tasks: u64,
}

impl Children {
    fn spawn(&mut self) {
        let id = format!("p{}", self.spawned);
        self.spawned += 1;
        let child = ChildProcess::spawn_logged(
            "mix",
            &[
                ("HASP_CHILD_URL", self.server_url.clone()),
                ("HASP_CHILD_REGISTER", self.register.clone()),
                ("HASP_CHILD_ID", id.clone()),
                ("HASP_CHILD_WATCHDOG_MS", WATCHDOG_MS.to_string()),
                ("HASP_MIX_TASKS", self.tasks.to_string()),
            ],
            &self.history,
            Some(self.lines.clone()),
        );
        self.running.push((id, child));
    }

    /// Kills a random child: its beliefs end now (it writes no more).
    fn kill_one(&mut self) {
        let i = rand::rng().random_range(0..self.running.len());
        let (id, mut child) = self.running.swap_remove(i);
        child.kill();
        let at = now_us();
        for t in 0..self.tasks {
            for n in 0..NAMES {
                let holder = format!("{id}t{t}@mix-{n}");
                self.history.push(Event::Lost { holder, at });
            }
        }
    }
}

/// Faults 18: the random mix (see the module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_mix_of_faults_breaks_no_exclusion_and_leaves_nothing_behind() {
    let seconds = env_or("HASP_FAULTS_MIX_SECS", 8);
    bounded(Duration::from_secs(seconds + 60), async {
        let mut server = RedisServer::start_with(ServerOptions::default().with_aof("always"));
        let register = FencedRegister::start();
        let mut children = Children {
            server_url: server.url(),
            register: register.url(),
            history: History::default(),
            lines: Arc::default(),
            running: Vec::new(),
            spawned: 0,
            tasks: env_or("HASP_MIX_TASKS", 8),
        };
        for _ in 0..env_or("HASP_MIX_PROCESSES", 3) {
            children.spawn();
        }
        let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
        let end = Instant::now() + Duration::from_secs(seconds);
        while Instant::now() < end {
            let pause = rand::rng().random_range(200..600);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let fault = match rand::rng().random_range(0..10) {
                0..=2 => {
                    println!("mix: client kill at {}", now_us());
                    server.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
                    "client kill (commands)"
                }
                3 => {
                    server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
                    "client kill (pub/sub)"
                }
                4..=5 => {
                    println!("mix: pause at {}", now_us());
                    server.pause();
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    server.resume();
                    "redis paused 150 ms"
                }
                6 => {
                    println!("mix: restart at {}", now_us());
                    server.restart();
                    "redis restarted (AOF always)"
                }
                7..=8 => {
                    println!("mix: kill at {}", now_us());
                    children.kill_one();
                    children.spawn();
                    "client process killed"
                }
                _ => "none",
            };
            *faults.entry(fault).or_default() += 1;
        }
        // Let every child finish its holds and report.
        let mut graceful = Vec::new();
        for (_, child) in &mut children.running {
            child.close_stdin();
            graceful.push(child.line("STATS", Duration::from_secs(15)).await);
            child.finish(Duration::from_secs(5));
        }
        // Locks of killed processes expire within one lease.
        let left = testkit::eventually(Duration::from_millis(WATCHDOG_MS * 2), || {
            let keys = server.cli(&["KEYS", "hasp:{mix-?}"]);
            async move { keys.is_empty() }
        })
        .await;

        let events = children.history.events();
        let mut per_name: BTreeMap<String, History> = BTreeMap::new();
        for event in events {
            let holder = match &event {
                Event::Acquired { holder, .. }
                | Event::Lost { holder, .. }
                | Event::Released { holder, .. }
                | Event::Wrote { holder, .. } => holder,
            };
            let name = holder.split('@').nth(1).unwrap_or("?").to_owned();
            per_name.entry(name).or_default().push(event);
        }
        // An acquire that ran out its bound: how many times others got the
        // lock meanwhile (many: starved; few: everything stalled).
        let mut timeouts = Vec::new();
        let lines = children.lines.lock().unwrap().clone();
        for line in lines.iter().filter(|l| l.starts_with("TIMEOUT ")) {
            let mut words = line.split(' ').skip(1);
            let (Some(holder), Some(from), Some(to)) = (words.next(), words.next(), words.next()) else {
                continue;
            };
            let (from, to): (u64, u64) = (from.parse().unwrap(), to.parse().unwrap());
            let name = holder.split('@').nth(1).unwrap_or("?").to_owned();
            let others = per_name.get(&name).map_or(0, |h| {
                h.events()
                    .iter()
                    .filter(|e| matches!(e, Event::Acquired { at, .. } if *at > from && *at < to))
                    .count()
            });
            if timeouts.is_empty() {
                if let Some(h) = per_name.get(&name) {
                    for e in h.events().iter().filter(|e| {
                        let at = match e {
                            Event::Acquired { at, .. }
                            | Event::Lost { at, .. }
                            | Event::Released { at, .. }
                            | Event::Wrote { at, .. } => *at,
                        };
                        at + 2_000_000 > from && at < to
                    }) {
                        println!("mix: during the first wait that ran out: {} {e:?}", from);
                    }
                }
                for line in lines.iter().filter(|l| !l.starts_with("TIMEOUT ") && !l.starts_with("STATS")) {
                    println!("mix: child said: {line}");
                }
            }
            timeouts.push((holder.to_owned(), (to - from) / 1000, others));
        }
        println!("mix: acquires that ran out their bound (holder, ms waited, acquisitions by others meanwhile): {timeouts:?}");
        let mut total = testkit::Report::default();
        for history in per_name.values() {
            let r = history.check();
            total.holds += r.holds;
            total.overlaps += r.overlaps;
            total.duplicate_tokens += r.duplicate_tokens;
            total.stale_writes_accepted += r.stale_writes_accepted;
            total.writes_accepted += r.writes_accepted;
            total.writes_rejected += r.writes_rejected;
        }
        println!("mix: {seconds} s, faults {faults:?}");
        println!("mix: {total:?}");
        println!("mix: children at the end: {graceful:?}");
        assert!(total.holds > 50, "too little happened: {total:?}");
        assert_eq!(total.overlaps, 0, "{total:?}");
        assert_eq!(total.duplicate_tokens, 0, "{total:?}");
        assert_eq!(total.stale_writes_accepted, 0, "{total:?}");
        // Holders check is_lost() before each write and none overlaps: the
        // register, one per name, never has a reason to refuse.
        assert_eq!(total.writes_rejected, 0, "{total:?}");
        for stats in &graceful {
            assert!(
                stats.starts_with("STATS held=0 subscribed=0 timeouts=0"),
                "{stats}"
            );
        }
        assert!(left, "locks left held: {}", server.cli(&["KEYS", "hasp:*"]));
    })
    .await;
}
