//! Client processes the tests kill: this test binary run again as a child
//! (`child::child_process`, ignored when run directly), its role and
//! arguments passed in the environment. A child prints lines the parent
//! waits for.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hasp::Settings;
use tokio::sync::mpsc;

use crate::helpers::open;

/// A child process of this test binary, killed when dropped.
pub struct ChildProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ChildProcess {
    /// Starts a child in `role` against the deployment at `urls`, with
    /// `args` (the role's own, comma-separated).
    pub fn spawn(role: &str, urls: &[String], args: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child::child_process",
                "--ignored",
                "--nocapture",
            ])
            .env("HASP_CHILD_ROLE", role)
            .env("HASP_CHILD_URLS", urls.join(","))
            .env(crate::helpers::CA_FILE_VAR, crate::helpers::ca_file())
            .env("HASP_CHILD_ARGS", args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a child process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits (at most `limit`) for a line starting with `prefix`; returns it.
    pub async fn wait_for(&mut self, prefix: &str, limit: Duration) -> String {
        let found = tokio::time::timeout(limit, async {
            while let Some(line) = self.lines.recv().await {
                if line.starts_with(prefix) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!("the child never printed {prefix:?}"),
        }
    }

    /// Kills the child and returns every line it printed (not yet read)
    /// that starts with one of `prefixes`.
    pub async fn kill_and_collect(&mut self, prefixes: &[&str]) -> Vec<String> {
        self.kill();
        let mut lines = Vec::new();
        // The reader thread reaches the end of the pipe, then closes.
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_secs(5), self.lines.recv()).await
        {
            if prefixes.iter().any(|p| line.starts_with(p)) {
                lines.push(line);
            }
        }
        lines
    }

    /// SIGKILL, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The child's side: runs the role named in the environment.
#[tokio::test]
#[ignore = "helper run in a child process by other tests"]
async fn child_process() {
    let Ok(role) = std::env::var("HASP_CHILD_ROLE") else {
        return;
    };
    let urls: Vec<String> = std::env::var("HASP_CHILD_URLS")
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    let args = std::env::var("HASP_CHILD_ARGS").unwrap_or_default();
    let args: Vec<&str> = args.split(',').collect();
    let settings = Settings::default()
        .set_watchdog_timeout(Duration::from_millis(900))
        .set_waiter_ttl(Duration::from_millis(900));
    let client = open(&urls, settings).await.unwrap();
    match role.as_str() {
        // args: semaphore name, permits. Holds them (watchdog) until killed.
        "hold-permits" => {
            let semaphore = client.semaphore(args[0]).unwrap();
            let permits = args[1].parse().unwrap();
            let permit = semaphore.acquire(permits).await.unwrap();
            println!("HELD {}", permit.permits());
            std::future::pending::<()>().await;
        }
        // args: semaphore name, permits. Waits for them until killed.
        "wait-permits" => {
            let semaphore = client.semaphore(args[0]).unwrap();
            let permits = args[1].parse().unwrap();
            let waiting = semaphore.acquire(permits);
            println!("WAITING");
            let permit = waiting.await.unwrap();
            println!("HELD {}", permit.permits());
            std::future::pending::<()>().await;
        }
        // args: fair lock name. Waits for it until killed.
        "wait-fair" => {
            let lock = client.fair_lock(args[0]).unwrap();
            let waiting = lock.lock();
            println!("WAITING");
            let guard = waiting.await.unwrap();
            println!("HELD {}", guard.fencing_token());
            std::future::pending::<()>().await;
        }
        // args: rw lock name, holder label. Holds a read until killed.
        "hold-read" => {
            let lock = client.rw_lock(args[0]).unwrap();
            let guard = lock.read().await.unwrap();
            println!("HELD {}", guard.fencing_token());
            std::future::pending::<()>().await;
        }
        // args: rw lock name, holder label. Reads and writes in turn (one
        // in four a write), printing `IN`/`OUT` lines with the monotonic
        // time, until killed.
        "rw-worker" => {
            let lock = client.rw_lock(args[0]).unwrap();
            println!("READY");
            for round in 0u64.. {
                let write = round.is_multiple_of(4);
                let side = if write { "w" } else { "r" };
                let holder = format!("{}-{round}", args[1]);
                if write {
                    let guard = lock.write().await.unwrap();
                    println!("IN {side} {holder} {}", testkit::now_us());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    println!("OUT {side} {holder} {}", testkit::now_us());
                    guard.unlock().await.unwrap();
                } else {
                    let guard = lock.read().await.unwrap();
                    println!("IN {side} {holder} {}", testkit::now_us());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    println!("OUT {side} {holder} {}", testkit::now_us());
                    guard.unlock().await.unwrap();
                }
            }
        }
        other => panic!("unknown child role {other}"),
    }
}
