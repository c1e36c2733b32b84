//! The buyer model: what buyers do with their orders after the purchase
//! (pay at once, cancel, or never pay and let the deadline pass) and after
//! the payment (keep the voucher, have it refunded, or redeem it at the
//! shop), the units given back sold again to new buyers round after round,
//! and the invariants of an order's whole life, checked against the
//! answers and the stores at the end.
//!
//! Each round acts on the orders its buyers hold: once an order is stored,
//! its buyer pays (with an idempotency key, asked twice for one order in
//! ten; with a provider that confirms by callback, the order is followed
//! until the callback pays it), cancels, or does nothing until the sweep
//! expires it. A paid order is then kept, refunded (its unit back on sale)
//! or redeemed by the shop's operator with its code. The units that came
//! back are then bought by new users, whose orders make the next round. In
//! the last round every buyer pays and keeps, so a completed run ends with
//! every unit paid or used.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;

use seckill::auth::{Principal, Tokens};

use super::checks::{Check, LifeFigures};

/// Shares of buyers who pay at once and who cancel (the rest never pay);
/// of those who paid, shares who have it refunded and who redeem it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuyerModel {
    pay: f64,
    cancel: f64,
    refund: f64,
    redeem: f64,
}

/// What one buyer does with a paid order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterPay {
    Keep,
    Refund,
    Redeem,
}

/// What one buyer does with an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Pay,
    Cancel,
    NeverPay,
}

impl BuyerModel {
    /// A model where `pay` of the buyers pay at once and `cancel` cancel.
    ///
    /// # Errors
    /// Shares outside 0..=1, or adding up to more than 1.
    pub fn new(pay: f64, cancel: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&pay) && (0.0..=1.0).contains(&cancel) && pay + cancel <= 1.0,
            "the pay and cancel shares must be between 0 and 1 and add up to 1 at most"
        );
        Ok(Self {
            pay,
            cancel,
            refund: 0.0,
            redeem: 0.0,
        })
    }

    /// This model where `refund` of the paying buyers have the order
    /// refunded and `redeem` redeem it at the shop (the rest keep it).
    ///
    /// # Errors
    /// Shares outside 0..=1, or adding up to more than 1.
    pub fn with_after_payment(self, refund: f64, redeem: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&refund)
                && (0.0..=1.0).contains(&redeem)
                && refund + redeem <= 1.0,
            "the refund and redeem shares must be between 0 and 1 and add up to 1 at most"
        );
        Ok(Self {
            refund,
            redeem,
            ..self
        })
    }

    /// The shares of paying buyers who have it refunded, and who redeem it.
    pub fn after_payment(&self) -> (f64, f64) {
        (self.refund, self.redeem)
    }

    /// The share of buyers who cancel.
    pub fn cancel_share(&self) -> f64 {
        self.cancel
    }

    /// The share of buyers who never pay.
    pub fn never_pay(&self) -> f64 {
        (1.0 - self.pay - self.cancel).max(0.0)
    }

    /// What `user` does: the same for the same user (a hash of the id), so
    /// a run can be repeated.
    fn choose(&self, user: i64) -> Choice {
        let share = spread(user as u64);
        if share < self.pay {
            Choice::Pay
        } else if share < self.pay + self.cancel {
            Choice::Cancel
        } else {
            Choice::NeverPay
        }
    }

    /// What `user` does once paid: the same for the same user.
    fn choose_after(&self, user: i64) -> AfterPay {
        let share = spread((user as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1);
        if share < self.refund {
            AfterPay::Refund
        } else if share < self.refund + self.redeem {
            AfterPay::Redeem
        } else {
            AfterPay::Keep
        }
    }
}

/// A number in 0..1 from `x`, well spread for consecutive ids
/// (SplitMix64's finaliser).
fn spread(mut x: u64) -> f64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Where and how the after-sale runs.
#[derive(Debug, Clone)]
pub struct AfterSalePlan {
    /// Base URLs of the instances (requests go round-robin).
    pub bases: Vec<String>,
    /// The voucher sold.
    pub voucher: i64,
    /// The buyer model.
    pub model: BuyerModel,
    /// Rounds at most; the last one's buyers all pay.
    pub rounds: u32,
    /// The voucher's payment window.
    pub pay_within: Duration,
    /// Buyers acting at once.
    pub concurrency: usize,
    /// The first user id of the new buyers (above the purchase run's).
    pub first_new_user: i64,
}

/// What the after-sale saw.
#[derive(Debug, Clone, Default)]
pub struct AfterSale {
    /// Rounds run.
    pub rounds: u32,
    /// Orders answered `paid` (and kept).
    pub paid: HashSet<i64>,
    /// Paid orders the shop redeemed (answered `used`).
    pub used: HashSet<i64>,
    /// Paid orders refunded (answered `refunded`).
    pub refunded: HashSet<i64>,
    /// Orders answered `cancelled`.
    pub cancelled: HashSet<i64>,
    /// Orders seen `expired`.
    pub expired: HashSet<i64>,
    /// Units given back (cancelled, expired or refunded) and bought again.
    pub resold: usize,
    /// Payments asked a second time with their key that answered the same.
    pub repeats_same: usize,
    /// Payments asked a second time.
    pub repeats: usize,
    /// Answers that were not what the order's state called for.
    pub unexpected: Vec<String>,
    /// Purchases of the resale whose answer was lost (each may have bought).
    pub unknown_purchases: usize,
    /// Whether a resale bought fewer units than came back (the purchase
    /// run's buyers took them, or they came back too late), or units came
    /// back in the last round.
    pub short: bool,
    /// Whether a round ended with no unit given back and nothing
    /// unexpected: every unit sold is then paid.
    pub completed: bool,
}

struct Client<'a> {
    http: &'a reqwest::Client,
    tokens: &'a Tokens,
    bases: &'a [String],
    next: AtomicUsize,
}

impl Client<'_> {
    fn base(&self) -> &str {
        &self.bases[self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len()]
    }

    fn token(&self, user: i64) -> String {
        self.tokens
            .mint(Principal::User(user), Duration::from_secs(3600))
    }

    /// `(status, body)` of a request; `None` if no answer came.
    async fn send(&self, request: reqwest::RequestBuilder) -> Option<(u16, Value)> {
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.json().await.unwrap_or(Value::Null)))
    }

    async fn order(&self, user: i64, order: i64) -> Option<(u16, Value)> {
        let url = format!("{}/api/orders/{order}", self.base());
        self.send(self.http.get(url).bearer_auth(self.token(user)))
            .await
    }

    /// Pays or refunds (with the order's own key) or cancels `order`. All
    /// are idempotent, so an answer that was lost, or a 503, is asked again
    /// (on the next instance) until one comes, for up to a minute.
    async fn act(&self, user: i64, order: i64, action: &str) -> Option<(u16, Value)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let url = format!("{}/api/orders/{order}/{action}", self.base());
            let mut request = self.http.post(url).bearer_auth(self.token(user));
            if action != "cancel" {
                let key = format!("after-sale-{action}-{order}");
                request = request.header("Idempotency-Key", key);
            }
            match self.send(request).await {
                Some((503, _)) | None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                answer => return answer,
            }
        }
    }

    /// Redeems the order whose code is `code`, as the shop's operator;
    /// asked again like [`Client::act`] (a second redemption of a code that
    /// was used answers 409 `order_used`).
    async fn redeem(&self, code: &str) -> Option<(u16, Value)> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let admin = self
            .tokens
            .mint(Principal::Admin, Duration::from_secs(3600));
        loop {
            let url = format!("{}/api/redemptions", self.base());
            let request = self
                .http
                .post(url)
                .bearer_auth(&admin)
                .json(&serde_json::json!({ "code": code }));
            match self.send(request).await {
                Some((503, _)) | None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                answer => return answer,
            }
        }
    }

    /// Polls order `order` until its state is one of `states` (or `bound`
    /// passes); the last body seen.
    async fn until_state(&self, user: i64, order: i64, states: &[&str], bound: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let body = match self.order(user, order).await {
                Some((200, body)) => body,
                _ => Value::Null,
            };
            let state = body["state"].as_str().unwrap_or("");
            if states.contains(&state) || tokio::time::Instant::now() >= deadline {
                return body;
            }
            // The pipeline and the sweep are other tasks: nothing to await.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What happened to one order.
enum Fate {
    /// Paid (and kept, redeemed or refunded); whether a payment asked again
    /// answered the same.
    Paid {
        repeated: Option<bool>,
        then: Then,
    },
    Cancelled,
    Expired,
    Unexpected(String),
}

/// What became of a paid order.
enum Then {
    Kept,
    Used,
    /// Refunded; whether its unit went back on sale.
    Refunded {
        returned: bool,
    },
}

/// Runs the after-sale on `orders` (`(user, order id)`, the purchase run's
/// accepted ones).
pub async fn run(
    http: &reqwest::Client,
    tokens: &Tokens,
    plan: &AfterSalePlan,
    mut orders: Vec<(i64, i64)>,
) -> AfterSale {
    let client = Client {
        http,
        tokens,
        bases: &plan.bases,
        next: AtomicUsize::new(0),
    };
    let mut seen = AfterSale::default();
    let mut next_user = plan.first_new_user;
    // Stored within this of the purchase; expired within this of the
    // deadline (the sweep runs every second by default).
    let stored_within = Duration::from_secs(60);
    let expired_within = plan.pay_within + Duration::from_secs(60);
    for round in 1..=plan.rounds.max(1) {
        seen.rounds = round;
        let last = round == plan.rounds.max(1);
        let fates: Vec<(i64, Fate)> = futures_util::stream::iter(orders.iter().copied())
            .map(|(user, order)| {
                let client = &client;
                let (choice, after) = if last {
                    (Choice::Pay, AfterPay::Keep)
                } else {
                    (plan.model.choose(user), plan.model.choose_after(user))
                };
                async move {
                    let mut fate =
                        one_order(client, user, order, choice, stored_within, expired_within).await;
                    if let Fate::Paid { repeated, .. } = fate {
                        fate = after_payment(client, user, order, after, expired_within)
                            .await
                            .map_or_else(Fate::Unexpected, |then| Fate::Paid { repeated, then });
                    }
                    (order, fate)
                }
            })
            .buffer_unordered(plan.concurrency.max(1))
            .collect()
            .await;
        let mut returned = 0;
        for (order, fate) in fates {
            match fate {
                Fate::Paid { repeated, then } => {
                    match then {
                        Then::Kept => seen.paid.insert(order),
                        Then::Used => seen.used.insert(order),
                        Then::Refunded { returned: back } => {
                            returned += usize::from(back);
                            seen.refunded.insert(order)
                        }
                    };
                    if let Some(same) = repeated {
                        seen.repeats += 1;
                        seen.repeats_same += usize::from(same);
                    }
                }
                Fate::Cancelled => {
                    seen.cancelled.insert(order);
                    returned += 1;
                }
                Fate::Expired => {
                    seen.expired.insert(order);
                    returned += 1;
                }
                Fate::Unexpected(what) => seen.unexpected.push(what),
            }
        }
        if returned == 0 {
            seen.completed = seen.unexpected.is_empty();
            break;
        }
        if last {
            // Units came back in the last round (a payment met its
            // deadline first): no round is left to sell and follow them.
            seen.short = true;
            break;
        }
        // The units that came back, bought by new users.
        let bought = resell(&client, plan.voucher, returned, &mut next_user, &mut seen).await;
        seen.short |= bought.len() < returned;
        seen.resold += bought.len();
        orders = bought;
    }
    // A unit bought with a lost answer, or one no new buyer could get, is
    // not in the rounds: the run cannot end with every unit paid.
    seen.completed &= seen.unknown_purchases == 0 && !seen.short;
    seen
}

/// Waits until `order` is stored, then does what `choice` says.
async fn one_order(
    client: &Client<'_>,
    user: i64,
    order: i64,
    choice: Choice,
    stored_within: Duration,
    expired_within: Duration,
) -> Fate {
    let stored = client
        .until_state(user, order, &["reserved", "expired"], stored_within)
        .await;
    match stored["state"].as_str() {
        Some("reserved") => {}
        // Stored only after its deadline (a slow pipeline, a short window).
        Some("expired") => return Fate::Expired,
        _ => return Fate::Unexpected(format!("order {order} not stored in time: {stored}")),
    }
    match choice {
        Choice::Pay => match client.act(user, order, "pay").await {
            Some((200, paid)) if paid["state"] == "paid" => {
                // One order in ten asks again with its key.
                let repeated = if order % 10 == 0 {
                    let again = client.act(user, order, "pay").await;
                    Some(matches!(again, Some((200, body)) if body["paid_ms"] == paid["paid_ms"]))
                } else {
                    None
                };
                Fate::Paid {
                    repeated,
                    then: Then::Kept,
                }
            }
            // Asked of a provider that confirms by callback: paid when it
            // calls back (or expired, if it does not in time).
            Some((202, pending)) if pending["payment"] == "pending" => {
                let body = client
                    .until_state(user, order, &["paid", "expired"], expired_within)
                    .await;
                match body["state"].as_str() {
                    Some("paid") => {
                        let repeated = if order % 10 == 0 {
                            let again = client.act(user, order, "pay").await;
                            Some(matches!(again, Some((200, b)) if b["paid_ms"] == body["paid_ms"]))
                        } else {
                            None
                        };
                        Fate::Paid {
                            repeated,
                            then: Then::Kept,
                        }
                    }
                    Some("expired") => Fate::Expired,
                    _ => Fate::Unexpected(format!(
                        "order {order} not paid by callback in time: {body}"
                    )),
                }
            }
            // Too late: the deadline passed first, and the unit came back.
            Some((409, body)) if body["code"] == "order_expired" => Fate::Expired,
            other => Fate::Unexpected(format!("paying order {order}: {other:?}")),
        },
        Choice::Cancel => match client.act(user, order, "cancel").await {
            Some((200, body)) if body["state"] == "cancelled" => Fate::Cancelled,
            Some((409, body)) if body["code"] == "order_expired" => Fate::Expired,
            other => Fate::Unexpected(format!("cancelling order {order}: {other:?}")),
        },
        Choice::NeverPay => {
            let body = client
                .until_state(user, order, &["expired"], expired_within)
                .await;
            if body["state"] == "expired" {
                Fate::Expired
            } else {
                Fate::Unexpected(format!("order {order} did not expire in time: {body}"))
            }
        }
    }
}

/// What the buyer of paid order `order` does next: keeps it, has it
/// refunded (followed until the provider's callback refunds it), or the
/// shop redeems it with the code the order shows; `Err` says what was
/// unexpected.
async fn after_payment(
    client: &Client<'_>,
    user: i64,
    order: i64,
    after: AfterPay,
    bound: Duration,
) -> Result<Then, String> {
    match after {
        AfterPay::Keep => Ok(Then::Kept),
        AfterPay::Refund => {
            let body = match client.act(user, order, "refund").await {
                Some((200, body)) if body["state"] == "refunded" => body,
                Some((202, body)) if body["state"] == "refunding" => {
                    client.until_state(user, order, &["refunded"], bound).await
                }
                other => return Err(format!("refunding order {order}: {other:?}")),
            };
            match body["state"].as_str() {
                Some("refunded") => Ok(Then::Refunded {
                    returned: body["unit_returned"] == true,
                }),
                _ => Err(format!("order {order} not refunded in time: {body}")),
            }
        }
        AfterPay::Redeem => {
            let body = client.until_state(user, order, &["paid"], bound).await;
            let Some(code) = body["redeem_code"].as_str() else {
                return Err(format!("paid order {order} shows no code: {body}"));
            };
            match client.redeem(code).await {
                Some((200, used)) if used["state"] == "used" => Ok(Then::Used),
                other => Err(format!("redeeming order {order}: {other:?}")),
            }
        }
    }
}

/// New users buy up to `units` of `voucher` (fewer if the purchase run's
/// own buyers took some already); their orders `(user, order id)`. A
/// `sold_out` may be an instance's memory of a moment ago (1 s), or a unit
/// whose return has not reached Redis yet: asked again a few times, a
/// second apart, before the units count as gone.
async fn resell(
    client: &Client<'_>,
    voucher: i64,
    units: usize,
    next_user: &mut i64,
    seen: &mut AfterSale,
) -> Vec<(i64, i64)> {
    let mut bought = Vec::new();
    let mut sold_out_waves = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // A unit given back reaches Redis within a sweep or two (longer while
    // Redis restarts): sold out is believed after this many waves.
    while bought.len() < units && sold_out_waves < 4 && tokio::time::Instant::now() < deadline {
        let users: Vec<i64> = (0..units - bought.len())
            .map(|_| {
                *next_user += 1;
                *next_user
            })
            .collect();
        let answers: Vec<(i64, Option<(u16, Value)>)> = futures_util::stream::iter(users)
            .map(|user| async move {
                let url = format!("{}/api/vouchers/{voucher}/seckill", client.base());
                let answer = client
                    .send(client.http.post(url).bearer_auth(client.token(user)))
                    .await;
                (user, answer)
            })
            .buffer_unordered(64)
            .collect()
            .await;
        let mut sold_out = false;
        for (user, answer) in answers {
            match answer {
                Some((200, body)) => match body["order_id"].as_str().and_then(|s| s.parse().ok()) {
                    Some(order) => bought.push((user, order)),
                    None => seen
                        .unexpected
                        .push(format!("purchase answer without an id: {body}")),
                },
                Some((409, body)) if body["code"] == "sold_out" => sold_out = true,
                // May have bought (a 503 after the purchase reached Redis,
                // or a lost answer: an unknown outcome); its buyer never
                // pays, so the sweep gives such a unit back. The next wave
                // asks for the unit again.
                Some((503, _)) | None => seen.unknown_purchases += 1,
                other => seen.unexpected.push(format!("buying again: {other:?}")),
            }
        }
        if bought.len() < units && !sold_out {
            // A dependency down: not before it may be back.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if sold_out {
            sold_out_waves += 1;
            tokio::time::sleep(seckill::store::SOLD_OUT_MEMORY + Duration::from_millis(100)).await;
        }
    }
    bought
}

/// The invariants of the after-sale: from the answers, and from the stores'
/// figures when given (`states`: the database's `(reserved, paid,
/// cancelled, expired)`; `db_stock`; on the fast path Redis' stock and
/// returned orders).
///
/// `sold_out`: the purchase run sold the whole stock (then buyers remained
/// for every unit given back). `unknown_before`: the purchase run's
/// purchases with an unknown outcome, whose orders (if any) nobody follows.
pub fn checks(
    seen: &AfterSale,
    stock: i64,
    sold_out: bool,
    unknown_before: usize,
    stores: Option<&LifeFigures>,
) -> Vec<Check> {
    let returned: HashSet<i64> = seen.cancelled.union(&seen.expired).copied().collect();
    let after_payment: HashSet<i64> = seen.used.union(&seen.refunded).copied().collect();
    let mut checks = vec![
        Check::new(
            format!(
                "after-sale: every answer as the order's state called for ({} not)",
                seen.unexpected.len()
            ),
            seen.unexpected.is_empty(),
        ),
        Check::new(
            "no order both paid and given back (answers)",
            seen.paid.is_disjoint(&returned) && after_payment.is_disjoint(&returned),
        ),
        Check::new(
            "no order both used and refunded (answers)",
            seen.used.is_disjoint(&seen.refunded),
        ),
        Check::new(
            format!(
                "a payment asked again with its key answered the same ({} of {})",
                seen.repeats_same, seen.repeats
            ),
            seen.repeats_same == seen.repeats,
        ),
    ];

    if let Some(figures) = stores {
        let seckill::db::StateCounts {
            reserved,
            paid,
            cancelled,
            expired,
            ..
        } = figures.states;
        checks.push(Check::new(
            "stock = available + reserved + paid + used + refunded units kept (database)",
            figures.db_stock + figures.states.holding_units() == stock,
        ));
        checks.push(Check::new(
            "the database's paid, used, refunded and cancelled orders are those answered so",
            paid as usize == seen.paid.len()
                && cancelled as usize == seen.cancelled.len()
                && figures.states.used as usize == seen.used.len()
                && figures.states.refunded as usize == seen.refunded.len(),
        ));
        // An order bought with an unknown outcome (in the purchase run or
        // a resale) is never acted on: it expires (or is still reserved)
        // without the run seeing it.
        let unknown = seen.unknown_purchases + unknown_before;
        checks.push(Check::new(
            format!(
                "every expired order was seen expired or bought with an unknown outcome ({} seen expired, {unknown} such purchases; database: {expired} expired, {reserved} reserved)",
                seen.expired.len()
            ),
            (expired as usize) >= seen.expired.len()
                && (expired + reserved) as usize <= seen.expired.len() + unknown,
        ));
        // Claims are unique per user by the database's own constraint; the
        // check is that exactly the orders holding a unit hold one.
        checks.push(Check::new(
            format!(
                "one live order per user (database: {} claims, {} orders holding a unit)",
                figures.states.claims,
                figures.states.holding_units()
            ),
            figures.states.claims == figures.states.holding_units(),
        ));
        if let Some((redis_stock, redis_returned)) = figures.redis {
            checks.push(Check::new(
                "no unit taken back twice: Redis' returned orders = cancelled + expired + refunded units back, Redis stock = database stock",
                redis_returned == figures.states.returned() as usize
                    && redis_stock == figures.db_stock,
            ));
        }
        if seen.completed {
            checks.push(Check::new(
                "every order ends paid or given back (database: none reserved)",
                reserved == 0,
            ));
            if sold_out {
                checks.push(Check::new(
                    "every unit given back was sold again, and every unit ends paid or used (database)",
                    paid + figures.states.used == stock && figures.db_stock == 0,
                ));
            }
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_splits_buyers_by_its_shares_and_refuses_bad_ones() {
        let model = BuyerModel::new(0.7, 0.1).unwrap();
        let mut counts = [0; 3];
        for user in 1..=10_000 {
            counts[match model.choose(user) {
                Choice::Pay => 0,
                Choice::Cancel => 1,
                Choice::NeverPay => 2,
            }] += 1;
        }
        assert!((6_700..7_300).contains(&counts[0]), "{counts:?}");
        assert!((800..1_200).contains(&counts[1]), "{counts:?}");
        assert!((1_800..2_200).contains(&counts[2]), "{counts:?}");
        assert_eq!(model.choose(42), model.choose(42));
        assert!(BuyerModel::new(0.8, 0.3).is_err());
        assert!(BuyerModel::new(-0.1, 0.0).is_err());
    }

    #[test]
    fn an_order_paid_and_given_back_or_a_lost_unit_fails() {
        let mut seen = AfterSale {
            completed: true,
            ..Default::default()
        };
        seen.paid.extend([1, 2]);
        seen.cancelled.insert(2);
        seen.resold = 1;
        let failed: Vec<String> = checks(&seen, 2, true, 0, None)
            .into_iter()
            .filter(|c| !c.held)
            .map(|c| c.name)
            .collect();
        assert!(failed.contains(&"no order both paid and given back (answers)".to_owned()));
        let figures = LifeFigures {
            states: seckill::db::StateCounts {
                reserved: 0,
                paid: 2,
                cancelled: 1,
                expired: 0,
                claims: 2,
                ..Default::default()
            },
            db_stock: 1, // a unit too many came back
            redis: Some((1, 1)),
            nothing_due: true,
        };
        let failed: Vec<String> = checks(&seen, 2, true, 0, Some(&figures))
            .into_iter()
            .filter(|c| !c.held)
            .map(|c| c.name)
            .collect();
        assert!(failed.contains(
            &"stock = available + reserved + paid + used + refunded units kept (database)"
                .to_owned()
        ));
    }
}
