//! Client processes the scenarios kill, pause and restart: this test binary
//! run again as a child (`child_process`, ignored when run directly), its
//! role and settings passed in the environment. A child prints its history
//! as event lines (`testkit::Event`) and other lines the parent waits for.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasp::{Client, Settings};
use testkit::{now_us, Event, History};
use tokio::sync::mpsc;

/// A child process of this test binary, killed when dropped.
pub struct ChildProcess {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ChildProcess {
    /// Starts a child in `role` with `env`; its event lines go to `history`.
    pub fn spawn(role: &str, env: &[(&str, String)], history: &History) -> Self {
        Self::spawn_logged(role, env, history, None)
    }

    /// As [`spawn`](Self::spawn), and every line that is not an event is
    /// also appended to `log`.
    pub fn spawn_logged(
        role: &str,
        env: &[(&str, String)],
        history: &History,
        log: Option<Arc<Mutex<Vec<String>>>>,
    ) -> Self {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "child::child_process",
                "--ignored",
                "--nocapture",
            ])
            .env("HASP_CHILD_ROLE", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn a child process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        let history = history.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                history.extend_from_lines([line.as_str()]);
                if let (Some(log), false) = (&log, line.starts_with("EV ")) {
                    log.lock().unwrap().push(line.clone());
                }
                if tx.send(line).is_err() {
                    // Nobody reads the lines any more: keep the history.
                }
            }
        });
        Self { child, lines }
    }

    /// The next line that starts with `prefix` (others are skipped).
    pub async fn line(&mut self, prefix: &str, limit: Duration) -> String {
        let wait = async {
            loop {
                match self.lines.recv().await {
                    Some(line) if line.starts_with(prefix) => return line,
                    Some(_) => {}
                    None => panic!("the child exited before printing {prefix:?}"),
                }
            }
        };
        tokio::time::timeout(limit, wait)
            .await
            .unwrap_or_else(|_| panic!("no {prefix:?} line from the child within {limit:?}"))
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal}");
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes the process (SIGSTOP).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a frozen process (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes the process's standard input (the mix role finishes then).
    pub fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Asks the process to finish (closes its standard input) and waits for
    /// it to exit, at most `limit`; kills it past that. True if it exited
    /// by itself.
    pub fn finish(&mut self, limit: Duration) -> bool {
        drop(self.child.stdin.take());
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| panic!("{key} is not set"))
}

fn env_ms(key: &str) -> Option<Duration> {
    std::env::var(key)
        .ok()
        .map(|v| Duration::from_millis(v.parse().unwrap()))
}

/// When `guard`'s belief ended, on the clock of [`now_us`] (its
/// `valid_until` is an `Instant`, which no other process can read).
pub fn belief_end_us(guard: &hasp::Guard) -> u64 {
    let (now, now_us) = (std::time::Instant::now(), now_us());
    let until = guard.valid_until();
    if until <= now {
        now_us - (now - until).as_micros() as u64
    } else {
        now_us + (until - now).as_micros() as u64
    }
}

fn print(event: Event) {
    println!("{}", event.to_line());
}

/// Not a test of its own: the scenarios run it in child processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in a child process by the fault scenarios"]
async fn child_process() {
    let Ok(role) = std::env::var("HASP_CHILD_ROLE") else {
        return;
    };
    let mut settings = Settings::default();
    if let Some(watchdog) = env_ms("HASP_CHILD_WATCHDOG_MS") {
        settings = settings
            .set_watchdog_timeout(watchdog)
            .set_response_timeout(watchdog / 2);
    }
    let client = Client::open_with(&env("HASP_CHILD_URL"), settings)
        .await
        .unwrap();
    match role.as_str() {
        "hold" => hold(&client).await,
        "careless" => careless(&client).await,
        "mix" => crate::mix::child(client).await,
        other => panic!("unknown child role {other}"),
    }
}

/// Takes the lock and holds it until killed.
async fn hold(client: &Client) {
    let mut lock = client.lock(&env("HASP_CHILD_LOCK")).unwrap();
    if let Some(lease) = env_ms("HASP_CHILD_LEASE_MS") {
        lock = lock.with_lease(lease).unwrap();
    }
    let guard = lock.lock().await.unwrap();
    println!("HELD {}", guard.fencing_token());
    std::future::pending::<()>().await;
}

/// Takes the lock, then writes once without checking that it still holds
/// it (a write already under way when the process froze), then checks.
async fn careless(client: &Client) {
    let holder = format!("child-{}", std::process::id());
    let lock = client.lock(&env("HASP_CHILD_LOCK")).unwrap();
    let guard = lock.lock().await.unwrap();
    let token = guard.fencing_token();
    print(Event::Acquired {
        holder: holder.clone(),
        token,
        at: now_us(),
    });
    println!("HELD {token}");
    tokio::time::sleep(Duration::from_millis(300)).await; // frozen in here
    let resource = env("HASP_CHILD_LOCK");
    let accepted = testkit::write_at(&env("HASP_CHILD_REGISTER"), &resource, &holder, token).await;
    print(Event::Wrote {
        holder: holder.clone(),
        token,
        accepted,
        at: now_us(),
    });
    let lost = guard.is_lost();
    if lost {
        print(Event::Lost {
            holder,
            at: belief_end_us(&guard),
        });
    }
    println!("DONE lost={lost}");
    std::future::pending::<()>().await;
}
