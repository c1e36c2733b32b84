//! The live figures of an instance: what its pages watch and what its
//! voucher reads answer from.
//!
//! One task per instance reads the stores once per [`TICK`] (the newest
//! vouchers from the database in one query, their live stock from Redis in
//! one batch) and publishes the result as a [`Snapshot`] on a
//! `tokio::sync::watch` channel. Every watcher (a page's event stream) and
//! every voucher read shares that one read, so the stores' work does not
//! grow with the number of watchers or readers.
//!
//! The task runs only while something wants the figures: a watcher is
//! subscribed, or a read came in within the last [`IDLE_AFTER`]. Parked, it
//! reads nothing; the first read after a pause wakes it and is answered
//! from the stores directly.
//!
//! **Stale-read bound.** A voucher read is answered from the snapshot only
//! if the snapshot's reads began at most [`FRESH_FOR`] before; otherwise it
//! reads the stores itself. So an answer reflects every change committed
//! [`FRESH_FOR`] before it was given. Voucher terms never change after
//! creation; the stock does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use prometheus::core::Collector;
use serde::Serialize;
use tokio::sync::{watch, Notify};

use crate::db::{Database, VoucherRow};
use crate::domain::money::Currency;
use crate::domain::voucher::{RefundRestock, Shop};
use crate::domain::waiting_room::RoomSettings;
use crate::metrics::Metrics;
use crate::sale::Sales;
use crate::store::{LineFigures, RoomLines};

/// How often the figures are read while someone wants them (at most four
/// updates a second reach a page).
pub const TICK: Duration = Duration::from_millis(250);

/// How old a snapshot may be for a voucher read to be answered from it.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// How long after the last read the task keeps reading with no watcher.
pub const IDLE_AFTER: Duration = Duration::from_secs(2);

/// Vouchers the figures cover (the newest).
pub const VOUCHERS_WATCHED: i64 = 100;

/// How long after an order's last chance to be given back (the sale's end
/// plus its payment window) a sale's stock counts as final: its last
/// figure is shown from then on without reading Redis again (the expiry
/// sweep gives back what was left unpaid within this).
pub const STOCK_FINAL_AFTER_MS: i64 = 60_000;

/// A voucher as the API and the pages show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SaleView {
    /// The voucher's id.
    pub id: i64,
    /// Its title.
    pub title: String,
    /// Units left to sell (Redis' live count on the fast path).
    pub stock_left: i64,
    /// Sale start (Unix ms).
    pub begin_ms: i64,
    /// Sale end, exclusive (Unix ms).
    pub end_ms: i64,
    /// How long a buyer has to pay (ms from the purchase).
    pub pay_within_ms: i64,
    /// Whether a buyer whose order was given back may buy again.
    pub rebuy_after_cancel: bool,
    /// The shop it is spent at (`null`: none named).
    pub shop: Option<Shop>,
    /// Its sub-title (may be empty).
    pub subtitle: String,
    /// Its rules, shown to buyers (may be empty; lines split by `\n`).
    pub rules: String,
    /// What a buyer pays, in minor units of `currency`.
    pub price_minor: i64,
    /// What it is worth at its shop, in minor units of `currency`.
    pub face_value_minor: i64,
    /// The ISO 4217 currency of both (`XXX`: a free voucher).
    pub currency: Currency,
    /// Decimal places of the currency's minor unit (2 for CNY: 1990 is
    /// 19.90), as ISO 4217 sets them.
    pub currency_exponent: u16,
    /// Whether a refunded unit goes back on sale.
    pub refund_restock: RefundRestock,
    /// Its waiting room (`null`: none): the shop's settings, and the line
    /// as the last tick read it (`null` in an answer read from the stores
    /// directly).
    pub waiting_room: Option<RoomLive>,
}

/// A sale's waiting room as the pages watch it: a person's place moves
/// with `admitted_through`, so one read per tick serves everyone waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RoomLive {
    /// The shop's settings.
    #[serde(flatten)]
    pub settings: RoomSettings,
    /// When joining opens (Unix ms).
    pub opens_ms: i64,
    /// The line, as last read.
    pub line: Option<LineFigures>,
}

impl SaleView {
    /// `row` with `stock_left` units left.
    pub fn new(row: VoucherRow, stock_left: i64) -> Self {
        Self {
            id: row.id,
            title: row.title,
            stock_left,
            begin_ms: row.begin_ms,
            end_ms: row.end_ms,
            pay_within_ms: row.pay_within_ms,
            rebuy_after_cancel: row.rebuy_after_cancel,
            shop: row.shop,
            subtitle: row.subtitle,
            rules: row.rules,
            price_minor: row.price.minor(),
            face_value_minor: row.face_value.minor(),
            currency: row.price.currency(),
            currency_exponent: row.price.currency().exponent(),
            refund_restock: row.refund_restock,
            waiting_room: row.room.map(|settings| RoomLive {
                settings,
                opens_ms: settings.opens_ms(row.begin_ms),
                line: None,
            }),
        }
    }
}

/// What the instance counts, for its operators.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct InstanceFigures {
    /// Purchases answered per second over the last tick (accepted or not).
    pub purchases_per_s: f64,
    /// Purchases this instance accepted since it started.
    pub accepted: u64,
    /// Purchases this instance refused (sold out, already bought, ...).
    pub refused: u64,
    /// Orders accepted but not yet stored (the pipeline's backlog).
    pub pipeline_backlog: i64,
    /// Orders this instance's pipeline stored.
    pub orders_stored: u64,
    /// Orders this instance dead-lettered.
    pub dead_letters: u64,
    /// Sales this instance restored or repaired in Redis.
    pub repairs: u64,
    /// Orders paid through this instance.
    pub orders_paid: u64,
    /// Orders whose unit this instance gave back (cancelled or expired).
    pub orders_returned: u64,
}

/// Whether a store answered the last tick's read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// It answered.
    Ok,
    /// It failed or did not answer.
    Unreachable,
    /// Not asked yet.
    Unknown,
}

/// The figures of one tick.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// When the reads behind `sales` began (Unix ms, the server's clock):
    /// they reflect every change committed before.
    pub as_of_ms: i64,
    /// When this snapshot was published (Unix ms, the server's clock): the
    /// pages set their countdowns by it.
    pub now_ms: i64,
    /// The newest vouchers, newest first.
    pub sales: Vec<SaleView>,
    /// Whether Redis answered the last read.
    pub redis: Health,
    /// Whether the database answered the last read.
    pub database: Health,
    /// The instance's counters.
    pub instance: InstanceFigures,
    /// Each sale as a voucher read answers it (its view with `as_of_ms`),
    /// serialised once per tick rather than once per read.
    #[serde(skip)]
    pub answers: std::collections::HashMap<i64, Bytes>,
    /// The snapshot as the pages' events carry it, serialised once per
    /// tick rather than once per watcher.
    #[serde(skip)]
    pub events: Events,
}

/// A snapshot's event payloads (JSON).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Events {
    /// The storefront's: [`Snapshot::public`].
    pub storefront: Arc<str>,
    /// The console's: the whole snapshot.
    pub console: Arc<str>,
}

/// A sale as a voucher read answers it: its view and when it was read.
#[derive(Debug, Serialize)]
pub struct SaleAnswer<'a> {
    /// The sale.
    #[serde(flatten)]
    pub sale: &'a SaleView,
    /// When the figures were read (Unix ms, the server's clock).
    pub as_of_ms: i64,
}

impl SaleAnswer<'_> {
    /// The answer as JSON (cheap to clone: one buffer shared by every
    /// read).
    pub fn to_json(&self) -> Bytes {
        serde_json::to_vec(self).map_or_else(|_| Bytes::new(), Bytes::from)
    }
}

/// What the storefront sees of a snapshot (no instance figures).
#[derive(Debug, Serialize)]
pub struct PublicSnapshot<'a> {
    /// As [`Snapshot::as_of_ms`].
    pub as_of_ms: i64,
    /// As [`Snapshot::now_ms`].
    pub now_ms: i64,
    /// Whether the figures are current: both stores answered the last
    /// read. `false`: a store is down and `sales` are the figures of
    /// `as_of_ms`, kept.
    pub current: bool,
    /// As [`Snapshot::sales`].
    pub sales: &'a [SaleView],
}

impl Snapshot {
    fn empty() -> Self {
        Self {
            as_of_ms: i64::MIN,
            now_ms: now_ms(),
            sales: Vec::new(),
            redis: Health::Unknown,
            database: Health::Unknown,
            instance: InstanceFigures::default(),
            answers: std::collections::HashMap::new(),
            events: Events::default(),
        }
    }

    /// This snapshot with its event payloads serialised.
    fn rendered(mut self) -> Self {
        let json =
            |value: serde_json::Result<String>| value.map_or_else(|_| Arc::from("{}"), Arc::from);
        self.events = Events {
            storefront: json(serde_json::to_string(&self.public())),
            console: json(serde_json::to_string(&self)),
        };
        self
    }

    /// The storefront's part.
    pub fn public(&self) -> PublicSnapshot<'_> {
        PublicSnapshot {
            as_of_ms: self.as_of_ms,
            now_ms: self.now_ms,
            current: self.redis == Health::Ok && self.database == Health::Ok,
            sales: &self.sales,
        }
    }

    /// Whether the figures are young enough to answer a read at `now`.
    fn fresh_at(&self, now: i64) -> bool {
        now.saturating_sub(self.as_of_ms) <= FRESH_FOR.as_millis() as i64
    }

    /// The same figures, times aside.
    fn same_figures(&self, other: &Self) -> bool {
        self.sales == other.sales
            && self.redis == other.redis
            && self.database == other.database
            && self.instance == other.instance
    }
}

/// The instance's live figures (see the module docs).
#[derive(Debug)]
pub struct Live {
    snapshot: watch::Sender<Arc<Snapshot>>,
    wake: Notify,
    /// When a read last asked (Unix ms).
    last_read_ms: AtomicI64,
    stop: watch::Receiver<bool>,
}

impl Live {
    /// Figures that end (streams close) when `stop` turns true.
    pub fn new(stop: watch::Receiver<bool>) -> Arc<Self> {
        Arc::new(Self {
            snapshot: watch::Sender::new(Arc::new(Snapshot::empty())),
            wake: Notify::new(),
            last_read_ms: AtomicI64::new(i64::MIN),
            stop,
        })
    }

    /// The snapshot, if it may answer a read now (see the module docs);
    /// either way the task is asked to keep reading.
    pub fn fresh(&self) -> Option<Arc<Snapshot>> {
        let now = now_ms();
        // Idleness is judged in seconds: a read writes the shared time only
        // when it moved by a tenth of a second, so concurrent reads do not
        // contend on it.
        let last = self.last_read_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 100 {
            self.last_read_ms.store(now, Ordering::Relaxed);
            if last < now - IDLE_AFTER.as_millis() as i64 {
                self.wake.notify_one();
            }
        }
        let snapshot = self.snapshot.borrow().clone();
        snapshot.fresh_at(now).then_some(snapshot)
    }

    /// A watcher's view: the current snapshot at once, then each change.
    pub fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        let receiver = self.snapshot.subscribe();
        self.wake.notify_one();
        receiver
    }

    /// Resolves when the service stops (watchers' streams end then).
    pub async fn stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|stopped| *stopped).await;
    }

    fn wanted(&self) -> bool {
        self.snapshot.receiver_count() > 0
            || self.last_read_ms.load(Ordering::Relaxed) >= now_ms() - IDLE_AFTER.as_millis() as i64
    }

    /// Watchers subscribed now.
    pub fn watchers(&self) -> usize {
        self.snapshot.receiver_count()
    }
}

/// Reads the figures every [`TICK`] while they are wanted, until the
/// service stops.
pub async fn tick_until_stopped(
    live: Arc<Live>,
    db: Database,
    sales: Arc<Sales>,
    lines: RoomLines,
    metrics: Metrics,
) {
    let mut counters = Counters::default();
    let mut stop = live.stop.clone();
    loop {
        if *stop.borrow() {
            return;
        }
        if !live.wanted() {
            tokio::select! {
                () = live.wake.notified() => {}
                _ = stop.changed() => {}
                // Also look again now and then: a watcher that subscribed
                // while the check above ran has its wake-up stored, but a
                // read's may not be.
                () = tokio::time::sleep(IDLE_AFTER) => {}
            }
            continue;
        }
        let next = tokio::time::Instant::now() + TICK;
        let previous = live.snapshot.borrow().clone();
        let snapshot = read(&db, &sales, &lines, &metrics, &mut counters, &previous)
            .await
            .rendered();
        live.snapshot.send_if_modified(|current| {
            let changed = !current.same_figures(&snapshot) || current.as_of_ms == i64::MIN;
            // A reader needs the new time even when nothing else moved.
            *current = Arc::new(snapshot);
            changed
        });
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => {}
        }
    }
}

/// The counters' values at the previous tick, for rates.
#[derive(Debug, Default)]
struct Counters {
    purchases: u64,
    at: Option<tokio::time::Instant>,
}

/// One tick's reads. A store that fails leaves the previous figures (and
/// their time: reads then go to the stores themselves) and says so.
async fn read(
    db: &Database,
    sales: &Sales,
    lines: &RoomLines,
    metrics: &Metrics,
    counters: &mut Counters,
    previous: &Snapshot,
) -> Snapshot {
    let as_of_ms = now_ms();
    let instance = instance_figures(metrics, counters);
    let rows = match db.vouchers(VOUCHERS_WATCHED).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::debug!(error = %e, "live figures: database read failed");
            return Snapshot {
                now_ms: now_ms(),
                database: Health::Unreachable,
                instance,
                ..previous.clone()
            };
        }
    };
    // A sale whose stock can no longer change keeps its last figure: only
    // the others cost a read (ended sales would otherwise cost one per
    // tick each, for as long as anyone watches).
    let known: HashMap<i64, i64> = (previous.sales.iter())
        .map(|sale| (sale.id, sale.stock_left))
        .collect();
    let final_stock = |row: &VoucherRow| {
        let last_give_back = row.end_ms.saturating_add(row.pay_within_ms);
        (as_of_ms > last_give_back.saturating_add(STOCK_FINAL_AFTER_MS))
            .then(|| known.get(&row.id).copied())
            .flatten()
    };
    let stocks: Vec<(i64, i64)> = (rows.iter())
        .filter(|row| final_stock(row).is_none())
        .map(|row| (row.id, row.stock))
        .collect();
    // The lines of the rooms of sales not ended, in the same tick.
    let rooms: Vec<i64> = (rows.iter())
        .filter(|row| row.room.is_some() && row.end_ms > as_of_ms)
        .map(|row| row.id)
        .collect();
    let read_both = async {
        let left = sales.stock_left(&stocks).await?;
        let figures = lines.lines(&rooms).await?;
        Ok::<_, crate::Error>((left, figures))
    };
    match read_both.await {
        Ok((read, figures)) => {
            let mut read = read.into_iter();
            let figures: HashMap<i64, LineFigures> = rooms.into_iter().zip(figures).collect();
            let sales: Vec<SaleView> = rows
                .into_iter()
                .filter_map(|row| {
                    let left = final_stock(&row).or_else(|| read.next())?;
                    let line = figures.get(&row.id).copied();
                    let mut view = SaleView::new(row, left);
                    if let Some(room) = &mut view.waiting_room {
                        room.line = line;
                    }
                    Some(view)
                })
                .collect();
            let answers = sales
                .iter()
                .map(|sale| (sale.id, SaleAnswer { sale, as_of_ms }.to_json()))
                .collect();
            Snapshot {
                as_of_ms,
                now_ms: now_ms(),
                sales,
                redis: Health::Ok,
                database: Health::Ok,
                instance,
                answers,
                events: Events::default(),
            }
        }
        Err(e) => {
            tracing::debug!(error = %e, "live figures: Redis read failed");
            Snapshot {
                now_ms: now_ms(),
                redis: Health::Unreachable,
                database: Health::Ok,
                instance,
                ..previous.clone()
            }
        }
    }
}

/// The purchase route as the request counter names it.
const PURCHASE_ROUTE: &str = "/api/vouchers/{id}/seckill";

fn instance_figures(metrics: &Metrics, counters: &mut Counters) -> InstanceFigures {
    let (mut accepted, mut refused) = (0u64, 0u64);
    for family in metrics.requests.collect() {
        for metric in family.get_metric() {
            let label = |name: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|l| l.name() == name)
                    .map(|l| l.value().to_owned())
            };
            if label("route").as_deref() != Some(PURCHASE_ROUTE) {
                continue;
            }
            let count = metric.get_counter().get_value() as u64;
            match label("outcome").as_deref() {
                Some("ok") => accepted += count,
                // Refusals the buyer is told about (sold out, already
                // bought, not started, ended, rate-limited); not errors.
                Some("409" | "429") => refused += count,
                _ => {}
            }
        }
    }
    let now = tokio::time::Instant::now();
    let purchases = accepted + refused;
    let purchases_per_s = match counters.at {
        Some(at) if now > at => {
            purchases.saturating_sub(counters.purchases) as f64 / (now - at).as_secs_f64()
        }
        _ => 0.0,
    };
    counters.purchases = purchases;
    counters.at = Some(now);
    let sum = |vec: &prometheus::IntCounterVec| -> u64 {
        vec.collect()
            .iter()
            .flat_map(|f| f.get_metric().iter())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    };
    InstanceFigures {
        purchases_per_s: (purchases_per_s * 10.0).round() / 10.0,
        accepted,
        refused,
        pipeline_backlog: metrics.pipeline_lag.get(),
        orders_stored: metrics.orders_stored.get(),
        dead_letters: metrics.dead_letters.get(),
        repairs: sum(&metrics.sale_repairs),
        orders_paid: metrics.orders_paid.get(),
        orders_returned: sum(&metrics.orders_returned),
    }
}

/// The server's clock, Unix ms.
pub fn now_ms() -> i64 {
    crate::domain::now_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_answers_reads_only_while_fresh() {
        let mut s = Snapshot::empty();
        assert!(!s.fresh_at(now_ms()), "nothing read yet");
        s.as_of_ms = 10_000;
        assert!(s.fresh_at(10_000 + FRESH_FOR.as_millis() as i64));
        assert!(!s.fresh_at(10_001 + FRESH_FOR.as_millis() as i64));
    }
}
