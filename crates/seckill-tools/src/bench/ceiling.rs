//! The HTTP ceiling: what the same closed loop gets from the service's
//! cheapest route (`GET /healthz`: no Redis, no database, no token), to put
//! the purchase throughput beside.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Requests per second of `concurrency` workers asking `/healthz` of the
/// `bases` round-robin for `length`; failed requests are not counted.
pub async fn measure(
    http: &reqwest::Client,
    bases: &[String],
    concurrency: usize,
    length: Duration,
) -> f64 {
    let urls: Arc<Vec<String>> = Arc::new(bases.iter().map(|b| format!("{b}/healthz")).collect());
    let answered = Arc::new(AtomicU64::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + length;
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (http, urls, answered, next) =
                (http.clone(), urls.clone(), answered.clone(), next.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let ok = http
                        .get(&urls[i % urls.len()])
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success());
                    if ok {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.await;
    }
    answered.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
