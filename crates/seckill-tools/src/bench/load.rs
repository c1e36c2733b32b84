//! The load generator: purchase requests against one or several service
//! instances, closed or open loop, and everything they answered.
//!
//! Closed loop: a fixed number of workers, each sending its next request
//! when the previous one returns. Latency is each request's own round trip;
//! a slow server slows the senders down, which is what a fixed population
//! of clients does, but hides queueing from the numbers.
//!
//! Open loop: requests are scheduled at a fixed rate, whatever the server
//! does. Latency counts from the *scheduled* send time, so a request that
//! could not go out on time (every connection busy, the in-flight cap
//! reached) is charged for its wait — the correction for coordinated
//! omission. The plain round trip is kept beside it as service time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// This many requests always in flight.
    Closed {
        /// Workers, each with one request in flight.
        concurrency: usize,
    },
    /// Requests scheduled at a fixed rate.
    Open {
        /// Requests per second.
        rate: f64,
        /// Requests in flight at most; later ones wait (and are charged).
        max_in_flight: usize,
    },
}

/// When the load stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// No request is started after this long.
    Elapsed(Duration),
    /// This many requests in all.
    Requests(u64),
}

/// One load run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Purchase URLs, one per service instance; request `i` goes to
    /// `targets[i % len]`.
    pub targets: Vec<String>,
    /// One bearer token per simulated user (user id = index + 1).
    pub user_tokens: Arc<Vec<String>>,
    /// Closed or open loop.
    pub arrival: Arrival,
    /// Duration or request count.
    pub until: Until,
}

/// An accepted purchase as the service answered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptedOrder {
    /// The buyer.
    pub user_id: i64,
    /// The order id the service returned.
    pub order_id: i64,
    /// `pending` (the async path: on its way to the database) rather than
    /// `reserved` (the sync path: already stored).
    pub pending: bool,
}

/// What one request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx with an order.
    Accepted(AcceptedOrder),
    /// A refusal the service explained (its JSON `code`: `sold_out`,
    /// `already_bought`, `sale_ended`, ...).
    Refused(String),
    /// 429.
    RateLimited,
    /// No usable answer, and the request may have been made: a timeout, a
    /// connection broken after sending, a 5xx, an unreadable body. The
    /// purchase may or may not have happened (an unknown outcome).
    Failed(String),
    /// The request never reached the service (connection refused): the
    /// purchase certainly did not happen.
    NotSent(String),
}

impl Outcome {
    /// The name this outcome is counted under.
    pub fn key(&self) -> String {
        match self {
            Outcome::Accepted(_) => "accepted".into(),
            Outcome::Refused(code) => code.clone(),
            Outcome::RateLimited => "rate_limited".into(),
            Outcome::Failed(why) | Outcome::NotSent(why) => format!("error: {why}"),
        }
    }
}

/// Counts for one target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetTally {
    /// Requests answered (or failed).
    pub requests: u64,
    /// Of which accepted.
    pub accepted: u64,
    /// Of which failed.
    pub errors: u64,
}

/// Requests completed during one second of the run.
#[derive(Debug, Clone)]
pub struct Second {
    /// Accepted purchases.
    pub accepted: u64,
    /// Refusals (sold out, already bought, ...).
    pub refused: u64,
    /// 429s.
    pub rate_limited: u64,
    /// Failures.
    pub errors: u64,
    /// Latency of the requests completed in this second, µs.
    pub latency: Histogram<u64>,
}

impl Second {
    fn new() -> Self {
        Self {
            accepted: 0,
            refused: 0,
            rate_limited: 0,
            errors: 0,
            // Two significant digits are plenty for a per-second line and
            // keep a long run's timeline small.
            latency: Histogram::new_with_bounds(1, LATENCY_CEILING_US, 2).expect("valid bounds"),
        }
    }

    /// Requests completed in this second.
    pub fn completed(&self) -> u64 {
        self.accepted + self.refused + self.rate_limited + self.errors
    }
}

/// Everything a run saw.
#[derive(Debug, Clone)]
pub struct Record {
    /// The plan it ran.
    pub arrival: Arrival,
    /// From the first send to the last answer.
    pub elapsed: Duration,
    /// Requests by outcome key ([`Outcome::key`]).
    pub outcomes: BTreeMap<String, u64>,
    /// Per target, in the plan's order.
    pub per_target: Vec<TargetTally>,
    /// Latency, µs: from the scheduled send in open loop (corrected for
    /// coordinated omission), from the actual send in closed loop.
    pub latency: Histogram<u64>,
    /// Round trip from the actual send, µs.
    pub service_time: Histogram<u64>,
    /// One entry per second of the run.
    pub timeline: Vec<Second>,
    /// The accepted purchases.
    pub orders: Vec<AcceptedOrder>,
    /// Users whose purchase has an unknown outcome ([`Outcome::Failed`]):
    /// each may or may not have bought.
    pub unknown_users: Vec<i64>,
}

impl Record {
    /// Requests sent.
    pub fn requests(&self) -> u64 {
        self.outcomes.values().sum()
    }

    /// Requests counted under `key`.
    pub fn count(&self, key: &str) -> u64 {
        self.outcomes.get(key).copied().unwrap_or(0)
    }

    /// Failed requests.
    pub fn errors(&self) -> u64 {
        self.outcomes
            .iter()
            .filter(|(key, _)| key.starts_with("error"))
            .map(|(_, n)| n)
            .sum()
    }

    /// Refused requests (any refusal code).
    pub fn refused(&self) -> u64 {
        self.requests() - self.orders.len() as u64 - self.count("rate_limited") - self.errors()
    }

    /// A record of `orders` accepted, `unknown_users` with lost answers and
    /// `outcomes` counted, for tests of the checks.
    #[cfg(test)]
    pub fn of(
        orders: Vec<AcceptedOrder>,
        unknown_users: Vec<i64>,
        outcomes: &[(&str, u64)],
    ) -> Self {
        Self {
            arrival: Arrival::Closed { concurrency: 1 },
            elapsed: Duration::from_secs(1),
            outcomes: outcomes.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            per_target: Vec::new(),
            latency: histogram(),
            service_time: histogram(),
            timeline: Vec::new(),
            orders,
            unknown_users,
        }
    }

    /// Appends a second with `accepted` and `refused` completions, for tests.
    #[cfg(test)]
    pub fn push_second(&mut self, accepted: u64, refused: u64) {
        let mut second = Second::new();
        second.accepted = accepted;
        second.refused = refused;
        self.timeline.push(second);
    }

    /// Requests per second over the run.
    pub fn throughput(&self) -> f64 {
        self.requests() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Latencies above this (µs) are recorded as this.
const LATENCY_CEILING_US: u64 = 3_600_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_CEILING_US, 3).expect("valid bounds")
}

/// Spreads consecutive requests over the users: request `i` is user
/// `i * STRIDE mod users`, a permutation of each block of `users` requests
/// (the stride is prime and larger than any population we accept), so
/// every user asks equally often and a user's requests are far apart.
const USER_STRIDE: u64 = 2_147_483_647;

/// Most users a plan may have (see [`USER_STRIDE`]).
pub const MAX_USERS: u64 = 10_000_000;

fn user_of(i: u64, users: u64) -> usize {
    ((u128::from(i) * u128::from(USER_STRIDE)) % u128::from(users)) as usize
}

/// Live counters, for the progress bar.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests answered or failed so far.
    pub completed: AtomicU64,
    /// Accepted so far.
    pub accepted: AtomicU64,
    /// Failed so far.
    pub errors: AtomicU64,
}

struct Tallies {
    outcomes: BTreeMap<String, u64>,
    per_target: Vec<TargetTally>,
    latency: Histogram<u64>,
    service_time: Histogram<u64>,
    timeline: Vec<Second>,
    orders: Vec<AcceptedOrder>,
    unknown_users: Vec<i64>,
}

/// Shared by every request of a run.
struct Run {
    http: reqwest::Client,
    plan: Plan,
    started: Instant,
    tallies: Mutex<Tallies>,
    progress: Arc<Progress>,
}

impl Run {
    /// Sends request `i`, whose scheduled time was `due`, and records it.
    async fn request(&self, i: u64, due: Instant) {
        let target = (i % self.plan.targets.len() as u64) as usize;
        let user = user_of(i, self.plan.user_tokens.len() as u64);
        let sent = Instant::now();
        let outcome = self.purchase(target, user).await;
        let done = Instant::now();
        self.record(target, due, sent, done, user as i64 + 1, outcome);
    }

    async fn purchase(&self, target: usize, user: usize) -> Outcome {
        #[derive(Deserialize)]
        struct Order {
            order_id: String,
            state: String,
        }
        #[derive(Deserialize)]
        struct Refusal {
            code: String,
        }
        let response = match self
            .http
            .post(&self.plan.targets[target])
            .bearer_auth(&self.plan.user_tokens[user])
            .send()
            .await
        {
            Ok(response) => response,
            Err(e) if e.is_timeout() => return Outcome::Failed("timeout".into()),
            Err(e) if e.is_connect() => return Outcome::NotSent("connect".into()),
            Err(_) => return Outcome::Failed("transport".into()),
        };
        let status = response.status();
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Outcome::RateLimited;
        }
        let Ok(body) = response.bytes().await else {
            return Outcome::Failed("transport".into());
        };
        if status.is_success() {
            return match serde_json::from_slice::<Order>(&body) {
                Ok(order) => match order.order_id.parse() {
                    Ok(order_id) => Outcome::Accepted(AcceptedOrder {
                        user_id: user as i64 + 1,
                        order_id,
                        pending: order.state == "pending",
                    }),
                    Err(_) => Outcome::Failed("bad order id".into()),
                },
                Err(_) => Outcome::Failed("unreadable body".into()),
            };
        }
        if status.is_client_error() {
            if let Ok(refusal) = serde_json::from_slice::<Refusal>(&body) {
                return Outcome::Refused(refusal.code);
            }
        }
        Outcome::Failed(format!("HTTP {}", status.as_u16()))
    }

    fn record(
        &self,
        target: usize,
        due: Instant,
        sent: Instant,
        done: Instant,
        user_id: i64,
        outcome: Outcome,
    ) {
        let latency = done.duration_since(due).as_micros() as u64;
        let service_time = done.duration_since(sent).as_micros() as u64;
        let second = done.duration_since(self.started).as_secs() as usize;
        let progress = &self.progress;
        progress.completed.fetch_add(1, Ordering::Relaxed);
        let mut t = self.tallies.lock().expect("tallies lock");
        t.latency.saturating_record(latency.max(1));
        t.service_time.saturating_record(service_time.max(1));
        while t.timeline.len() <= second {
            t.timeline.push(Second::new());
        }
        let this_second = &mut t.timeline[second];
        this_second.latency.saturating_record(latency.max(1));
        let tally = &mut t.per_target[target];
        tally.requests += 1;
        match &outcome {
            Outcome::Accepted(order) => {
                t.per_target[target].accepted += 1;
                t.timeline[second].accepted += 1;
                t.orders.push(*order);
                progress.accepted.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Refused(_) => t.timeline[second].refused += 1,
            Outcome::RateLimited => t.timeline[second].rate_limited += 1,
            Outcome::Failed(_) | Outcome::NotSent(_) => {
                if matches!(outcome, Outcome::Failed(_)) {
                    t.unknown_users.push(user_id);
                }
                t.per_target[target].errors += 1;
                t.timeline[second].errors += 1;
                progress.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        *t.outcomes.entry(outcome.key()).or_default() += 1;
    }

    fn finish(self: Arc<Self>) -> Record {
        let elapsed = self.started.elapsed();
        let t = std::mem::replace(
            &mut *self.tallies.lock().expect("tallies lock"),
            Tallies::new(0),
        );
        Record {
            arrival: self.plan.arrival,
            elapsed,
            outcomes: t.outcomes,
            per_target: t.per_target,
            latency: t.latency,
            service_time: t.service_time,
            timeline: t.timeline,
            orders: t.orders,
            unknown_users: t.unknown_users,
        }
    }
}

impl Tallies {
    fn new(targets: usize) -> Self {
        Self {
            outcomes: BTreeMap::new(),
            per_target: vec![TargetTally::default(); targets],
            latency: histogram(),
            service_time: histogram(),
            timeline: Vec::new(),
            orders: Vec::new(),
            unknown_users: Vec::new(),
        }
    }
}

/// Runs `plan` with `http`; `progress` is updated as requests complete.
///
/// A request that fails is counted, never retried, and never stops the run.
pub async fn run(http: reqwest::Client, plan: Plan, progress: Arc<Progress>) -> Record {
    assert!(!plan.targets.is_empty() && !plan.user_tokens.is_empty());
    let started = Instant::now();
    let deadline = match plan.until {
        Until::Elapsed(d) => Some(started + d),
        Until::Requests(_) => None,
    };
    let limit = match plan.until {
        Until::Requests(n) => n,
        Until::Elapsed(_) => u64::MAX,
    };
    let arrival = plan.arrival;
    let run = Arc::new(Run {
        http,
        tallies: Mutex::new(Tallies::new(plan.targets.len())),
        plan,
        started,
        progress,
    });
    match arrival {
        Arrival::Closed { concurrency } => {
            let next = Arc::new(AtomicU64::new(0));
            let workers: Vec<_> = (0..concurrency)
                .map(|_| {
                    let (run, next) = (run.clone(), next.clone());
                    tokio::spawn(async move {
                        loop {
                            let now = Instant::now();
                            if deadline.is_some_and(|d| now >= d) {
                                break;
                            }
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= limit {
                                break;
                            }
                            run.request(i, now).await;
                        }
                    })
                })
                .collect();
            for worker in workers {
                // A worker only ends by finishing its loop; a panic in it
                // would be a bug in this module, and is surfaced.
                if let Err(e) = worker.await {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
        Arrival::Open {
            rate,
            max_in_flight,
        } => {
            let slots = Arc::new(Semaphore::new(max_in_flight));
            for i in 0..limit {
                // Scheduled from the start, not from the previous send, so
                // a late dispatch does not shift every later request.
                // (i / rate, not i * period: a rounded period drifts.)
                let due = started + Duration::from_secs_f64(i as f64 / rate);
                if deadline.is_some_and(|d| due >= d) {
                    break;
                }
                tokio::time::sleep_until(due).await;
                let slot = slots.clone().acquire_owned().await.expect("never closed");
                let run = run.clone();
                tokio::spawn(async move {
                    run.request(i, due).await;
                    drop(slot);
                });
            }
            // Every request has finished once all slots are free again.
            let all = u32::try_from(max_in_flight).unwrap_or(u32::MAX);
            let _ = slots.acquire_many(all).await.expect("never closed");
        }
    }
    run.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_user_asks_equally_often_and_not_in_a_row() {
        for users in [1u64, 7, 300, 7_919, 1_000_000] {
            let mut seen = vec![0u32; users as usize];
            for i in 0..users * 2 {
                seen[user_of(i, users)] += 1;
            }
            assert!(seen.iter().all(|&n| n == 2), "users={users}");
        }
        assert_ne!(user_of(0, 1_000), user_of(1, 1_000));
    }
}
