//! `seckill-tools payments`: a payment provider to test against, in its
//! own process on its own port.
//!
//! It serves the protocol the service speaks (`seckill::payments::provider`:
//! charges, voids and refunds by idempotency key, with the API key as a
//! bearer token) and confirms each charge and refund later, by a callback
//! signed as the service checks it (`seckill::payments::events`), sent to
//! the service's `/api/payments/events` (several instances: the next one
//! when one does not answer) and sent again until it is acknowledged.
//! Switches make it behave as real providers sometimes do: callbacks
//! delayed, delivered twice, out of order, lost, or accompanied by a
//! forged copy; charges declined.
//!
//! Its ledger (`GET /v1/ledger`) is what the money checks compare with the
//! database: per currency, what was charged, voided and refunded.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use seckill::payments::events::{self, Event, EventKind, SIGNATURE_HEADER};

/// Options of `seckill-tools payments`.
#[derive(Debug, Clone, clap::Args)]
pub struct PaymentsArgs {
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The service's base URL(s) to call back (`/api/payments/events` is
    /// added); several for several instances. Also settable later with
    /// `PUT /v1/callbacks` (a JSON list), for a service started after the
    /// provider.
    #[arg(long = "callback")]
    pub callbacks: Vec<String>,
    /// The API key the service presents.
    #[arg(long, env = "SECKILL_PAYMENT_API_KEY")]
    pub api_key: String,
    /// The secret callbacks are signed with.
    #[arg(long, env = "SECKILL_PAYMENT_WEBHOOK_SECRET")]
    pub webhook_secret: String,
    /// How long after a charge or refund its callback is sent.
    #[arg(long, default_value_t = 100)]
    pub delay_ms: u64,
    /// Up to this much more, at random: callbacks arrive out of order.
    #[arg(long, default_value_t = 0)]
    pub reorder_ms: u64,
    /// Share of callbacks delivered twice.
    #[arg(long, default_value_t = 0.0)]
    pub duplicate: f64,
    /// Share of callbacks never sent.
    #[arg(long, default_value_t = 0.0)]
    pub lose: f64,
    /// Share of charges declined.
    #[arg(long, default_value_t = 0.0)]
    pub decline: f64,
    /// Share of callbacks preceded by a copy with a forged signature (the
    /// service must refuse it).
    #[arg(long, default_value_t = 0.0)]
    pub forge: f64,
}

/// What became of a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Fate {
    /// Asked; not decided yet.
    Pending,
    /// Taken.
    Succeeded,
    /// Declined.
    Failed,
    /// Given back after it was taken, or cancelled before.
    Voided,
    /// Refunded.
    Refunded,
}

#[derive(Debug, Clone, Serialize)]
struct ChargeRecord {
    reference: String,
    order_id: String,
    amount_minor: i64,
    currency: String,
    fate: Fate,
    /// Whether it was taken before it was voided (a void of a pending
    /// charge takes nothing).
    taken: bool,
}

/// What the ledger says, per currency: the provider's money as the service
/// counts it, and the charges it declined.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LedgerTotals {
    /// Charges taken, voided and refunded, and their sums.
    #[serde(flatten)]
    pub money: seckill::payments::Totals,
    /// Charges declined.
    pub declined: u64,
}

/// The provider's whole answer to `GET /v1/ledger`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ledger {
    /// Per currency.
    pub totals: BTreeMap<String, LedgerTotals>,
    /// What each order kept (charged less voided and refunded), per order.
    pub kept_by_order: BTreeMap<String, i64>,
    /// Callbacks acknowledged, lost on purpose, forged copies refused,
    /// and deliveries not acknowledged (sent again).
    pub callbacks: BTreeMap<String, u64>,
}

#[derive(Debug, Default)]
struct Book {
    charges: HashMap<String, ChargeRecord>,
    by_key: HashMap<String, String>,
    refunds_by_key: HashMap<String, String>,
    events: u64,
    callbacks: BTreeMap<String, u64>,
}

#[derive(Clone)]
struct Sim {
    args: Arc<PaymentsArgs>,
    callbacks: Arc<Mutex<Vec<String>>>,
    book: Arc<Mutex<Book>>,
    http: reqwest::Client,
}

/// Runs the provider until Ctrl-C; prints its address first.
///
/// # Errors
/// If it cannot listen.
pub async fn run(args: PaymentsArgs) -> anyhow::Result<bool> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let sim = Sim {
        callbacks: Arc::new(Mutex::new(args.callbacks.clone())),
        args: Arc::new(args),
        book: Arc::default(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()?,
    };
    let app = Router::new()
        .route("/v1/charges", post(charge))
        .route("/v1/charges/{reference}/void", post(void))
        .route("/v1/charges/{reference}/refunds", post(refund))
        .route("/v1/ledger", get(ledger))
        .route("/v1/callbacks", axum::routing::put(set_callbacks))
        .with_state(sim);
    println!("payments: listening on http://{addr}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(true)
}

type Answer = (StatusCode, Json<Value>);

fn refused(status: StatusCode, message: &str) -> Answer {
    (status, Json(json!({ "message": message })))
}

impl Sim {
    fn authorised(&self, headers: &HeaderMap) -> bool {
        let expected = format!("Bearer {}", self.args.api_key);
        headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == expected)
    }

    /// Sends `event` after the delay, as the switches say.
    fn call_back_later(&self, event: Event) {
        let sim = self.clone();
        tokio::spawn(async move {
            let args = &sim.args;
            let extra = if args.reorder_ms > 0 {
                fastrand::u64(0..=args.reorder_ms)
            } else {
                0
            };
            tokio::time::sleep(Duration::from_millis(args.delay_ms + extra)).await;
            if fastrand::f64() < args.lose {
                sim.count("lost");
                return;
            }
            if fastrand::f64() < args.forge {
                sim.deliver_forged(&event).await;
            }
            sim.deliver(&event).await;
            if fastrand::f64() < args.duplicate {
                tokio::time::sleep(Duration::from_millis(fastrand::u64(0..=50))).await;
                sim.count("duplicated");
                sim.deliver(&event).await;
            }
        });
    }

    fn count(&self, what: &str) {
        if let Ok(mut book) = self.book.lock() {
            *book.callbacks.entry(what.to_owned()).or_default() += 1;
        }
    }

    /// Delivers `event` until one instance acknowledges it (a 2xx), for at
    /// most two minutes: instances restart, and an event may come before
    /// what it answers.
    async fn deliver(&self, event: &Event) {
        let Ok(body) = serde_json::to_vec(event) else {
            return;
        };
        let started = std::time::Instant::now();
        let mut attempt: u64 = 0;
        while started.elapsed() < Duration::from_secs(120) {
            let callbacks = self.callbacks.lock().map(|c| c.clone()).unwrap_or_default();
            if callbacks.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let base = &callbacks[attempt as usize % callbacks.len()];
            let signature = events::sign(
                self.args.webhook_secret.as_bytes(),
                SystemTime::now(),
                &body,
            );
            let sent = self
                .http
                .post(format!(
                    "{}/api/payments/events",
                    base.trim_end_matches('/')
                ))
                .header(SIGNATURE_HEADER, signature)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => {
                    self.count("acknowledged");
                    return;
                }
                Ok(r) => self.count(&format!("answered_{}", r.status().as_u16())),
                Err(_) => self.count("unanswered"),
            }
            self.count("sent_again");
            attempt += 1;
            let pause = (100 * attempt).min(2_000);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        self.count("given_up");
    }

    /// Sends a copy of `event` with a forged signature; counts whether the
    /// service refused it (401) as it must.
    async fn deliver_forged(&self, event: &Event) {
        let Ok(body) = serde_json::to_vec(event) else {
            return;
        };
        let forged = events::sign(b"not the shared secret", SystemTime::now(), &body);
        let Some(base) = self.callbacks.lock().ok().and_then(|c| c.first().cloned()) else {
            return;
        };
        let sent = self
            .http
            .post(format!(
                "{}/api/payments/events",
                base.trim_end_matches('/')
            ))
            .header(SIGNATURE_HEADER, forged)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == StatusCode::UNAUTHORIZED => self.count("forged_refused"),
            Ok(_) => self.count("forged_taken"),
            Err(_) => self.count("forged_unanswered"),
        }
    }

    fn event(&self, book: &mut Book, kind: EventKind, charge: &ChargeRecord) -> Event {
        book.events += 1;
        Event {
            id: format!("evt_{}", book.events),
            kind,
            reference: charge.reference.clone(),
            order_id: charge.order_id.clone(),
            amount_minor: charge.amount_minor,
            currency: charge.currency.clone(),
        }
    }
}

#[derive(Deserialize)]
struct NewCharge {
    order_id: String,
    amount_minor: i64,
    currency: String,
    idempotency_key: String,
}

async fn charge(State(sim): State<Sim>, headers: HeaderMap, Json(body): Json<NewCharge>) -> Answer {
    if !sim.authorised(&headers) {
        return refused(StatusCode::UNAUTHORIZED, "bad API key");
    }
    let key = format!("{}:{}", body.order_id, body.idempotency_key);
    let Ok(mut book) = sim.book.lock() else {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "poisoned");
    };
    if let Some(reference) = book.by_key.get(&key) {
        return (StatusCode::OK, Json(json!({ "reference": reference })));
    }
    let reference = format!("ch_{}", book.charges.len() + 1);
    let record = ChargeRecord {
        reference: reference.clone(),
        order_id: body.order_id,
        amount_minor: body.amount_minor,
        currency: body.currency,
        fate: Fate::Pending,
        taken: false,
    };
    book.by_key.insert(key, reference.clone());
    book.charges.insert(reference.clone(), record);
    drop(book);
    // Decided a moment later, as a provider's charge is.
    let decider = sim.clone();
    let decided = reference.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(decider.args.delay_ms / 2)).await;
        let declined = fastrand::f64() < decider.args.decline;
        let event = {
            let Ok(mut book) = decider.book.lock() else {
                return;
            };
            let Some(charge) = book.charges.get_mut(&decided) else {
                return;
            };
            if charge.fate != Fate::Pending {
                return; // voided before it was decided: nothing taken
            }
            charge.fate = if declined {
                Fate::Failed
            } else {
                Fate::Succeeded
            };
            charge.taken = !declined;
            let charge = charge.clone();
            let kind = if declined {
                EventKind::ChargeFailed
            } else {
                EventKind::ChargeSucceeded
            };
            decider.event(&mut book, kind, &charge)
        };
        decider.call_back_later(event);
    });
    (StatusCode::OK, Json(json!({ "reference": reference })))
}

async fn void(State(sim): State<Sim>, headers: HeaderMap, Path(reference): Path<String>) -> Answer {
    if !sim.authorised(&headers) {
        return refused(StatusCode::UNAUTHORIZED, "bad API key");
    }
    let Ok(mut book) = sim.book.lock() else {
        return refused(StatusCode::INTERNAL_SERVER_ERROR, "poisoned");
    };
    let Some(charge) = book.charges.get_mut(&reference) else {
        return refused(StatusCode::NOT_FOUND, "no such charge");
    };
    match charge.fate {
        Fate::Pending | Fate::Succeeded => charge.fate = Fate::Voided,
        Fate::Voided | Fate::Failed => {}
        Fate::Refunded => return refused(StatusCode::PAYMENT_REQUIRED, "refunded"),
    }
    (StatusCode::OK, Json(json!({})))
}

#[derive(Deserialize)]
struct NewRefund {
    idempotency_key: String,
}

async fn refund(
    State(sim): State<Sim>,
    headers: HeaderMap,
    Path(reference): Path<String>,
    Json(body): Json<NewRefund>,
) -> Answer {
    if !sim.authorised(&headers) {
        return refused(StatusCode::UNAUTHORIZED, "bad API key");
    }
    let event = {
        let Ok(mut book) = sim.book.lock() else {
            return refused(StatusCode::INTERNAL_SERVER_ERROR, "poisoned");
        };
        let key = format!("{reference}:{}", body.idempotency_key);
        if book.refunds_by_key.contains_key(&key) {
            return (StatusCode::OK, Json(json!({})));
        }
        let Some(charge) = book.charges.get_mut(&reference) else {
            return refused(StatusCode::NOT_FOUND, "no such charge");
        };
        if charge.fate != Fate::Succeeded {
            return refused(
                StatusCode::PAYMENT_REQUIRED,
                "only a taken charge is refunded",
            );
        }
        charge.fate = Fate::Refunded;
        let charge = charge.clone();
        book.refunds_by_key.insert(key, reference.clone());
        sim.event(&mut book, EventKind::RefundSucceeded, &charge)
    };
    sim.call_back_later(event);
    (StatusCode::OK, Json(json!({})))
}

async fn set_callbacks(State(sim): State<Sim>, Json(urls): Json<Vec<String>>) -> StatusCode {
    if let Ok(mut callbacks) = sim.callbacks.lock() {
        *callbacks = urls;
    }
    StatusCode::NO_CONTENT
}

async fn ledger(State(sim): State<Sim>) -> Json<Ledger> {
    let Ok(book) = sim.book.lock() else {
        return Json(Ledger::default());
    };
    let mut out = Ledger {
        callbacks: book.callbacks.clone(),
        ..Ledger::default()
    };
    for charge in book.charges.values() {
        let totals = out.totals.entry(charge.currency.clone()).or_default();
        let amount = charge.amount_minor;
        if charge.fate == Fate::Failed {
            totals.declined += 1;
        }
        if !charge.taken {
            continue;
        }
        totals.money.charges += 1;
        totals.money.charged_minor += amount;
        let kept = match charge.fate {
            Fate::Voided => {
                totals.money.voids += 1;
                totals.money.voided_minor += amount;
                0
            }
            Fate::Refunded => {
                totals.money.refunds += 1;
                totals.money.refunded_minor += amount;
                0
            }
            _ => amount,
        };
        *out.kept_by_order
            .entry(charge.order_id.clone())
            .or_default() += kept;
    }
    Json(out)
}

/// A provider simulator in a child process of this binary (killed when
/// dropped): what the demo and the chaos run pay through.
pub struct Simulator {
    child: tokio::process::Child,
    /// Its base URL.
    pub base: String,
    http: reqwest::Client,
}

impl Simulator {
    /// Starts `seckill-tools payments` with `api_key`, `webhook_secret` and
    /// the `switches` (e.g. `["--duplicate", "0.1"]`).
    ///
    /// # Errors
    /// If it does not start and print its address within a minute.
    pub async fn spawn(
        api_key: &str,
        webhook_secret: &str,
        switches: &[&str],
    ) -> anyhow::Result<Self> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args([
                "payments",
                "--api-key",
                api_key,
                "--webhook-secret",
                webhook_secret,
            ])
            .args(switches)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the payment provider simulator")?;
        let stdout = child.stdout.take().context("its output")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the simulator did not print its address")??
            .context("the simulator ended")?;
        let base = line
            .strip_prefix("payments: listening on ")
            .with_context(|| format!("the simulator printed {line:?}"))?
            .to_owned();
        Ok(Self {
            child,
            base,
            http: reqwest::Client::new(),
        })
    }

    /// Calls back the instances at `bases` from now on.
    ///
    /// # Errors
    /// If the simulator does not answer.
    pub async fn call_back(&self, bases: &[String]) -> anyhow::Result<()> {
        let answer = self
            .http
            .put(format!("{}/v1/callbacks", self.base))
            .json(&bases)
            .send()
            .await?;
        anyhow::ensure!(
            answer.status().is_success(),
            "the simulator answered {}",
            answer.status()
        );
        Ok(())
    }

    /// Its ledger.
    ///
    /// # Errors
    /// If the simulator does not answer.
    pub async fn ledger(&self) -> anyhow::Result<Ledger> {
        Ok(self
            .http
            .get(format!("{}/v1/ledger", self.base))
            .send()
            .await?
            .json()
            .await?)
    }

    /// Its ledger once every callback it sent is acknowledged or given up
    /// (the last ones may still be on their way), or after `bound`.
    ///
    /// # Errors
    /// If the simulator does not answer.
    pub async fn settled_ledger(&self, bound: Duration) -> anyhow::Result<Ledger> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut last = self.ledger().await?;
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.ledger().await?;
            if now.callbacks == last.callbacks || tokio::time::Instant::now() >= deadline {
                return Ok(now);
            }
            last = now;
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
