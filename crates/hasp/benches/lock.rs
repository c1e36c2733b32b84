//! `cargo bench -p hasp --bench lock [-- --duration SECS] [--repeat N]`
//!
//! Side by side in one run, each on a fresh private redis-server (TCP
//! loopback, no persistence):
//!
//! * **W1 uncontended**: C = 1, 16, 64, 256 tasks, each locking and unlocking its
//!   own name for a fixed time: pairs/s. hasp (watchdog mode: reentrant,
//!   fenced, renewed) vs rslock (`SET NX PX`, compare-and-delete script), and
//!   redis-benchmark running hasp's own acquire and release scripts on one
//!   connection with 64 in flight.
//! * **w1link**: W1 at C = 1 and 16 with every reply delayed 1 ms by a
//!   proxy, for both libraries: what a network round trip does to the gap.
//! * **tls**: W1 at C = 1, 16, 64 against a `rediss://` Redis 7.0 (a
//!   private CA, certificates verified), hasp, plain and rslock, beside
//!   hasp on plain TCP: what TLS costs each library.
//! * **W2 contended**: 8, 32 and 128 tasks on one name, each holding it
//!   1 ms: acquisitions/s against the hand-off ceiling, hand-off latency
//!   (release returns → next acquire returns), acquire-wait p99/max, tasks
//!   served, and the most acquisitions by others during one wait (tasks − 1
//!   = strict FIFO; more = overtaken).
//! * **Redis instructions per pair** (`ri`, needs valgrind): counted by
//!   callgrind for hasp's batch function and for rslock's commands
//!   (`HASP_RI_KEEP=1` keeps the profiles for `callgrind_annotate`).
//! * **wait**: what replica acknowledgement (`Settings::set_replica_ack`)
//!   costs at C = 1 against a master with one replica.
//! * **m: over several servers**: over 3 servers, MultiLock (parts asked
//!   at once) beside a one-after-another loop of 3 locks (as Redisson's
//!   MultiLock takes them), at C = 1 on loopback and with 1 ms added to
//!   every reply, and at C = 64 on loopback; RedLock over 3 and 5 servers
//!   beside rslock's at C = 1, 16, 64; the single lock on a 3-master Redis
//!   Cluster beside one server at C = 1, 16, 64.
//! * **(c) renewal cost**: script calls per renewal period while holding
//!   10,000 locks.
//! * **a: adaptive lease**: renewal script calls while 400 tasks take
//!   short locks (5–50 ms sections, about 10,000 locks/s) for three
//!   measurement times, in watchdog mode and in adaptive mode.
//! * **f: the family** beside the basic lock, same run: uncontended pairs/s
//!   at C = 1 and 64 (each task its own name) for FairLock, RwLock write and
//!   read, Semaphore; and W2 (32 tasks over 2 clients, one name) for each,
//!   Semaphore with 1 and with 8 permits.
//!
//! See `benches/README.md` for how to read the figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hasp::{Client, Settings};
use hdrhistogram::Histogram;
use rslock::LockManager;
use testkit::{Direction, FaultProxy, Mode, RedisServer};

const W1_CONCURRENCY: [usize; 4] = [1, 16, 64, 256];
/// W1 levels over a delayed link (section `w1link`), and the delay.
const W1_LINK_CONCURRENCY: [usize; 2] = [1, 16];
const W1_LINK_DELAYS: [Duration; 2] = [Duration::from_micros(200), Duration::from_millis(1)];
/// W1 levels over TLS (section `tls`).
const W1_TLS_CONCURRENCY: [usize; 3] = [1, 16, 64];
/// W2 task counts: a few waiters, the classic 32, and a crowd.
const W2_TASKS: [usize; 3] = [8, 32, 128];
const W2_HOLD: Duration = Duration::from_millis(1);

struct Args {
    duration: Duration,
    /// Sections to run (w1, w1link, tls, rb, ri, ci, w2, wait, m, c, f, a); empty = all.
    only: Vec<String>,
    /// W1 concurrency levels to run; empty = all of [`W1_CONCURRENCY`].
    levels: Vec<usize>,
    /// W1 rounds over all levels; more than one adds a min–max–median summary
    /// (on a 2-core VM one run is not enough to call a ratio near 1).
    repeat: usize,
    /// Set when this process is the client that section `ci` measures
    /// (`--client-pairs LIB URL C PAIRS`): it runs that and nothing else.
    client_job: Option<ClientJob>,
    /// `--pin`: every server W1 starts runs on CPU 0 and this process on the
    /// last CPU, so neither takes the other's core and each one's CPU per
    /// pair decides its own limit.
    pin: bool,
}

/// W1 by one library, run by this process under callgrind for section `ci`.
struct ClientJob {
    library: Library,
    url: String,
    concurrency: usize,
    /// Pairs per task.
    pairs: u64,
}

impl Args {
    fn runs(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }
}

fn parse_args() -> Args {
    let mut duration = Duration::from_secs(5);
    let mut only = Vec::new();
    let mut levels = Vec::new();
    let mut repeat = 1;
    let mut client_job = None;
    let mut pin = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        pin |= a == "--pin";
        if a == "--duration" {
            let secs: f64 = args
                .next()
                .and_then(|s| s.parse().ok())
                .expect("--duration SECS");
            duration = Duration::from_secs_f64(secs);
        }
        if a == "--only" {
            only.extend(
                args.next()
                    .expect("--only w1,w1link,tls,rb,ri,ci,w2,wait,m,c,f,a")
                    .split(',')
                    .map(str::to_owned),
            );
        }
        if a == "--c" {
            levels.extend(
                args.next()
                    .expect("--c 1,16,64")
                    .split(',')
                    .map(|c| c.parse::<usize>().expect("--c takes numbers")),
            );
        }
        if a == "--repeat" {
            repeat = args
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n >= 1)
                .expect("--repeat N (N >= 1)");
        }
        if a == "--client-pairs" {
            let mut next = || args.next().expect("--client-pairs LIB URL C PAIRS");
            let library = Library::named(&next()).expect("LIB: hasp, plain or rslock");
            let url = next();
            let concurrency = next().parse().expect("C");
            let pairs = next().parse().expect("PAIRS");
            client_job = Some(ClientJob {
                library,
                url,
                concurrency,
                pairs,
            });
        }
        // cargo bench passes `--bench`; ignore anything else.
    }
    Args {
        duration,
        only,
        levels,
        repeat,
        client_job,
        pin,
    }
}

/// Moves process `pid` (0: this process's calling thread, and so every
/// thread it starts later) to CPU `cpu` with util-linux's `taskset`.
fn pin_to_cpu(pid: u32, cpu: usize) {
    let pid = if pid == 0 { std::process::id() } else { pid };
    let status = std::process::Command::new("taskset")
        .args(["-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "taskset -p -c {cpu} {pid} failed"
    );
}

fn main() {
    let args = parse_args();
    if args.pin {
        // Before the runtime starts its threads: they inherit the CPU.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        pin_to_cpu(0, cpus.saturating_sub(1));
        PIN_SERVERS.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match args.client_job {
        Some(job) => {
            rt.block_on(
                job.library
                    .pairs(&job.url, job.concurrency, Until::Pairs(job.pairs)),
            );
        }
        None => rt.block_on(run(args)),
    }
}

async fn run(args: Args) {
    println!(
        "hasp lock benchmark: {:?} per measurement, {}, redis-server over TCP loopback",
        args.duration,
        if args.pin {
            "servers on CPU 0 and this client on the last CPU".to_owned()
        } else {
            format!(
                "{} cores shared by servers and client",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            )
        }
    );

    let servers = servers();
    let mut hasp_c1 = 0.0;
    if args.runs("w1") {
        println!("\n## W1 uncontended: pairs/s (lock + unlock of a task's own name)\n");
        println!("hasp = `Lock` (fenced, reentrant, watchdog); plain = `PlainLock` (no token); rslock = `SET NX PX` + compare-and-delete script.\n");
        println!("| server | C | hasp pairs/s | plain pairs/s | rslock pairs/s | hasp / rslock | plain / rslock | Redis CPU µs/pair: hasp | plain | rslock | client CPU µs/pair: hasp | plain | rslock |");
        println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        let levels = if args.levels.is_empty() {
            W1_CONCURRENCY.to_vec()
        } else {
            args.levels.clone()
        };
        // Per server and level: the (hasp, plain) / rslock ratios of each round.
        let mut ratios: Vec<(&str, usize, Vec<Ratios>)> = Vec::new();
        for server in &servers {
            for &c in &levels {
                ratios.push((server.name, c, Vec::new()));
            }
        }
        for round in 0..args.repeat {
            for (i, (server, c)) in servers
                .iter()
                .flat_map(|s| levels.iter().map(move |&c| (s, c)))
                .enumerate()
            {
                // Which library runs first rotates between rounds, so that
                // a machine slowing down or speeding up during a level
                // favours none.
                let mut order = [Library::Hasp, Library::Plain, Library::Rslock];
                order.rotate_left(round % 3);
                let mut measured = [(0.0, 0.0, 0.0); 3];
                for library in order {
                    measured[library as usize] =
                        w1_measured(server, c, args.duration, library).await;
                }
                let [(h, h_cpu, h_me), (p, p_cpu, p_me), (r, r_cpu, r_me)] = measured;
                if c == 1 && hasp_c1 == 0.0 {
                    hasp_c1 = h;
                }
                ratios[i].2.push((h / r, p / r));
                println!(
                    "| {} | {c} | {h:.0} | {p:.0} | {r:.0} | {:.2} | {:.2} | {h_cpu:.1} | {p_cpu:.1} | {r_cpu:.1} | {h_me:.1} | {p_me:.1} | {r_me:.1} |",
                    server.name,
                    h / r,
                    p / r
                );
            }
        }
        if args.repeat > 1 {
            println!(
                "\nratios to rslock over {} rounds (min–max, median):",
                args.repeat
            );
            for (server, c, ratios) in &ratios {
                let hasp: Vec<f64> = ratios.iter().map(|r| r.0).collect();
                let plain: Vec<f64> = ratios.iter().map(|r| r.1).collect();
                println!(
                    "- {server}, C = {c}: hasp {}; plain {}",
                    spread(&hasp),
                    spread(&plain)
                );
            }
        }
    }
    if args.runs("w1link") {
        println!("\n## W1 over a slower link: every reply delayed by a proxy\n");
        println!("(the delay asked; the proxy sleeps on tokio's timer, which wakes on whole milliseconds: 0.2 ms lands near 1 ms and 1 ms near 2 ms)\n");
        println!("| server | delay | C | hasp pairs/s | plain pairs/s | rslock pairs/s | hasp / rslock | plain / rslock |");
        println!("|---|---|---|---:|---:|---:|---:|---:|");
        for server in &servers {
            for delay in W1_LINK_DELAYS {
                for c in W1_LINK_CONCURRENCY {
                    let h = w1_over_link(server, delay, c, args.duration, Library::Hasp).await;
                    let p = w1_over_link(server, delay, c, args.duration, Library::Plain).await;
                    let r = w1_over_link(server, delay, c, args.duration, Library::Rslock).await;
                    println!(
                        "| {} | {delay:?} | {c} | {h:.0} | {p:.0} | {r:.0} | {:.2} | {:.2} |",
                        server.name,
                        h / r,
                        p / r
                    );
                }
            }
        }
    }
    if args.runs("tls") {
        w1_tls_table(args.duration).await;
    }
    if args.runs("rb") {
        let server = RedisServer::start_tcp();
        let rb = redis_benchmark_pairs(&server);
        drop(server);
        println!(
            "\nredis-benchmark, hasp's batch function with one acquire / one release per call, 1 connection, 64 in flight: \
         acquire {:.0}/s, release {:.0}/s ({:.1}% of releases hit a held lock) => {:.0} pairs/s",
            rb.acquire,
            rb.release,
            rb.release_hit_rate * 100.0,
            rb.pairs()
        );
    }
    if args.runs("ri") {
        println!("\n## Redis instructions per lock/unlock pair, as each client sends them (callgrind, {RI_CLIENT_PAIRS} pairs)\n");
        per_pair_table(&servers, client_instructions);
        for per_call in RI_PER_CALL {
            match redis_instructions(per_call) {
                Some(RedisInstructions {
                    hasp,
                    floor,
                    rslock,
                }) => println!(
                    "\nRedis instructions per lock/unlock pair (callgrind, {RI_TOTAL} pairs, {per_call} per call): \
                     hasp {hasp:.0} (the batch function, {per_call} operations per call; \
                     {floor:.0} of them the same calls to a function that returns at once), \
                     rslock {rslock:.0} (SET NX PX + compare-and-delete script, pipelined {per_call} at a time)"
                ),
                None => println!("\nRedis instructions per pair: skipped (needs valgrind)"),
            }
        }
    }
    if args.runs("ci") {
        println!("\n## Client instructions per lock/unlock pair (callgrind, this process as the client, {CI_PAIRS} pairs)\n");
        per_pair_table(&servers, client_side_instructions);
    }
    if hasp_c1 == 0.0 {
        let server = RedisServer::start_tcp();
        hasp_c1 = Library::Hasp
            .w1(&server.url(), 1, Duration::from_secs(2))
            .await;
    }
    if args.runs("w2") {
        println!("\n## W2 contended: 8, 32 and 128 tasks, one name, {W2_HOLD:?} hold\n");
        println!("| lib | tasks | acq/s | ceiling | % of ceiling | hand-off p50 | hand-off p99 | wait p99 | wait max | tasks served | most served during one wait |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for tasks in W2_TASKS {
            let server = RedisServer::start_tcp();
            let client = Client::open(&server.url()).await.unwrap();
            let lock = client.lock("w2").unwrap();
            let report = w2(tasks, args.duration * 2, move || {
                let lock = lock.clone();
                async move {
                    let guard = lock.lock().await.unwrap();
                    move || async move { guard.unlock().await.unwrap() }
                }
            })
            .await;
            report.print("hasp", hasp_c1);
            drop(server);

            let server = RedisServer::start_tcp();
            let manager = LockManager::new(vec![server.url()]);
            let report = w2(tasks, args.duration * 2, move || {
                let manager = manager.clone();
                async move {
                    let guard = manager
                        .acquire("w2".as_bytes(), Duration::from_secs(10))
                        .await
                        .unwrap();
                    move || async move { guard.release().await }
                }
            })
            .await;
            report.print("rslock", hasp_c1);
            drop(server);
        }
    }
    if args.runs("wait") {
        replica_ack_cost(args.duration).await;
    }
    if args.runs("m") {
        several_servers(args.duration).await;
    }
    if args.runs("f") {
        family(args.duration, hasp_c1).await;
    }
    if args.runs("a") {
        adaptive_renewals(args.duration * 3).await;
    }
    if !args.runs("c") {
        return;
    }

    println!("\n## (c) renewal cost while holding 10,000 locks\n");
    let server = RedisServer::start_tcp();
    let (calls, periods) = renewal_cost(&server).await;
    println!(
        "hasp: {calls} renewal script calls in {periods} periods = {:.0} per period \
         (Redisson: 10,000 / 100 = 100; rslock has no watchdog: extending each lock is one call, 10,000 per period)",
        calls as f64 / periods as f64
    );
}

/// What `Settings::set_replica_ack(1, ...)` costs: lock() latency and
/// pairs/s at C = 1 against a master with one healthy replica, with and
/// without waiting for it (faults 16).
async fn replica_ack_cost(duration: Duration) {
    println!("\n## wait: replica acknowledgement, master + 1 replica, C = 1\n");
    println!("| mode | pairs/s | lock() p50 | lock() p99 |");
    println!("|---|---:|---:|---:|");
    let master = RedisServer::start_tcp();
    let _replica = RedisServer::start_replica_of(&master);
    for (mode, settings) in [
        ("no WAIT", Settings::default()),
        (
            "WAIT 1 (replica_ack)",
            Settings::default().set_replica_ack(1, Duration::from_millis(100)),
        ),
    ] {
        let client = Client::open_with(&master.url(), settings).await.unwrap();
        let lock = client.lock("wait").unwrap();
        let mut latency = Histogram::<u64>::new(3).unwrap();
        let (start, mut pairs) = (Instant::now(), 0u64);
        while start.elapsed() < duration {
            let t = Instant::now();
            let guard = lock.lock().await.unwrap();
            latency.record(t.elapsed().as_micros() as u64).unwrap();
            guard.unlock().await.unwrap();
            pairs += 1;
        }
        let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "| {mode} | {:.0} | {:.3} ms | {:.3} ms |",
            pairs as f64 / start.elapsed().as_secs_f64(),
            ms(0.5),
            ms(0.99)
        );
    }
}

/// Section m: MultiLock and RedLock (spec multi 34).
async fn several_servers(duration: Duration) {
    println!("\n## m: over several servers\n");
    println!("| 3 servers, C = 1 | MultiLock pairs/s | lock() p50 | one-after-another pairs/s | lock() p50 |");
    println!("|---|---:|---:|---:|---:|");
    for delay in [None, Some(Duration::from_millis(1))] {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_tcp()).collect();
        let proxies: Vec<FaultProxy> = servers.iter().map(FaultProxy::start).collect();
        let mut clients = Vec::new();
        for proxy in &proxies {
            clients.push(Client::open(&proxy.url()).await.unwrap());
        }
        if let Some(d) = delay {
            for proxy in &proxies {
                proxy.set(Direction::ToClient, Mode::Delay(d));
            }
        }
        let locks: Vec<hasp::Lock> = clients.iter().map(|c| c.lock("m").unwrap()).collect();
        let multi = hasp::MultiLock::new(locks.clone()).unwrap();
        let (m_rate, m_p50) = pairs_c1(duration, || async {
            let t = Instant::now();
            let guard = multi.lock().await.unwrap();
            let took = t.elapsed();
            guard.unlock().await.unwrap();
            took
        })
        .await;
        let (s_rate, s_p50) = pairs_c1(duration, || async {
            let t = Instant::now();
            let mut guards = Vec::new();
            for lock in &locks {
                guards.push(lock.lock().await.unwrap());
            }
            let took = t.elapsed();
            for guard in guards {
                guard.unlock().await.unwrap();
            }
            took
        })
        .await;
        let label = delay.map_or("loopback".to_owned(), |d| format!("+{d:?} per reply"));
        println!("| {label} | {m_rate:.0} | {m_p50:.3} ms | {s_rate:.0} | {s_p50:.3} ms |");
    }

    println!("\n| 3 servers, C = 64, loopback | MultiLock pairs/s | one-after-another pairs/s |");
    println!("|---|---:|---:|");
    {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_tcp()).collect();
        let mut clients = Vec::new();
        for server in &servers {
            clients.push(Client::open(&server.url()).await.unwrap());
        }
        let multi = concurrent_pairs(64, duration, |i| {
            let locks: Vec<hasp::Lock> = clients
                .iter()
                .map(|c| c.lock(&format!("m-{i}")).unwrap())
                .collect();
            let lock = hasp::MultiLock::new(locks).unwrap();
            move || {
                let lock = lock.clone();
                async move {
                    lock.lock().await.unwrap().unlock().await.unwrap();
                }
            }
        })
        .await;
        let sequential = concurrent_pairs(64, duration, |i| {
            let locks: Vec<hasp::Lock> = clients
                .iter()
                .map(|c| c.lock(&format!("s-{i}")).unwrap())
                .collect();
            move || {
                let locks = locks.clone();
                async move {
                    let mut guards = Vec::new();
                    for lock in &locks {
                        guards.push(lock.lock().await.unwrap());
                    }
                    for guard in guards {
                        guard.unlock().await.unwrap();
                    }
                }
            }
        })
        .await;
        println!("| loopback | {multi:.0} | {sequential:.0} |");
    }

    println!("\n| single lock, pairs/s | C | 3-master cluster | one server | cluster / server |");
    println!("|---|---:|---:|---:|---:|");
    for c in W1_CONCURRENCY {
        let cluster = testkit::RedisCluster::start(3);
        let seeds = cluster.urls();
        let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
        let client = Client::open_cluster(&seeds, Settings::default())
            .await
            .unwrap();
        let on_cluster = concurrent_pairs(c, duration, |i| {
            let lock = client.lock(&format!("c-{i}")).unwrap();
            move || {
                let lock = lock.clone();
                async move {
                    lock.lock().await.unwrap().unlock().await.unwrap();
                }
            }
        })
        .await;
        drop(client);
        drop(cluster);
        let server = RedisServer::start_tcp();
        let on_server = Library::Hasp.w1(&server.url(), c, duration).await;
        println!(
            "| hasp | {c} | {on_cluster:.0} | {on_server:.0} | {:.2} |",
            on_cluster / on_server
        );
    }

    println!("\n| RedLock, pairs/s | C | hasp RedLock | rslock | hasp / rslock |");
    println!("|---|---:|---:|---:|---:|");
    for n in [3, 5] {
        for c in W1_CONCURRENCY {
            let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start_tcp()).collect();
            let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
            let mut clients = Vec::new();
            for url in &urls {
                clients.push(Client::open(url).await.unwrap());
            }
            let h = concurrent_pairs(c, duration, |i| {
                let lock = hasp::RedLock::new(&format!("r-{i}"), &clients).unwrap();
                move || {
                    let lock = lock.clone();
                    async move {
                        lock.lock().await.unwrap().unlock().await.unwrap();
                    }
                }
            })
            .await;
            let manager = LockManager::new(urls.clone());
            let r = concurrent_pairs(c, duration, |i| {
                let manager = manager.clone();
                let name = format!("r-{i}");
                move || {
                    let (manager, name) = (manager.clone(), name.clone());
                    async move {
                        let lock = manager
                            .lock(name.as_bytes(), Duration::from_secs(30))
                            .await
                            .unwrap();
                        manager.unlock(&lock).await;
                    }
                }
            })
            .await;
            println!("| N = {n} | {c} | {h:.0} | {r:.0} | {:.2} |", h / r);
        }
    }
}

/// Pairs/s and the median of what `pair` returns (ms), one task.
async fn pairs_c1<F, Fut>(duration: Duration, mut pair: F) -> (f64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let mut latency = Histogram::<u64>::new(3).unwrap();
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < duration {
        let took = pair().await;
        latency.record(took.as_micros() as u64).unwrap();
        n += 1;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    (rate, latency.value_at_quantile(0.5) as f64 / 1000.0)
}

/// Pairs/s of `c` tasks, task `i` running the pair `make(i)` returns.
async fn concurrent_pairs<M, P, Fut>(c: usize, duration: Duration, make: M) -> f64
where
    M: Fn(usize) -> P,
    P: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let tasks: Vec<_> = (0..c)
        .map(|i| {
            let pair = make(i);
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    pair().await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// hasp's and the plain lock's pairs/s over rslock's, in one round.
type Ratios = (f64, f64);

/// The libraries W1 compares (the discriminant indexes their results).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Library {
    /// hasp's `Lock`.
    Hasp = 0,
    /// hasp's `PlainLock`.
    Plain = 1,
    Rslock = 2,
}

impl Library {
    /// The name `--client-pairs` takes.
    fn name(self) -> &'static str {
        match self {
            Library::Hasp => "hasp",
            Library::Plain => "plain",
            Library::Rslock => "rslock",
        }
    }

    fn named(name: &str) -> Option<Self> {
        [Library::Hasp, Library::Plain, Library::Rslock]
            .into_iter()
            .find(|l| l.name() == name)
    }

    /// W1 pairs/s of this library against the server at `url`.
    async fn w1(self, url: &str, c: usize, duration: Duration) -> f64 {
        self.pairs(url, c, Until::Time(Instant::now() + duration))
            .await
    }

    /// Lock/unlock pairs by `concurrency` tasks, each on its own name, until
    /// `until`: pairs/s.
    async fn pairs(self, url: &str, concurrency: usize, until: Until) -> f64 {
        match self {
            Library::Hasp | Library::Plain => {
                w1_hasp(url, concurrency, until, self == Library::Plain).await
            }
            Library::Rslock => w1_rslock(url, concurrency, until).await,
        }
    }
}

/// When a W1 task stops.
#[derive(Clone, Copy)]
enum Until {
    Time(Instant),
    /// After this many pairs per task.
    Pairs(u64),
}

impl Until {
    fn done(self, pairs: u64) -> bool {
        match self {
            Until::Time(at) => Instant::now() >= at,
            Until::Pairs(n) => pairs >= n,
        }
    }
}

/// Set by `--pin`: [`Server::start`] moves each server to CPU 0.
static PIN_SERVERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A server binary the benchmark runs against.
struct Server {
    name: &'static str,
    binary: Option<std::path::PathBuf>,
}

impl Server {
    fn start(&self) -> RedisServer {
        let server = RedisServer::start_with(testkit::ServerOptions {
            transport: testkit::Transport::Tcp,
            binary: self.binary.clone(),
            ..testkit::ServerOptions::default()
        });
        if PIN_SERVERS.load(std::sync::atomic::Ordering::Relaxed) {
            pin_to_cpu(server.pid().expect("server running"), 0);
        }
        server
    }

    fn binary(&self) -> std::path::PathBuf {
        self.binary
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("redis-server"))
    }
}

/// Redis 7.0 (Debian's `redis-server`), and Valkey 9.1 when
/// `scripts/ensure-valkey.sh` has fetched it (or `HASP_VALKEY_SERVER`
/// names a binary).
fn servers() -> Vec<Server> {
    let mut servers = vec![Server {
        name: "Redis 7.0",
        binary: None,
    }];
    let valkey = std::env::var_os("HASP_VALKEY_SERVER")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.cache/valkey-9.1.2/valkey-server")
        });
    if valkey.exists() {
        servers.push(Server {
            name: "Valkey 9.1",
            binary: Some(valkey),
        });
    } else {
        println!("(Valkey 9.1 not found: run scripts/ensure-valkey.sh; Redis 7.0 only)");
    }
    servers
}

/// `min–max, median` of `values`.
fn spread(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (min, max) = (sorted[0], sorted[sorted.len() - 1]);
    let median = if sorted.len() % 2 == 1 {
        sorted[sorted.len() / 2]
    } else {
        (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
    };
    format!("{min:.2}–{max:.2}, median {median:.2}")
}

/// One W1 measurement on a fresh server: pairs/s, then Redis's and this
/// process's CPU µs per pair.
async fn w1_measured(
    server: &Server,
    c: usize,
    duration: Duration,
    library: Library,
) -> (f64, f64, f64) {
    let server = server.start();
    let (cpu, me) = (server_cpu(&server), process_cpu("self"));
    let pairs = library.w1(&server.url(), c, duration).await;
    let total = pairs * duration.as_secs_f64();
    let server_us = (server_cpu(&server) - cpu) / total * 1e6;
    let client_us = (process_cpu("self") - me) / total * 1e6;
    (pairs, server_us, client_us)
}

/// W1 through a [`FaultProxy`] that delays every reply by `delay`: what
/// loopback hides, a network round trip that dwarfs every library's CPU
/// per call.
async fn w1_over_link(
    server: &Server,
    delay: Duration,
    c: usize,
    duration: Duration,
    library: Library,
) -> f64 {
    let server = server.start();
    let proxy = FaultProxy::start(&server);
    proxy.set(Direction::ToClient, Mode::Delay(delay));
    library.w1(&proxy.url(), c, duration).await
}

/// Section `tls`: W1 of each library against a TLS-only Redis 7.0 (the
/// Valkey 9.1 build the scripts fetch has no TLS), each measurement on a
/// fresh server, beside hasp on plain TCP in the same run.
async fn w1_tls_table(duration: Duration) {
    println!("\n## W1 over TLS: pairs/s against a `rediss://` Redis 7.0 (private CA, certificates verified)\n");
    println!("| C | hasp TCP | hasp TLS | plain TLS | rslock TLS | hasp TLS / TCP | hasp / rslock (TLS) | plain / rslock (TLS) | Redis CPU µs/pair TLS: hasp | rslock | client CPU µs/pair TLS: hasp | rslock |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let dir = std::env::temp_dir().join(format!("hasp-bench-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ca = testkit::TestCa::create(&dir).expect("a private CA (rcgen)");
    let redis = Server {
        name: "Redis 7.0",
        binary: None,
    };
    for c in W1_TLS_CONCURRENCY {
        let (tcp, _, _) = w1_measured(&redis, c, duration, Library::Hasp).await;
        let mut tls = [(0.0, 0.0, 0.0); 3];
        for library in [Library::Hasp, Library::Plain, Library::Rslock] {
            let server = RedisServer::start_with(testkit::ServerOptions {
                transport: testkit::Transport::Tcp,
                tls: Some(ca.server_options(false)),
                ..testkit::ServerOptions::default()
            });
            let (cpu, me) = (server_cpu(&server), process_cpu("self"));
            let until = Until::Time(Instant::now() + duration);
            let pairs = match library {
                Library::Rslock => {
                    let certificates = redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(std::fs::read(ca.ca_file()).expect("the CA file")),
                    };
                    let client = redis::Client::build_with_tls(server.url(), certificates)
                        .expect("a TLS client for rslock");
                    w1_rslock_with(LockManager::from_clients(vec![client]), c, until).await
                }
                _ => {
                    let tls = hasp::Tls::new().with_ca_file(ca.ca_file()).unwrap();
                    let settings = Settings::default().set_tls(tls);
                    w1_hasp_with(&server.url(), settings, c, until, library == Library::Plain).await
                }
            };
            let total = pairs * duration.as_secs_f64();
            tls[library as usize] = (
                pairs,
                (server_cpu(&server) - cpu) / total * 1e6,
                (process_cpu("self") - me) / total * 1e6,
            );
        }
        let [(h, h_cpu, h_me), (p, _, _), (r, r_cpu, r_me)] = tls;
        println!(
            "| {c} | {tcp:.0} | {h:.0} | {p:.0} | {r:.0} | {:.2} | {:.2} | {:.2} | {h_cpu:.1} | {r_cpu:.1} | {h_me:.1} | {r_me:.1} |",
            h / tcp,
            h / r,
            p / r
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

async fn w1_hasp(url: &str, concurrency: usize, until: Until, plain: bool) -> f64 {
    w1_hasp_with(url, Settings::default(), concurrency, until, plain).await
}

async fn w1_hasp_with(
    url: &str,
    mut settings: Settings,
    concurrency: usize,
    until: Until,
    plain: bool,
) -> f64 {
    if let Some(lanes) = std::env::var("HASP_BENCH_LANES")
        .ok()
        .and_then(|l| l.parse().ok())
    {
        settings = settings.set_lanes(lanes);
    }
    let client = Client::open_with(url, settings).await.unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let name = format!("w1-{i}");
            let (lock, plain) = if plain {
                (None, Some(client.plain_lock(&name).unwrap()))
            } else {
                (Some(client.lock(&name).unwrap()), None)
            };
            tokio::spawn(async move {
                let mut n = 0u64;
                while !until.done(n) {
                    match (&lock, &plain) {
                        (Some(lock), _) => lock.lock().await.unwrap().unlock().await.unwrap(),
                        (_, Some(plain)) => plain.lock().await.unwrap().unlock().await.unwrap(),
                        _ => unreachable!(),
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

async fn w1_rslock(url: &str, concurrency: usize, until: Until) -> f64 {
    w1_rslock_with(LockManager::new(vec![url.to_owned()]), concurrency, until).await
}

async fn w1_rslock_with(manager: LockManager, concurrency: usize, until: Until) -> f64 {
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|i| {
            let manager = manager.clone();
            let name = format!("w1-{i}");
            tokio::spawn(async move {
                let mut n = 0u64;
                while !until.done(n) {
                    let lock = manager
                        .lock(name.as_bytes(), Duration::from_secs(30))
                        .await
                        .unwrap();
                    manager.unlock(&lock).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// CPU seconds (user + system) the server process has used so far.
fn server_cpu(server: &RedisServer) -> f64 {
    process_cpu(&server.pid().expect("server running").to_string())
}

/// CPU seconds (user + system) of a process (`"self"` for this one).
fn process_cpu(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the
    // 12th and 13th of them, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// Lock/unlock pairs per `ri` measurement.
const RI_TOTAL: usize = 50_000;
/// Pairs per call in the `ri` measurements: as a busy client sends them,
/// and as an idle one does.
const RI_PER_CALL: [usize; 2] = [25, 1];

/// Pairs per client-driven `ri` measurement, and the client tasks.
const RI_CLIENT_PAIRS: u64 = 20_000;
const RI_CLIENT_CONCURRENCY: [usize; 2] = [1, 16];

/// Instructions `server` runs per lock/unlock pair as `library`'s own client
/// sends them (`c` tasks, each on its own name; hasp batches what its
/// tasks have pending, rslock sends each command on its own), counted by
/// callgrind, less what an idle server of the same binary runs. Includes
/// what each client does once (connecting, loading hasp's library,
/// asking what the server offers), spread over the pairs. `None` without
/// valgrind.
fn client_instructions(server: &Server, library: Library, c: usize) -> Option<f64> {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .ok()?;
    let idle = callgrind_server(server, |_, _| 0)?.0 as f64;
    let per_task = RI_CLIENT_PAIRS / c as u64;
    let runtime = tokio::runtime::Handle::current();
    let (total, pairs) = callgrind_server(server, |url, _| {
        tokio::task::block_in_place(|| {
            runtime.block_on(library.pairs(url, c, Until::Pairs(per_task)));
        });
        (per_task * c as u64) as usize
    })?;
    Some((total as f64 - idle) / pairs as f64)
}

/// A table of instructions per pair by each library, per server and
/// concurrency level, as `measure` counts them (`None`: no valgrind).
fn per_pair_table(servers: &[Server], measure: impl Fn(&Server, Library, usize) -> Option<f64>) {
    println!("| server | C | hasp | plain | rslock | hasp / rslock | plain / rslock |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for server in servers {
        for c in RI_CLIENT_CONCURRENCY {
            let measured: Option<Vec<f64>> = [Library::Hasp, Library::Plain, Library::Rslock]
                .into_iter()
                .map(|library| measure(server, library, c))
                .collect();
            match measured.as_deref() {
                Some(&[h, p, r]) => println!(
                    "| {} | {c} | {h:.0} | {p:.0} | {r:.0} | {:.2} | {:.2} |",
                    server.name,
                    h / r,
                    p / r
                ),
                _ => println!(
                    "| {} | {c} | skipped (needs valgrind) | | | | |",
                    server.name
                ),
            }
        }
    }
}

/// Pairs section `ci` runs per library and concurrency level.
const CI_PAIRS: u64 = 16_000;

/// Instructions the client process runs per lock/unlock pair by
/// `library` with `c` tasks against a fresh `server`: this benchmark run
/// again as that client alone (`--client-pairs`) under callgrind, less the
/// same run with no pairs (starting the runtime, connecting, loading
/// scripts). User space only: the kernel's share of a send or a receive is
/// not counted. `None` without valgrind.
fn client_side_instructions(server: &Server, library: Library, c: usize) -> Option<f64> {
    let exe = std::env::current_exe().ok()?;
    let server = server.start();
    let per_task = CI_PAIRS / c as u64;
    let run = |pairs: u64| -> Option<u64> {
        let out = std::env::temp_dir().join(format!(
            "hasp-client-callgrind-{}-{}-{c}-{pairs}.out",
            std::process::id(),
            library.name()
        ));
        let status = std::process::Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&exe)
            .arg("--client-pairs")
            .args([
                library.name(),
                &server.url(),
                &c.to_string(),
                &pairs.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        let total = status.success().then(|| callgrind_total(&out)).flatten();
        let _ = std::fs::remove_file(&out);
        total
    };
    let idle = run(0)?;
    let total = run(per_task)?;
    Some(total.saturating_sub(idle) as f64 / (per_task * c as u64) as f64)
}

/// The instructions a callgrind profile counted in all.
fn callgrind_total(profile: &std::path::Path) -> Option<u64> {
    let report = std::fs::read_to_string(profile).ok()?;
    report.lines().find_map(|l| {
        l.strip_prefix("summary: ")
            .or_else(|| l.strip_prefix("totals: "))
            .and_then(|n| n.trim().parse().ok())
    })
}

/// Instructions redis-server runs per lock/unlock pair, counted by callgrind
/// (a count, not a time: the same on a busy or an idle machine), with
/// `per_call` pairs per call: hasp's batch function with that many
/// operations per call, and rslock's commands pipelined that many at a
/// time. Each workload runs on its own server under valgrind; a server that
/// only starts and stops is subtracted. `None` without valgrind.
///
/// Also the floor under hasp's figure: the same calls, same keys and
/// arguments, made to a function that returns at once. What Redis spends
/// there (parsing the arguments, copying them into Lua, setting up and
/// tearing down a function call) no change to the batch function's body
/// can save.
fn redis_instructions(per_call: usize) -> Option<RedisInstructions> {
    std::process::Command::new("valgrind")
        .arg("--version")
        .output()
        .ok()?;
    let rounds = RI_TOTAL / per_call;
    let idle = callgrind_redis(|_| 0)?.0 as f64;
    let per_pair = |(total, pairs): (u64, usize)| (total as f64 - idle) / pairs as f64;
    // hasp's acquire and release calls; `function` replaces the batch
    // function's name when given.
    let calls = |function: Option<&str>| {
        let names: Vec<(String, String)> = (0..per_call)
            .map(|i| (format!("ri-{i}"), format!("c:bench:t{i}")))
            .collect();
        let call = |lease: Option<u64>| {
            let ops: Vec<(&str, &str, Option<u64>)> = names
                .iter()
                .map(|(name, owner)| (name.as_str(), owner.as_str(), lease))
                .collect();
            let args = hasp::__bench::batch_args("c:bench", "hasp", &ops).unwrap();
            let mut cmd = redis::Cmd::new();
            for (i, arg) in args.into_iter().enumerate() {
                match function {
                    // FCALL <function> <numkeys> ...
                    Some(name) if i == 1 => cmd.arg(name),
                    _ => cmd.arg(arg),
                };
            }
            cmd
        };
        (call(Some(30_000)), call(None))
    };
    let floor = callgrind_redis(|conn| {
        let empty = "#!lua name=hasp_floor\n\
            redis.register_function('hasp_floor', function(keys, args) return {1} end)";
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(empty)
            .query(conn)
            .unwrap();
        let (acquire, release) = calls(Some("hasp_floor"));
        for _ in 0..rounds {
            let _: redis::Value = acquire.query(conn).unwrap();
            let _: redis::Value = release.query(conn).unwrap();
        }
        rounds * per_call
    })
    .map(per_pair)?;
    let hasp = callgrind_redis(|conn| {
        let _: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(hasp::__bench::batch_library())
            .query(conn)
            .unwrap();
        let (acquire, release) = calls(None);
        for _ in 0..rounds {
            // A nonce repeats across rounds here; the script only stores it.
            let tokens: Vec<i64> = acquire.query(conn).unwrap();
            assert!(tokens.iter().all(|&t| t > 0), "acquired: {tokens:?}");
            let released: Vec<i64> = release.query(conn).unwrap();
            assert!(released.iter().all(|&r| r == 0), "released: {released:?}");
        }
        rounds * per_call
    })
    .map(per_pair)?;
    let rslock = callgrind_redis(|conn| {
        let unlock = "if redis.call('get', KEYS[1]) == ARGV[1] then \
            return redis.call('del', KEYS[1]) else return 0 end";
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(unlock)
            .query(conn)
            .unwrap();
        for round in 0..rounds {
            let (mut lock, mut release) = (redis::pipe(), redis::pipe());
            for i in 0..per_call {
                let (key, value) = (format!("ri-{i}"), format!("{round}-{i}"));
                lock.cmd("SET")
                    .arg(&key)
                    .arg(&value)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000);
                release
                    .cmd("EVALSHA")
                    .arg(&sha)
                    .arg(1)
                    .arg(&key)
                    .arg(&value);
            }
            let _: Vec<redis::Value> = lock.query(conn).unwrap();
            let released: Vec<i64> = release.query(conn).unwrap();
            assert!(released.iter().all(|&r| r == 1), "released: {released:?}");
        }
        rounds * per_call
    })
    .map(per_pair)?;
    Some(RedisInstructions {
        hasp,
        floor,
        rslock,
    })
}

/// Redis instructions per lock/unlock pair ([`redis_instructions`]).
struct RedisInstructions {
    /// hasp's batch function.
    hasp: f64,
    /// The same calls to a function that does nothing.
    floor: f64,
    /// rslock's commands.
    rslock: f64,
}

/// Runs `workload` against a fresh redis-server under callgrind and returns
/// the instructions the server ran in all, with the workload's pair count.
fn callgrind_redis(workload: impl FnOnce(&mut redis::Connection) -> usize) -> Option<(u64, usize)> {
    callgrind_server(
        &Server {
            name: "Redis 7.0",
            binary: None,
        },
        |_, conn| workload(conn),
    )
}

/// Runs `workload` (given the server's URL and a connection to it) against
/// a fresh `server` under callgrind and returns the instructions the server
/// ran in all, with the workload's pair count.
fn callgrind_server(
    server: &Server,
    workload: impl FnOnce(&str, &mut redis::Connection) -> usize,
) -> Option<(u64, usize)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .ok()?
        .port();
    let out =
        std::env::temp_dir().join(format!("hasp-callgrind-{}-{port}.out", std::process::id()));
    let mut server = std::process::Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(server.binary())
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let url = format!("redis://127.0.0.1:{port}/");
    let client = redis::Client::open(url.as_str()).ok()?;
    let started = Instant::now();
    let mut conn = loop {
        match client.get_connection() {
            Ok(conn) => break conn,
            Err(_) if started.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(_) => {
                let _ = server.kill();
                return None;
            }
        }
    };
    let pairs = workload(&url, &mut conn);
    // The server exits on SHUTDOWN without answering.
    let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut conn);
    server.wait().ok()?;
    let total = callgrind_total(&out);
    // HASP_RI_KEEP=1 keeps the profile, for `callgrind_annotate` to say
    // where the server's instructions went.
    if std::env::var_os("HASP_RI_KEEP").is_some() {
        println!("callgrind profile kept: {}", out.display());
    } else {
        let _ = std::fs::remove_file(&out);
    }
    Some((total?, pairs))
}

struct RedisBenchmark {
    acquire: f64,
    release: f64,
    release_hit_rate: f64,
}

impl RedisBenchmark {
    fn pairs(&self) -> f64 {
        1.0 / (1.0 / self.acquire + 1.0 / self.release)
    }
}

fn cli(server: &RedisServer, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(server.cli_args())
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn redis_benchmark_rate(server: &RedisServer, n: u64, keyspace: u64, command: &[&str]) -> f64 {
    let out = std::process::Command::new("redis-benchmark")
        .args(server.cli_args())
        .args(["-c", "1", "-P", "64", "-q", "--csv"])
        .args(["-n", &n.to_string(), "-r", &keyspace.to_string()])
        .args(command)
        .output()
        .expect("redis-benchmark (scripts/ensure-deps.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    // CSV: "test","rps",...; the second line holds the figures.
    text.lines()
        .nth(1)
        .and_then(|l| l.split(',').nth(1))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("unexpected redis-benchmark output: {text}"))
}

/// hasp's batch function (one operation per call, as an idle client
/// sends it), run by redis-benchmark. Acquire: random fresh names (the
/// free-lock path). Release: redis-benchmark cannot replay the acquired
/// names, so 1,000,000 held locks are created first and random ones are
/// released; the hit rate says how many took the full release path.
fn redis_benchmark_pairs(server: &RedisServer) -> RedisBenchmark {
    cli(
        server,
        &["FUNCTION", "LOAD", hasp::__bench::batch_library()],
    );
    // hasp's own argument layout, with redis-benchmark's placeholder in the
    // names.
    let args = |op: (&str, &str, Option<u64>)| -> Vec<String> {
        hasp::__bench::batch_args("client-1", "hasp", &[op])
            .unwrap()
            .into_iter()
            .map(|a| String::from_utf8(a).unwrap())
            .collect()
    };
    let n = 300_000;
    let acquire = args(("b:__rand_int__", "owner-1", Some(30_000)));
    let acquire: Vec<&str> = acquire.iter().map(String::as_str).collect();
    let acquire_rate = redis_benchmark_rate(server, n, 1_000_000_000, &acquire);
    cli(server, &["FLUSHALL"]);
    let keyspace = 1_000_000u64;
    let populate = "for i = 0, tonumber(ARGV[1]) - 1 do \
        local k = 'hasp:{r:' .. string.format('%012d', i) .. '}' \
        redis.call('set', k, '1 0000000000000000 - owner-1', 'PX', 600000) end";
    cli(server, &["EVAL", populate, "0", &keyspace.to_string()]);
    let before: u64 = cli(server, &["DBSIZE"]).parse().unwrap();
    let release_n = 100_000;
    let release = args(("r:__rand_int__", "owner-1", None));
    let release: Vec<&str> = release.iter().map(String::as_str).collect();
    let release_rate = redis_benchmark_rate(server, release_n, keyspace, &release);
    let after: u64 = cli(server, &["DBSIZE"]).parse().unwrap();
    RedisBenchmark {
        acquire: acquire_rate,
        release: release_rate,
        release_hit_rate: (before - after) as f64 / release_n as f64,
    }
}

struct W2Report {
    tasks: usize,
    acquisitions: u64,
    elapsed: Duration,
    hold: Histogram<u64>,
    handoff: Histogram<u64>,
    wait: Histogram<u64>,
    /// Per acquisition: how many others acquired while it waited.
    overtaken_by: Histogram<u64>,
    served: usize,
}

impl W2Report {
    fn print(&self, lib: &str, uncontended_pairs_per_sec: f64) {
        self.print_holders(lib, uncontended_pairs_per_sec, 1.0);
    }

    /// As `print`, for a lock `holders` can hold at once (a semaphore's
    /// permits): the ceiling is that many times one holder's.
    fn print_holders(&self, lib: &str, uncontended_pairs_per_sec: f64, holders: f64) {
        let rate = self.acquisitions as f64 / self.elapsed.as_secs_f64();
        // Ceiling: one hold (as actually slept) plus one uncontended
        // release + acquire (W1 at C = 1) per acquisition.
        let cycle = self.hold.mean() / 1e6 + 1.0 / uncontended_pairs_per_sec;
        let ceiling = holders / cycle;
        let us = |h: &Histogram<u64>, q: f64| {
            format!("{:.2} ms", h.value_at_quantile(q) as f64 / 1000.0)
        };
        println!(
            "| {lib} | {} | {rate:.0} | {ceiling:.0} | {:.0}% | {} | {} | {} | {} | {}/{} | {} |",
            self.tasks,
            100.0 * rate / ceiling,
            us(&self.handoff, 0.5),
            us(&self.handoff, 0.99),
            us(&self.wait, 0.99),
            format_args!("{:.2} ms", self.wait.max() as f64 / 1000.0),
            self.served,
            self.tasks,
            self.overtaken_by.max()
        );
    }
}

/// Runs W2 with any lock: `acquire` returns once held and yields a release.
async fn w2<A, AF, R, RF>(tasks: usize, duration: Duration, acquire: A) -> W2Report
where
    A: Fn() -> AF + Clone + Send + 'static,
    AF: std::future::Future<Output = R> + Send,
    R: FnOnce() -> RF + Send,
    RF: std::future::Future<Output = ()> + Send,
{
    let base = Instant::now();
    // When the last release returned (ns since base) and which acquisition
    // it ended (its index + 1; 0 = none yet).
    let last_release = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let acquired = Arc::new(AtomicU64::new(0)); // acquisitions so far
    let overtaken_by = Arc::new(Mutex::new(Histogram::<u64>::new(3).unwrap()));
    let histograms = Arc::new(Mutex::new((
        Histogram::<u64>::new(3).unwrap(),
        Histogram::<u64>::new(3).unwrap(),
        Histogram::<u64>::new(3).unwrap(),
    )));
    let deadline = base + duration;
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let acquire = acquire.clone();
            let last_release = last_release.clone();
            let histograms = histograms.clone();
            let (acquired, overtaken_by) = (acquired.clone(), overtaken_by.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    let before = acquired.load(Ordering::SeqCst);
                    let release = acquire().await;
                    let got = Instant::now();
                    let index = acquired.fetch_add(1, Ordering::SeqCst);
                    overtaken_by.lock().unwrap().record(index - before).unwrap();
                    // The hand-off from acquisition index - 1: zero if its
                    // release has not returned yet (a direct hand-off can
                    // make the heir the holder before the releaser's call
                    // returns).
                    let handoff = (index > 0).then(|| {
                        if last_release.1.load(Ordering::Acquire) == index {
                            let prev = last_release.0.load(Ordering::Acquire);
                            let since = got.duration_since(base).as_nanos() as u64;
                            since.saturating_sub(prev) / 1000
                        } else {
                            0
                        }
                    });
                    let held_from = Instant::now();
                    // tokio's timer has 1 ms granularity: `sleep(1 ms)` takes
                    // ~2 ms. Block this worker instead (one holder at a time,
                    // so at most one worker is blocked; block_in_place moves
                    // its other tasks away).
                    tokio::task::block_in_place(|| std::thread::sleep(W2_HOLD));
                    let hold = held_from.elapsed();
                    {
                        let mut h = histograms.lock().unwrap();
                        h.2.record((got - asked).as_micros() as u64).unwrap();
                        h.0.record(hold.as_micros() as u64).unwrap();
                        if let Some(handoff) = handoff {
                            h.1.record(handoff).unwrap();
                        }
                    }
                    release().await;
                    last_release
                        .0
                        .store(base.elapsed().as_nanos() as u64, Ordering::Release);
                    last_release.1.store(index + 1, Ordering::Release);
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut acquisitions = 0;
    let mut served = 0;
    for t in workers {
        let n = t.await.unwrap();
        acquisitions += n;
        served += usize::from(n > 0);
    }
    let elapsed = base.elapsed();
    let (hold, handoff, wait) = Arc::try_unwrap(histograms).unwrap().into_inner().unwrap();
    W2Report {
        tasks,
        acquisitions,
        elapsed,
        hold,
        handoff,
        wait,
        overtaken_by: Arc::try_unwrap(overtaken_by).unwrap().into_inner().unwrap(),
        served,
    }
}

/// Section a: what the adaptive lease saves (adaptive 5): renewal script
/// calls while many short sections run, watchdog mode beside adaptive mode.
async fn adaptive_renewals(duration: Duration) {
    println!("\n## a: renewal calls, 400 tasks, 5–50 ms sections, {duration:?}\n");
    println!("| mode | locks/s | renewal script calls | per second | lease |");
    println!("|---|---:|---:|---:|---:|");
    for adaptive in [false, true] {
        let server = RedisServer::start_tcp();
        let client = Client::open(&server.url()).await.unwrap();
        let deadline = Instant::now() + duration;
        let started = Instant::now();
        let tasks: Vec<_> = (0..400u64)
            .map(|t| {
                let lock = client.lock(&format!("a-{t}")).unwrap();
                let lock = if adaptive {
                    lock.with_adaptive_lease("a").unwrap()
                } else {
                    lock
                };
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        let guard = lock.lock().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(5 + (t * 7 + n * 13) % 46)).await;
                        guard.unlock().await.unwrap();
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut locks = 0;
        for task in tasks {
            locks += task.await.unwrap();
        }
        let elapsed = started.elapsed().as_secs_f64();
        let calls = client.stats().renew_calls;
        let lease = if adaptive {
            let learned = client.learned_lease("a").await.unwrap();
            format!("{:?} (learned)", learned.lease)
        } else {
            format!("{:?} (watchdog)", client.settings().watchdog_timeout())
        };
        println!(
            "| {} | {:.0} | {calls} | {:.2} | {lease} |",
            if adaptive { "adaptive" } else { "watchdog" },
            locks as f64 / elapsed,
            calls as f64 / elapsed
        );
    }
}

/// One lock/unlock pair of some kind, boxed so that the kinds share a row.
type Pair =
    Box<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// The kinds the family section measures.
const FAMILY: [&str; 5] = ["lock", "fair lock", "rw write", "rw read", "semaphore"];

/// A pair of `kind` on `name` through `client` (a semaphore's capacity must
/// be set already).
fn family_pair(client: &Client, kind: &str, name: &str) -> Pair {
    match kind {
        "lock" => {
            let lock = client.lock(name).unwrap();
            Box::new(move || {
                let lock = lock.clone();
                Box::pin(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
            })
        }
        "fair lock" => {
            let lock = client.fair_lock(name).unwrap();
            Box::new(move || {
                let lock = lock.clone();
                Box::pin(async move { lock.lock().await.unwrap().unlock().await.unwrap() })
            })
        }
        "rw write" => {
            let lock = client.rw_lock(name).unwrap();
            Box::new(move || {
                let lock = lock.clone();
                Box::pin(async move { lock.write().await.unwrap().unlock().await.unwrap() })
            })
        }
        "rw read" => {
            let lock = client.rw_lock(name).unwrap();
            Box::new(move || {
                let lock = lock.clone();
                Box::pin(async move { lock.read().await.unwrap().unlock().await.unwrap() })
            })
        }
        _ => {
            let semaphore = client.semaphore(name).unwrap();
            Box::new(move || {
                let semaphore = semaphore.clone();
                Box::pin(
                    async move { semaphore.acquire(1).await.unwrap().release().await.unwrap() },
                )
            })
        }
    }
}

/// Section f: the synchronizer family beside the basic lock (family 18,
/// family detail 39).
async fn family(duration: Duration, hasp_c1: f64) {
    println!("\n## f: the family, uncontended pairs/s (each task its own name)\n");
    println!("| kind | C = 1 | C = 64 | C = 64 / lock's |");
    println!("|---|---:|---:|---:|");
    let mut lock_64 = 0.0;
    for kind in FAMILY {
        let mut rates = Vec::new();
        for c in [1, 64] {
            let server = RedisServer::start_tcp();
            let client = Client::open(&server.url()).await.unwrap();
            if kind == "semaphore" {
                for i in 0..c {
                    let semaphore = client.semaphore(&format!("f-{i}")).unwrap();
                    semaphore.try_set_capacity(1).await.unwrap();
                }
            }
            let rate = concurrent_pairs(c, duration, |i| {
                family_pair(&client, kind, &format!("f-{i}"))
            })
            .await;
            rates.push(rate);
        }
        if kind == "lock" {
            lock_64 = rates[1];
        }
        println!(
            "| {kind} | {:.0} | {:.0} | {:.2} |",
            rates[0],
            rates[1],
            rates[1] / lock_64
        );
    }

    println!("\n## f: W2 contended, 32 tasks over 2 clients, one name, {W2_HOLD:?} hold\n");
    println!("| kind | tasks | acq/s | ceiling | % of ceiling | hand-off p50 | hand-off p99 | wait p99 | wait max | tasks served | most served during one wait |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let kinds = FAMILY
        .iter()
        .map(|&k| (k, 1u64))
        .chain(std::iter::once(("semaphore", 8)));
    for (kind, permits) in kinds {
        let server = RedisServer::start_tcp();
        let clients = [
            Client::open(&server.url()).await.unwrap(),
            Client::open(&server.url()).await.unwrap(),
        ];
        if kind == "semaphore" {
            let semaphore = clients[0].semaphore("w2").unwrap();
            semaphore.try_set_capacity(permits).await.unwrap();
        }
        // Each call takes the next client: both clients contend.
        let turn = Arc::new(AtomicU64::new(0));
        let handles = Arc::new(FamilyHandles::new(&clients, kind));
        let report = w2(32, duration * 2, move || {
            let (handles, turn) = (handles.clone(), turn.clone());
            async move {
                let i = (turn.fetch_add(1, Ordering::Relaxed) % 2) as usize;
                handles.acquire(i).await
            }
        })
        .await;
        let label = if kind == "semaphore" {
            format!("semaphore ({permits} permits)")
        } else {
            kind.to_owned()
        };
        report.print_holders(&label, hasp_c1, permits as f64);
    }
}

/// Handles of every kind on the name "w2" through two clients, for W2.
struct FamilyHandles {
    kind: &'static str,
    locks: Vec<hasp::Lock>,
    fair: Vec<hasp::FairLock>,
    rw: Vec<hasp::RwLock>,
    semaphores: Vec<hasp::Semaphore>,
}

/// What a W2 acquisition gives back to release.
enum Held {
    Guard(hasp::Guard),
    Read(hasp::ReadGuard),
    Write(hasp::WriteGuard),
    Permit(hasp::Permit),
}

impl FamilyHandles {
    fn new(clients: &[Client; 2], kind: &str) -> Self {
        let kind = FAMILY
            .iter()
            .copied()
            .find(|k| *k == kind)
            .unwrap_or("semaphore");
        Self {
            kind,
            locks: clients.iter().map(|c| c.lock("w2").unwrap()).collect(),
            fair: clients.iter().map(|c| c.fair_lock("w2").unwrap()).collect(),
            rw: clients.iter().map(|c| c.rw_lock("w2").unwrap()).collect(),
            semaphores: clients.iter().map(|c| c.semaphore("w2").unwrap()).collect(),
        }
    }

    async fn acquire(
        &self,
        i: usize,
    ) -> impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send
    {
        let held = match self.kind {
            "lock" => Held::Guard(self.locks[i].lock().await.unwrap()),
            "fair lock" => Held::Guard(self.fair[i].lock().await.unwrap()),
            "rw write" => Held::Write(self.rw[i].write().await.unwrap()),
            "rw read" => Held::Read(self.rw[i].read().await.unwrap()),
            _ => Held::Permit(self.semaphores[i].acquire(1).await.unwrap()),
        };
        move || -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
            Box::pin(async move {
                match held {
                    Held::Guard(g) => g.unlock().await.unwrap(),
                    Held::Read(g) => g.unlock().await.unwrap(),
                    Held::Write(g) => g.unlock().await.unwrap(),
                    Held::Permit(p) => p.release().await.unwrap(),
                }
            })
        }
    }
}

async fn renewal_cost(server: &RedisServer) -> (u64, u64) {
    let settings = Settings::default().set_watchdog_timeout(Duration::from_secs(3));
    let client = Client::open_with(&server.url(), settings).await.unwrap();
    let locks: Vec<_> = (0..10_000)
        .map(|i| client.lock(&format!("c-{i}")).unwrap())
        .collect();
    let mut guards = Vec::new();
    for chunk in locks.chunks(1000) {
        for g in futures_util::future::join_all(chunk.iter().map(|l| l.lock())).await {
            guards.push(g.unwrap());
        }
    }
    let fcalls = || -> u64 {
        cli(server, &["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    // Count whole periods: from just after one round to just after another.
    let period = Duration::from_secs(1);
    let start_round = client.stats().renew_calls;
    while client.stats().renew_calls == start_round {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // let the round finish
    let before = fcalls();
    tokio::time::sleep(period * 3).await;
    let after = fcalls();
    for g in guards {
        g.unlock().await.unwrap();
    }
    (after - before, 3)
}
