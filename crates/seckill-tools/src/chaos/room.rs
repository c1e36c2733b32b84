//! The chaos run's waiting-room phase: a crowd in a sale's room while an
//! instance is killed and Redis restarted on its data; then no place may
//! be lost and no purchase may have been made without a pass.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{json, Value};

use seckill::auth::{Principal, Tokens};

use super::{Deployment, Fault};

/// People in the room.
const PEOPLE: i64 = 200;

/// Units on sale: fewer than the people, so the line outlasts the faults.
const UNITS: i64 = 60;

/// People admitted a second: the line moves through the faults.
const ADMIT_PER_S: u32 = 10;

/// The first user id of the room's crowd (above every phase's users).
const FIRST_USER: i64 = 50_000_000;

/// What the waiting-room phase saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RoomPhase {
    /// People who joined and got a ticket at the draw.
    pub ticketed: u64,
    /// People whose ticket after the faults was not the one before (must be
    /// 0).
    pub lost_places: u64,
    /// Purchases sent without a pass.
    pub passless_sent: u64,
    /// Purchases without a pass that were accepted (must be 0).
    pub passless_accepted: u64,
    /// Units bought with a pass.
    pub bought: u64,
    /// What was struck.
    pub struck: String,
}

impl RoomPhase {
    /// Whether nothing was lost and nothing slipped past the room.
    pub fn clean(&self) -> bool {
        self.lost_places == 0 && self.passless_accepted == 0 && self.ticketed == PEOPLE as u64
    }
}

struct Crowd<'a> {
    http: &'a reqwest::Client,
    deployment: &'a Deployment,
    tokens: &'a Tokens,
    voucher: i64,
    next: AtomicU64,
}

impl<'a> Crowd<'a> {
    fn new(
        http: &'a reqwest::Client,
        deployment: &'a Deployment,
        tokens: &'a Tokens,
        voucher: i64,
    ) -> Self {
        Self {
            http,
            deployment,
            tokens,
            voucher,
            next: AtomicU64::new(0),
        }
    }

    fn base(&self) -> String {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        self.deployment.base(i % self.deployment.instances.len())
    }

    fn token(&self, user: i64) -> String {
        self.tokens
            .mint(Principal::User(user), Duration::from_secs(3600))
    }

    /// `(status, body)`; `None` if no answer came.
    async fn send(&self, request: reqwest::RequestBuilder, user: i64) -> Option<(u16, Value)> {
        let response = request.bearer_auth(self.token(user)).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// `user`'s standing (joining first if `join`), asked again through
    /// outages for up to a minute.
    async fn standing(&self, user: i64, join: bool) -> Option<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let url = format!("{}/api/vouchers/{}/room", self.base(), self.voucher);
            let request = if join {
                self.http.post(url)
            } else {
                self.http.get(url)
            };
            match self.send(request, user).await {
                Some((200, body)) => return Some(body),
                _ if Instant::now() >= deadline => return None,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn buy(&self, user: i64, pass: Option<&str>) -> Option<(u16, Value)> {
        let url = format!("{}/api/vouchers/{}/seckill", self.base(), self.voucher);
        let mut request = self.http.post(url);
        if let Some(pass) = pass {
            request = request.header("Room-Pass", pass);
        }
        self.send(request, user).await
    }
}

/// Runs the phase on `deployment` (its instances paid and sold through the
/// phases before).
///
/// # Errors
/// If the sale cannot be created or a fault cannot be struck.
pub async fn run(
    deployment: &mut Deployment,
    http: &reqwest::Client,
    tokens: &Tokens,
) -> anyhow::Result<RoomPhase> {
    let begin = SystemTime::now() + Duration::from_secs(3);
    let begin_ms = begin.duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let body = json!({
        "title": "chaos: a waiting room", "stock": UNITS,
        "begin_ms": begin_ms, "end_ms": begin_ms + 3_600_000,
        "waiting_room": {"admit_per_s": ADMIT_PER_S, "opens_before_ms": 60_000},
    });
    let voucher =
        crate::bench::create_voucher_from(http, &deployment.base(0), tokens, &body).await?;
    let people: Vec<i64> = (FIRST_USER..FIRST_USER + PEOPLE).collect();
    let mut seen = RoomPhase::default();
    let tickets = {
        let crowd = Crowd::new(http, deployment, tokens, voucher);
        // Everyone joins before the start, and tries once to buy without a
        // pass.
        let passless = AtomicU64::new(0);
        let joined = futures_util::future::join_all(people.iter().map(|&user| {
            let (crowd, passless) = (&crowd, &passless);
            async move {
                crowd.standing(user, true).await;
                if let Some((200, _)) = crowd.buy(user, None).await {
                    passless.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
        joined.await;
        seen.passless_sent += PEOPLE as u64;
        seen.passless_accepted += passless.load(Ordering::Relaxed);
        // The draw at the start: everyone has a ticket (or the minute ran
        // out, and the report says how many have).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let tickets = tickets_of(&crowd, &people).await;
            if tickets.values().all(Option::is_some) || Instant::now() >= deadline {
                break tickets;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    seen.ticketed = tickets.values().filter(|t| t.is_some()).count() as u64;
    // The faults, while the line moves.
    let mut struck = Vec::new();
    for (phase, fault) in [Fault::KillInstance, Fault::RestartRedis]
        .into_iter()
        .enumerate()
    {
        struck.push(deployment.strike(fault, phase).await?);
    }
    seen.struck = struck.join("; ");
    let crowd = Crowd::new(http, deployment, tokens, voucher);
    let after = tickets_of(&crowd, &people).await;
    seen.lost_places = people
        .iter()
        .filter(|user| after.get(user) != tickets.get(user))
        .count() as u64;
    // The line sells out: each admitted person buys with their pass, and
    // once more without one.
    let bought = AtomicU64::new(0);
    let passless = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(60);
    futures_util::future::join_all(people.iter().map(|&user| {
        let (crowd, bought, passless, sent) = (&crowd, &bought, &passless, &sent);
        async move {
            while Instant::now() < deadline {
                let Some(standing) = crowd.standing(user, false).await else {
                    return;
                };
                match (standing["state"].as_str(), standing["pass"].as_str()) {
                    (Some("admitted"), Some(pass)) => {
                        sent.fetch_add(1, Ordering::Relaxed);
                        if let Some((200, _)) = crowd.buy(user, None).await {
                            passless.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some((200 | 409, body)) = crowd.buy(user, Some(pass)).await {
                            if body["order_id"].is_string() {
                                bought.fetch_add(1, Ordering::Relaxed);
                            }
                            return;
                        }
                    }
                    (Some("done" | "sold_out"), _) => return,
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }))
    .await;
    seen.bought = bought.load(Ordering::Relaxed);
    seen.passless_sent += sent.load(Ordering::Relaxed);
    seen.passless_accepted += passless.load(Ordering::Relaxed);
    Ok(seen)
}

/// Each person's ticket as the room answers it (`None`: none).
async fn tickets_of(crowd: &Crowd<'_>, people: &[i64]) -> HashMap<i64, Option<u64>> {
    let answers = futures_util::future::join_all(people.iter().map(|&user| async move {
        let standing = crowd.standing(user, false).await;
        (user, standing.and_then(|s| s["ticket"].as_u64()))
    }));
    answers.await.into_iter().collect()
}
