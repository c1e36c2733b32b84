//! The run's report: a summary for the terminal and a JSON document.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::checks::Check;
use super::load::{Arrival, Record};

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// From a histogram of microseconds.
    pub fn of(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p99_9: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    }
}

/// One service instance's share.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    /// Its base URL.
    pub url: String,
    /// Requests sent to it.
    pub requests: u64,
    /// Accepted by it.
    pub accepted: u64,
    /// Failed against it.
    pub errors: u64,
}

/// One second of the run.
#[derive(Debug, Clone, Serialize)]
pub struct SecondReport {
    /// Seconds since the start.
    pub second: usize,
    /// Requests completed in it.
    pub completed: u64,
    /// Accepted purchases.
    pub accepted: u64,
    /// Refusals.
    pub refused: u64,
    /// 429s.
    pub rate_limited: u64,
    /// Failures.
    pub errors: u64,
    /// Latency of its requests, ms.
    pub p50_ms: f64,
    /// Latency of its requests, ms.
    pub p99_ms: f64,
    /// Latency of its requests, ms.
    pub max_ms: f64,
}

/// The JSON report (`report.json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `closed` or `open`.
    pub model: &'static str,
    /// Closed loop: requests in flight.
    pub concurrency: Option<usize>,
    /// Open loop: scheduled requests per second.
    pub rate: Option<f64>,
    /// Open loop: the in-flight cap.
    pub max_in_flight: Option<usize>,
    /// Service instances, with their shares.
    pub targets: Vec<TargetReport>,
    /// The voucher bought from.
    pub voucher: i64,
    /// Its stock at the start.
    pub stock: i64,
    /// Simulated users.
    pub users: u64,
    /// Requests sent.
    pub requests: u64,
    /// Seconds from the first send to the last answer.
    pub elapsed_s: f64,
    /// Requests per second.
    pub throughput_rps: f64,
    /// Accepted purchases.
    pub accepted: u64,
    /// Requests whose outcome is unknown (timed out, broken, 5xx): each
    /// may or may not have bought.
    pub unknown: u64,
    /// Of those, how many turned out stored (`None`: no database given).
    pub unknown_stored: Option<u64>,
    /// Requests/s of the same closed loop on `GET /healthz` (`--ceiling`).
    pub ceiling_rps: Option<f64>,
    /// Requests/s over the whole seconds after the sale sold out.
    pub sold_out_rps: Option<f64>,
    /// Requests by outcome: `accepted`, a refusal code, `rate_limited`,
    /// `error: ...`.
    pub outcomes: BTreeMap<String, u64>,
    /// Latency; in open loop from each request's scheduled time (corrected
    /// for coordinated omission).
    pub latency_ms: Percentiles,
    /// Round trip from the actual send.
    pub service_time_ms: Percentiles,
    /// Per second of the run.
    pub timeline: Vec<SecondReport>,
    /// The invariants checked, and whether each held.
    pub checks: Vec<Check>,
    /// All checks held.
    pub invariants_hold: bool,
}

impl Report {
    /// Builds the report of a run.
    pub fn new(
        record: &Record,
        urls: &[String],
        sale: (i64, i64),
        users: u64,
        checks: Vec<Check>,
        unknown_stored: Option<u64>,
    ) -> Self {
        let (model, concurrency, rate, max_in_flight) = match record.arrival {
            Arrival::Closed { concurrency } => ("closed", Some(concurrency), None, None),
            Arrival::Open {
                rate,
                max_in_flight,
            } => ("open", None, Some(rate), Some(max_in_flight)),
        };
        let ms = |us: u64| us as f64 / 1000.0;
        Report {
            model,
            concurrency,
            rate,
            max_in_flight,
            targets: urls
                .iter()
                .zip(&record.per_target)
                .map(|(url, t)| TargetReport {
                    url: url.clone(),
                    requests: t.requests,
                    accepted: t.accepted,
                    errors: t.errors,
                })
                .collect(),
            voucher: sale.0,
            stock: sale.1,
            users,
            requests: record.requests(),
            elapsed_s: record.elapsed.as_secs_f64(),
            throughput_rps: record.throughput(),
            accepted: record.orders.len() as u64,
            unknown: record.unknown_users.len() as u64,
            unknown_stored,
            ceiling_rps: None,
            sold_out_rps: None,
            outcomes: record.outcomes.clone(),
            latency_ms: Percentiles::of(&record.latency),
            service_time_ms: Percentiles::of(&record.service_time),
            timeline: record
                .timeline
                .iter()
                .enumerate()
                .map(|(second, s)| SecondReport {
                    second,
                    completed: s.completed(),
                    accepted: s.accepted,
                    refused: s.refused,
                    rate_limited: s.rate_limited,
                    errors: s.errors,
                    p50_ms: ms(s.latency.value_at_quantile(0.5)),
                    p99_ms: ms(s.latency.value_at_quantile(0.99)),
                    max_ms: ms(s.latency.max()),
                })
                .collect(),
            invariants_hold: checks.iter().all(|c| c.held),
            checks,
        }
    }
}

impl Report {
    /// This report with the HTTP ceiling and the sold-out phase's rate.
    pub fn with_ceiling(mut self, ceiling: Option<f64>, sold_out: Option<f64>) -> Self {
        self.ceiling_rps = ceiling;
        self.sold_out_rps = sold_out;
        self
    }
}

/// Requests per second over the whole seconds after the sale sold out (the
/// first second with no acceptance and a `sold_out` refusal onwards, its
/// first and the run's last second left out as partial); `None` if the
/// sale did not sell out at least two whole seconds before the end.
pub fn sold_out_rate(record: &Record) -> Option<f64> {
    if record.count("sold_out") == 0 {
        return None;
    }
    let last_sale = record.timeline.iter().rposition(|s| s.accepted > 0)?;
    let whole = record
        .timeline
        .get(last_sale + 1..record.timeline.len().saturating_sub(1))?;
    if whole.is_empty() {
        return None;
    }
    let completed: u64 = whole.iter().map(|s| s.completed()).sum();
    Some(completed as f64 / whole.len() as f64)
}

/// Prints purchases/s, and the sold-out phase's, against the HTTP ceiling.
pub fn print_against_ceiling(record: &Record, ceiling: Option<f64>, sold_out: Option<f64>) {
    let share = |rps: f64| {
        ceiling.map_or(String::new(), |c| {
            format!(" ({:.0}% of the ceiling)", 100.0 * rps / c)
        })
    };
    if ceiling.is_some() {
        println!(
            "purchases: {:.0} requests/s{}",
            record.throughput(),
            share(record.throughput())
        );
    }
    if let Some(rps) = sold_out {
        println!("sold-out phase: {rps:.0} requests/s{}", share(rps));
    }
}

/// Prints how many requests had an unknown outcome, and how many of those
/// the database shows bought (when it was given).
pub fn print_unknowns(record: &Record, stored: Option<u64>) {
    let unknown = record.unknown_users.len();
    if unknown == 0 {
        return;
    }
    match stored {
        Some(stored) => println!(
            "unknown outcomes: {unknown} (answer lost: timeout, broken connection, 5xx); {stored} of them turned out stored"
        ),
        None => println!(
            "unknown outcomes: {unknown} (answer lost: timeout, broken connection, 5xx)"
        ),
    }
}

/// Prints the load figures of a run.
pub fn print_summary(record: &Record) {
    let refusals: Vec<String> = record
        .outcomes
        .iter()
        .filter(|(key, _)| {
            !matches!(key.as_str(), "accepted" | "rate_limited") && !key.starts_with("error")
        })
        .map(|(key, n)| format!("{key} {n}"))
        .collect();
    println!(
        "requests: {} in {:.2?} = {:.0} requests/s; accepted {}, refused {} ({}), rate-limited {}, errors {}",
        record.requests(),
        record.elapsed,
        record.throughput(),
        record.orders.len(),
        record.refused(),
        if refusals.is_empty() { "none".into() } else { refusals.join(", ") },
        record.count("rate_limited"),
        record.errors()
    );
    for (key, n) in record
        .outcomes
        .iter()
        .filter(|(k, _)| k.starts_with("error"))
    {
        println!("  {key}: {n}");
    }
    let line = |what: &str, h: &Histogram<u64>| {
        let p = Percentiles::of(h);
        println!(
            "{what}: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
            p.p50, p.p90, p.p99, p.p99_9, p.max
        );
    };
    match record.arrival {
        Arrival::Closed { .. } => line("latency", &record.latency),
        Arrival::Open { .. } => {
            line("latency (from scheduled send)", &record.latency);
            line("service time (from actual send)", &record.service_time);
        }
    }
}
