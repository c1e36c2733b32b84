//! What fault tests measure: operation histories and a fenced register.
//!
//! A [`History`] records, for each holder, when it acquired a lock (with
//! which token), when it learned the lock was lost, when it released it,
//! and the writes it made to the protected resource. Timestamps come from
//! the system-wide monotonic clock ([`now_us`]), so histories that child
//! processes print ([`Event::to_line`]) merge with the parent's.
//!
//! A [`FencedRegister`] is that resource: it accepts a write only with a
//! token at least the highest it has seen (equal only from the same holder).
//! It lives on a private redis-server of its own, which no nemesis touches,
//! so every process of a test can write to it.
//!
//! [`History::check`] reads the whole history afterwards and counts what
//! the fault guarantees (`docs/guarantees.md`, faults 2 and 9) ask
//! for: overlapping beliefs, tokens issued twice, stale writes accepted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use launcher::RedisServer;

/// Microseconds on the system-wide monotonic clock (`CLOCK_MONOTONIC`): the
/// same clock in every process of the machine.
pub fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// One thing a holder did or learned, at `at` µs ([`now_us`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `holder` acquired the lock with `token` (the acquire returned).
    Acquired { holder: String, token: u64, at: u64 },
    /// `holder` learned its hold was lost.
    Lost { holder: String, at: u64 },
    /// `holder` released (its unlock was called; it no longer believes).
    Released { holder: String, at: u64 },
    /// `holder` wrote with `token`; the register `accepted` it or not.
    Wrote {
        holder: String,
        token: u64,
        accepted: bool,
        at: u64,
    },
}

impl Event {
    /// The event as one line of text, for a child process to print.
    pub fn to_line(&self) -> String {
        match self {
            Event::Acquired { holder, token, at } => format!("EV acquired {holder} {token} {at}"),
            Event::Lost { holder, at } => format!("EV lost {holder} 0 {at}"),
            Event::Released { holder, at } => format!("EV released {holder} 0 {at}"),
            Event::Wrote {
                holder,
                token,
                accepted,
                at,
            } => format!(
                "EV wrote{} {holder} {token} {at}",
                if *accepted { "+" } else { "-" }
            ),
        }
    }

    /// Reads a line made by [`to_line`](Self::to_line); `None` for any
    /// other line.
    pub fn from_line(line: &str) -> Option<Self> {
        let mut words = line.strip_prefix("EV ")?.split(' ');
        let (kind, holder) = (words.next()?, words.next()?.to_owned());
        let token: u64 = words.next()?.parse().ok()?;
        let at: u64 = words.next()?.parse().ok()?;
        Some(match kind {
            "acquired" => Event::Acquired { holder, token, at },
            "lost" => Event::Lost { holder, at },
            "released" => Event::Released { holder, at },
            "wrote+" | "wrote-" => Event::Wrote {
                holder,
                token,
                accepted: kind == "wrote+",
                at,
            },
            _ => return None,
        })
    }

    fn at(&self) -> u64 {
        match self {
            Event::Acquired { at, .. }
            | Event::Lost { at, .. }
            | Event::Released { at, .. }
            | Event::Wrote { at, .. } => *at,
        }
    }
}

/// A shared, append-only history of one lock's holders.
#[derive(Debug, Clone, Default)]
pub struct History(Arc<Mutex<Vec<Event>>>);

/// What [`History::check`] counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Acquisitions.
    pub holds: usize,
    /// Pairs of holds of different holders whose belief intervals (acquired
    /// until lost or released) overlap in time.
    pub overlaps: usize,
    /// Tokens returned by two acquisitions of different holders.
    pub duplicate_tokens: usize,
    /// Writes the register accepted with a token lower than one already
    /// returned to another holder's completed acquisition.
    pub stale_writes_accepted: usize,
    /// Writes accepted / rejected by the register.
    pub writes_accepted: usize,
    /// Writes the register rejected.
    pub writes_rejected: usize,
}

impl History {
    /// Records `event`.
    pub fn push(&self, event: Event) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(event);
    }

    /// Records every event line among `lines` (a child process's output).
    pub fn extend_from_lines<'a>(&self, lines: impl IntoIterator<Item = &'a str>) {
        for event in lines.into_iter().filter_map(Event::from_line) {
            self.push(event);
        }
    }

    /// Every event so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        events.sort_by_key(Event::at);
        events
    }

    /// Counts what the history shows (see [`Report`]). A hold whose end was
    /// never recorded counts as held until the end of the history.
    pub fn check(&self) -> Report {
        let events = self.events();
        let end = events.last().map_or(0, Event::at);
        let mut report = Report::default();
        // Belief intervals: (start, end, holder, token).
        let mut open: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut intervals: Vec<(u64, u64, String, u64)> = Vec::new();
        let mut issued: Vec<(u64, u64, String)> = Vec::new(); // (at, token, holder)
        for event in &events {
            match event {
                Event::Acquired { holder, token, at } => {
                    report.holds += 1;
                    if let Some((start, t)) = open.insert(holder.clone(), (*at, *token)) {
                        intervals.push((start, *at, holder.clone(), t));
                    }
                    issued.push((*at, *token, holder.clone()));
                }
                Event::Lost { holder, at } | Event::Released { holder, at } => {
                    if let Some((start, token)) = open.remove(holder) {
                        intervals.push((start, *at, holder.clone(), token));
                    }
                }
                Event::Wrote {
                    holder,
                    token,
                    accepted,
                    at,
                } => {
                    if *accepted {
                        report.writes_accepted += 1;
                        let stale = issued
                            .iter()
                            .any(|(t_at, t, h)| t_at < at && t > token && h != holder);
                        report.stale_writes_accepted += usize::from(stale);
                    } else {
                        report.writes_rejected += 1;
                    }
                }
            }
        }
        for (holder, (start, token)) in open {
            intervals.push((start, end, holder, token));
        }
        for (i, a) in intervals.iter().enumerate() {
            for b in &intervals[i + 1..] {
                if a.2 != b.2 && a.0 < b.1 && b.0 < a.1 {
                    report.overlaps += 1;
                }
            }
        }
        let mut by_token: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
        for (_, token, holder) in &issued {
            by_token.entry(*token).or_default().push(holder);
        }
        for holders in by_token.values() {
            let mut distinct = holders.clone();
            distinct.sort_unstable();
            distinct.dedup();
            report.duplicate_tokens += distinct.len().saturating_sub(1);
        }
        report
    }
}

const REGISTER: &str = "\
local max = tonumber(redis.call('hget', KEYS[1], 'max') or '0') \
local holder = redis.call('hget', KEYS[1], 'holder') \
local token = tonumber(ARGV[1]) \
if token > max or (token == max and holder == ARGV[2]) then \
  redis.call('hset', KEYS[1], 'max', ARGV[1], 'holder', ARGV[2]) \
  return 1 \
end \
return 0";

/// A resource that accepts a write only with a token at least the highest
/// it has seen, equal only from the same holder (see the module docs).
#[derive(Debug)]
pub struct FencedRegister {
    server: RedisServer,
}

impl FencedRegister {
    /// Starts the register's own private redis-server.
    pub fn start() -> Self {
        Self {
            server: RedisServer::start(),
        }
    }

    /// The URL of the register's server, for child processes
    /// ([`write_at`]).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Writes to `resource` with `token` as `holder`; true if accepted.
    pub async fn write(&self, resource: &str, holder: &str, token: u64) -> bool {
        write_at(&self.url(), resource, holder, token).await
    }
}

/// A connection to a [`FencedRegister`], kept for many writes (a
/// connection per write would make holders slow under load).
#[derive(Clone)]
pub struct RegisterClient {
    conn: redis::aio::MultiplexedConnection,
    script: redis::Script,
}

impl RegisterClient {
    /// Connects to the register whose server is at `url` (see
    /// [`FencedRegister::url`]).
    pub async fn connect(url: &str) -> Self {
        let client = redis::Client::open(url).expect("register url");
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(std::time::Duration::from_secs(10)))
            .set_response_timeout(Some(std::time::Duration::from_secs(10)));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("the register's server answers");
        Self {
            conn,
            script: redis::Script::new(REGISTER),
        }
    }

    /// Writes to `resource` with `token` as `holder`; true if accepted.
    /// Each resource keeps its own highest token (one per lock name).
    pub async fn write(&mut self, resource: &str, holder: &str, token: u64) -> bool {
        let accepted: i64 = self
            .script
            .key(format!("register:{resource}"))
            .arg(token)
            .arg(holder)
            .invoke_async(&mut self.conn)
            .await
            .expect("register script");
        accepted == 1
    }
}

/// Writes once to `resource` of the register whose server is at `url`; true
/// if accepted.
pub async fn write_at(url: &str, resource: &str, holder: &str, token: u64) -> bool {
    RegisterClient::connect(url)
        .await
        .write(resource, holder, token)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquired(holder: &str, token: u64, at: u64) -> Event {
        Event::Acquired {
            holder: holder.into(),
            token,
            at,
        }
    }

    fn released(holder: &str, at: u64) -> Event {
        Event::Released {
            holder: holder.into(),
            at,
        }
    }

    #[test]
    fn events_survive_a_trip_through_a_line() {
        let event = Event::Wrote {
            holder: "p1:t3".into(),
            token: 1_763_900_000_000_001,
            accepted: false,
            at: 42,
        };
        assert_eq!(Event::from_line(&event.to_line()), Some(event));
        assert_eq!(Event::from_line("HELD 3"), None);
    }

    #[test]
    fn the_checker_counts_overlaps_duplicates_and_stale_writes() {
        let history = History::default();
        for event in [
            acquired("a", 1, 10),
            released("a", 20),
            acquired("b", 2, 30),
            acquired("c", 2, 35), // overlaps b, same token
            Event::Wrote {
                holder: "a".into(),
                token: 1,
                accepted: true,
                at: 40, // token 2 was issued before: stale
            },
            released("b", 50),
            released("c", 60),
        ] {
            history.push(event);
        }
        let report = history.check();
        assert_eq!(report.holds, 3);
        assert_eq!(report.overlaps, 1);
        assert_eq!(report.duplicate_tokens, 1);
        assert_eq!(report.stale_writes_accepted, 1);
    }

    #[test]
    fn back_to_back_holds_do_not_overlap() {
        let history = History::default();
        for event in [
            acquired("a", 1, 10),
            released("a", 20),
            acquired("b", 2, 20),
        ] {
            history.push(event);
        }
        assert_eq!(history.check().overlaps, 0);
    }
}
