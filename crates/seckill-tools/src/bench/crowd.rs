//! The crowd at a hot sale: people and bots, with a waiting room in front
//! of the sale and without one, side by side; who bought the units.
//!
//! A person sends one request at a time at a person's pace: without a room
//! they press Buy once, a human moment after the opening (up to two
//! seconds), and once more after a 429 or a 503; with a room they join
//! once at a random moment before the opening, look where they stand every
//! [`PERSON_POLL`], and buy once when admitted. A bot arrives at the
//! opening (or, with a room, the moment the room opens), and sends
//! `bot_factor` times a person's requests: purchases fired together at the
//! opening, or the room's standing asked `bot_factor` times as often, with
//! a purchase without a pass beside each look. Each person and each bot is
//! one account (one order per user holds either way).
//!
//! Fairness is the bots' share of units bought against their share of the
//! crowd: with a room it should be within statistical noise of it (a
//! hypergeometric draw: the report gives how many standard deviations
//! away it is), without one it is what firing first at the opening buys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{json, Value};

use seckill::auth::{Principal, Tokens};

/// How often a person looks where they stand in a room.
pub const PERSON_POLL: Duration = Duration::from_secs(2);

/// A crowd to send at two sales of the same stock, one with a room.
#[derive(Debug, Clone)]
pub struct CrowdPlan {
    /// The instances (requests go round-robin).
    pub bases: Vec<String>,
    /// People.
    pub people: u64,
    /// Bots.
    pub bots: u64,
    /// How many times a person's requests a bot sends.
    pub bot_factor: u32,
    /// Units of each sale.
    pub units: i64,
    /// The room's admission rate (people per second).
    pub admit_per_s: u32,
    /// How long before the opening the crowd starts arriving.
    pub lead: Duration,
    /// How long a scenario may take in all.
    pub deadline: Duration,
}

/// What one scenario came to.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
    /// Whether the sale had a waiting room.
    pub waiting_room: bool,
    /// Units people bought.
    pub people_units: u64,
    /// Units bots bought.
    pub bot_units: u64,
    /// Requests people sent.
    pub people_requests: u64,
    /// Requests bots sent.
    pub bot_requests: u64,
    /// The bots' share of the units bought.
    pub bot_share_of_units: f64,
    /// The bots' share of the crowd.
    pub bot_share_of_crowd: f64,
    /// How many standard deviations the bots' units are above what a
    /// uniform draw of the crowd gives (hypergeometric).
    pub z: f64,
    /// Answers that were neither a purchase nor a refusal the model
    /// expects (errors, lost answers).
    pub unexpected: u64,
    /// People whose join reached the room only after the draw (queued
    /// behind everyone drawn: a join slowed or refused past the opening).
    pub people_joined_late: u64,
    /// The first few unexpected answers, for people.
    pub unexpected_samples: Vec<String>,
}

impl Outcome {
    fn finish(&mut self, crowd: u64, bots: u64) {
        let bought = self.people_units + self.bot_units;
        let share = bots as f64 / crowd.max(1) as f64;
        self.bot_share_of_crowd = share;
        self.bot_share_of_units = if bought == 0 {
            0.0
        } else {
            self.bot_units as f64 / bought as f64
        };
        // Hypergeometric: `bought` of `crowd` chosen, `bots` of them bots.
        let n = bought as f64;
        let total = crowd as f64;
        let variance = n * share * (1.0 - share) * (total - n) / (total - 1.0).max(1.0);
        self.z = if variance > 0.0 {
            (self.bot_units as f64 - n * share) / variance.sqrt()
        } else {
            0.0
        };
    }
}

/// Both scenarios' outcomes.
#[derive(Debug, Clone, Serialize)]
pub struct CrowdReport {
    /// With a waiting room in front of the sale.
    pub with_room: Outcome,
    /// Without one.
    pub without_room: Outcome,
}

/// Counters one scenario's actors share.
#[derive(Debug, Default)]
struct Tally {
    people_units: AtomicU64,
    bot_units: AtomicU64,
    people_requests: AtomicU64,
    bot_requests: AtomicU64,
    unexpected: AtomicU64,
    joined_late: AtomicU64,
    samples: std::sync::Mutex<Vec<String>>,
    sold_out: AtomicBool,
}

impl Tally {
    fn request(&self, bot: bool) {
        if bot {
            self.bot_requests.fetch_add(1, Ordering::Relaxed);
        } else {
            self.people_requests.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn bought(&self, bot: bool) {
        if bot {
            self.bot_units.fetch_add(1, Ordering::Relaxed);
        } else {
            self.people_units.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts an answer the model does not expect, keeping the first few.
    fn unexpected(&self, what: String) {
        self.unexpected.fetch_add(1, Ordering::Relaxed);
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() < 5 {
            samples.push(what);
        }
    }

    fn outcome(&self, waiting_room: bool, plan: &CrowdPlan) -> Outcome {
        let mut outcome = Outcome {
            waiting_room,
            people_units: self.people_units.load(Ordering::Relaxed),
            bot_units: self.bot_units.load(Ordering::Relaxed),
            people_requests: self.people_requests.load(Ordering::Relaxed),
            bot_requests: self.bot_requests.load(Ordering::Relaxed),
            unexpected: self.unexpected.load(Ordering::Relaxed),
            people_joined_late: self.joined_late.load(Ordering::Relaxed),
            unexpected_samples: self.samples.lock().map(|s| s.clone()).unwrap_or_default(),
            ..Outcome::default()
        };
        outcome.finish(plan.people + plan.bots, plan.bots);
        outcome
    }
}

/// One actor's view of the service.
struct Actor {
    http: reqwest::Client,
    base: String,
    token: String,
    voucher: i64,
    bot: bool,
    tally: Arc<Tally>,
}

impl Actor {
    /// `(status, body)`; `None` (counted as unexpected) if no answer came.
    async fn send(&self, request: reqwest::RequestBuilder) -> Option<(u16, Value)> {
        self.tally.request(self.bot);
        match request.bearer_auth(&self.token).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                Some((status, response.json().await.unwrap_or(Value::Null)))
            }
            Err(e) => {
                self.tally.unexpected(format!("no answer: {e}"));
                None
            }
        }
    }

    /// One purchase (with `pass` if given); whether it bought, and whether
    /// to stop (bought, sold out, already bought).
    async fn buy(&self, pass: Option<&str>) -> bool {
        let mut request = self.http.post(format!(
            "{}/api/vouchers/{}/seckill",
            self.base, self.voucher
        ));
        if let Some(pass) = pass {
            request = request.header("Room-Pass", pass);
        }
        match self.send(request).await {
            Some((200, _)) => {
                self.tally.bought(self.bot);
                true
            }
            Some((409, body)) if body["code"] == "sold_out" => {
                self.tally.sold_out.store(true, Ordering::Relaxed);
                true
            }
            Some((409, body)) if body["code"] == "already_bought" => true,
            // Refusals the model expects: a bot's purchase without a pass
            // or before the opening, rate limits and outages (asked again
            // by the caller); a lost answer is counted where it is lost.
            Some((403 | 409 | 429 | 503, _)) | None => false,
            Some((status, body)) => {
                self.tally.unexpected(format!("purchase: {status} {body}"));
                false
            }
        }
    }

    async fn room(&self, join: bool) -> Option<Value> {
        let url = format!("{}/api/vouchers/{}/room", self.base, self.voucher);
        let request = if join {
            self.http.post(url)
        } else {
            self.http.get(url)
        };
        match self.send(request).await {
            Some((200, body)) => Some(body),
            Some((429 | 503, _)) | None => None,
            Some((status, body)) => {
                self.tally.unexpected(format!("room: {status} {body}"));
                None
            }
        }
    }
}

/// Runs the crowd at a sale without a room, then at one with a room.
///
/// # Errors
/// If a sale cannot be created.
pub async fn run(
    http: &reqwest::Client,
    tokens: &Tokens,
    plan: &CrowdPlan,
) -> anyhow::Result<CrowdReport> {
    let without_room = scenario(http, tokens, plan, false).await?;
    let with_room = scenario(http, tokens, plan, true).await?;
    Ok(CrowdReport {
        with_room,
        without_room,
    })
}

async fn scenario(
    http: &reqwest::Client,
    tokens: &Tokens,
    plan: &CrowdPlan,
    with_room: bool,
) -> anyhow::Result<Outcome> {
    let opening = SystemTime::now() + plan.lead;
    let voucher = create_sale(http, &plan.bases[0], tokens, plan, opening, with_room).await?;
    let tally = Arc::new(Tally::default());
    let deadline = tokio::time::Instant::now() + plan.deadline;
    let until_opening = plan.lead;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..plan.people + plan.bots {
        let bot = i >= plan.people;
        let actor = Actor {
            http: http.clone(),
            base: plan.bases[i as usize % plan.bases.len()].clone(),
            token: tokens.mint(Principal::User(i as i64 + 1), Duration::from_secs(3600)),
            voucher,
            bot,
            tally: tally.clone(),
        };
        let factor = plan.bot_factor.max(1);
        tasks.spawn(async move {
            let work = async {
                match (with_room, bot) {
                    (false, false) => person_without_room(&actor, until_opening).await,
                    (false, true) => bot_without_room(&actor, until_opening, factor).await,
                    (true, false) => person_in_room(&actor, until_opening).await,
                    (true, true) => bot_in_room(&actor, factor).await,
                }
            };
            let _ = tokio::time::timeout_at(deadline, work).await;
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(tally.outcome(with_room, plan))
}

/// A moment of `up_to` (uniform).
fn moment(up_to: Duration) -> Duration {
    up_to.mul_f64(fastrand::f64())
}

async fn person_without_room(actor: &Actor, until_opening: Duration) {
    // A person presses a human moment after the opening.
    tokio::time::sleep(until_opening + moment(Duration::from_secs(2))).await;
    for _ in 0..3 {
        if actor.buy(None).await || actor.tally.sold_out.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn bot_without_room(actor: &Actor, until_opening: Duration, factor: u32) {
    // Fired together at the opening millisecond.
    tokio::time::sleep(until_opening).await;
    let shots = (0..factor).map(|_| actor.buy(None));
    futures_util::future::join_all(shots).await;
}

async fn person_in_room(actor: &Actor, until_opening: Duration) {
    // Somewhere before the opening, then a look every PERSON_POLL.
    tokio::time::sleep(moment(
        until_opening.saturating_sub(Duration::from_millis(500)),
    ))
    .await;
    let mut standing = actor.room(true).await;
    let mut joined = false;
    loop {
        let (state, pass) = look(standing.as_ref());
        if !joined && state.is_some_and(|s| s != "outside" && s != "not_open") {
            joined = true;
            if state != Some("awaiting_draw") {
                actor.tally.joined_late.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let (Some("admitted"), Some(pass)) = (state, pass) {
            if actor.buy(Some(pass)).await {
                return;
            }
        }
        if matches!(state, Some("done" | "sold_out"))
            || actor.tally.sold_out.load(Ordering::Relaxed)
        {
            return;
        }
        tokio::time::sleep(PERSON_POLL.mul_f64(0.5 + fastrand::f64())).await;
        // Not in the line (the join's answer lost, or the line lost with
        // Redis' data): join again, else look.
        standing = actor.room(matches!(state, None | Some("outside"))).await;
    }
}

async fn bot_in_room(actor: &Actor, factor: u32) {
    // Joins the moment the room opens (now), then looks `factor` times as
    // often as a person, firing a purchase without a pass beside each look.
    let mut standing = actor.room(true).await;
    let poll = PERSON_POLL / factor;
    loop {
        let (state, pass) = look(standing.as_ref());
        let bought = match (state, pass) {
            (Some("admitted"), Some(pass)) => actor.buy(Some(pass)).await,
            _ => actor.buy(None).await,
        };
        if bought
            || matches!(state, Some("done" | "sold_out"))
            || actor.tally.sold_out.load(Ordering::Relaxed)
        {
            return;
        }
        tokio::time::sleep(poll).await;
        standing = actor.room(matches!(state, None | Some("outside"))).await;
    }
}

/// A standing's state and pass.
fn look(standing: Option<&Value>) -> (Option<&str>, Option<&str>) {
    standing.map_or((None, None), |s| (s["state"].as_str(), s["pass"].as_str()))
}

/// A sale of `plan.units` opening at `opening`, with a room admitting
/// `plan.admit_per_s` people a second (open from now) if `with_room`.
async fn create_sale(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    plan: &CrowdPlan,
    opening: SystemTime,
    with_room: bool,
) -> anyhow::Result<i64> {
    let begin_ms = opening.duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let mut body = json!({
        "title": if with_room { "crowd, with a waiting room" } else { "crowd, no waiting room" },
        "stock": plan.units, "begin_ms": begin_ms, "end_ms": begin_ms + 3_600_000,
    });
    if with_room {
        body["waiting_room"] = json!({
            "admit_per_s": plan.admit_per_s,
            "opens_before_ms": plan.lead.as_millis() as u64 + 60_000,
        });
    }
    super::setup::create_voucher_from(http, base, tokens, &body).await
}

/// The report as a table, for people.
pub fn table(report: &CrowdReport) -> String {
    let mut out = String::from(
        "| sale | units to people | units to bots | bots' share of units | bots' share of the crowd | z | requests by people | requests by bots |\n|---|---|---|---|---|---|---|---|\n",
    );
    for o in [&report.without_room, &report.with_room] {
        out.push_str(&format!(
            "| {} | {} | {} | {:.1}% | {:.1}% | {:+.1} | {} | {} |\n",
            if o.waiting_room {
                "with a waiting room"
            } else {
                "without"
            },
            o.people_units,
            o.bot_units,
            100.0 * o.bot_share_of_units,
            100.0 * o.bot_share_of_crowd,
            o.z,
            o.people_requests,
            o.bot_requests
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z_is_the_bots_distance_from_a_fair_draw() {
        let mut fair = Outcome {
            people_units: 990,
            bot_units: 10,
            ..Outcome::default()
        };
        fair.finish(10_100, 100);
        assert!(fair.z.abs() < 0.1, "{fair:?}");
        let mut first = Outcome {
            people_units: 900,
            bot_units: 100,
            ..Outcome::default()
        };
        first.finish(10_100, 100);
        assert!(first.z > 25.0, "{first:?}");
        assert!((first.bot_share_of_units - 0.1).abs() < 1e-9);
    }
}
