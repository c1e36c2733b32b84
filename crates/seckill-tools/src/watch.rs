//! `seckill-tools watch`: many pages watching at once. Opens `--count`
//! connections to an instance's live stream (`GET /api/live`, raw HTTP/1.1
//! over TCP: a watcher costs this process one socket and a small buffer),
//! keeps them open for `--duration`, counts the events they receive, and
//! reports how many stayed open. For the watchers benchmark
//! (`scripts/bench-watchers.sh`), beside `bench` and the instance's own
//! figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Options of `seckill-tools watch`.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// The instance (`http://host:port`).
    #[arg(long)]
    pub url: String,
    /// Streams to keep open.
    #[arg(long, default_value_t = 5_000)]
    pub count: usize,
    /// How long to keep them open.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub duration: Duration,
}

#[derive(Debug, Default)]
struct Tally {
    open: AtomicU64,
    events: AtomicU64,
    refused: AtomicU64,
}

/// Runs the watchers; `Ok(false)` if fewer than all of them opened.
///
/// # Errors
/// For a URL that is not `http://host:port`.
pub async fn run(args: WatchArgs) -> anyhow::Result<bool> {
    let address = args
        .url
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/').to_owned())
        .filter(|a| !a.is_empty() && !a.contains('/'))
        .ok_or_else(|| anyhow::anyhow!("--url must be http://host:port"))?;
    let tally = Arc::new(Tally::default());
    let deadline = tokio::time::Instant::now() + args.duration;
    let mut watchers = tokio::task::JoinSet::new();
    for _ in 0..args.count {
        let (address, tally) = (address.clone(), tally.clone());
        watchers.spawn(async move {
            let _ = tokio::time::timeout_at(deadline, watch(&address, &tally)).await;
        });
        // Opening thousands at once would look like a flood to the
        // listener's backlog: a few hundred a second.
        if watchers.len() % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Counted a second before the end, while every watcher still holds on.
    tokio::time::sleep_until(deadline - Duration::from_secs(1).min(args.duration / 2)).await;
    let open = tally.open.load(Ordering::Relaxed);
    while watchers.join_next().await.is_some() {}
    println!(
        "watchers: {open} of {} open at the end, {} refused, {} events received",
        args.count,
        tally.refused.load(Ordering::Relaxed),
        tally.events.load(Ordering::Relaxed)
    );
    Ok(open as usize == args.count)
}

/// One watcher: the request, then every event counted until the stream
/// ends or the caller's deadline drops it.
async fn watch(address: &str, tally: &Tally) {
    let Ok(mut stream) = TcpStream::connect(address).await else {
        tally.refused.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let request =
        format!("GET /api/live HTTP/1.1\r\nhost: {address}\r\naccept: text/event-stream\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        tally.refused.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut buffer = vec![0u8; 4096];
    let mut head = true;
    let mut guard = OpenGuard {
        tally,
        opened: false,
    };
    loop {
        let n = match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buffer[..n];
        if head {
            head = false;
            if !chunk.starts_with(b"HTTP/1.1 200") {
                tally.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            guard.open();
        }
        let events = chunk.windows(7).filter(|w| w == b"figures").count();
        tally.events.fetch_add(events as u64, Ordering::Relaxed);
    }
}

/// Counts a watcher open from its first answer until it ends or is
/// dropped.
struct OpenGuard<'a> {
    tally: &'a Tally,
    opened: bool,
}

impl OpenGuard<'_> {
    fn open(&mut self) {
        self.opened = true;
        self.tally.open.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        if self.opened {
            self.tally.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
