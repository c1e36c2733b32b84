//! The invariants of a sale, checked after a load run: first against what
//! the service answered, then against Redis and the database themselves.

use std::collections::HashSet;
use std::time::Duration;

use seckill::store::Redis;
use serde::Serialize;

use seckill::db::Database;
use seckill::reconcile::{reconcile, Reconciliation};

use super::load::Record;

/// One invariant and whether it held.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What must hold.
    pub name: String,
    /// Whether it did.
    pub held: bool,
}

impl Check {
    /// A check named `name` that `held` or not.
    pub fn new(name: impl Into<String>, held: bool) -> Self {
        Self {
            name: name.into(),
            held,
        }
    }
}

/// The sale a run bought from.
#[derive(Debug, Clone, Copy)]
pub struct Sale<'a> {
    /// The voucher.
    pub voucher: i64,
    /// Its stock when the run began.
    pub stock: i64,
    /// What the run saw.
    pub record: &'a Record,
    /// Orders given back (cancelled, or not paid in time) when the stores
    /// were checked: each unit may have been sold again (0 without a
    /// database).
    pub returned: usize,
}

/// What the answers alone prove or disprove. A request whose answer was
/// lost ([`Record::unknown_users`](super::load::Record)) may have bought:
/// it counts as possibly sold, never as certainly either.
pub fn from_answers(sale: Sale<'_>) -> Vec<Check> {
    let record = sale.record;
    let accepted = record.orders.len() as i64;
    let unknown = record.unknown_users.len() as i64;
    let users: HashSet<i64> = record.orders.iter().map(|o| o.user_id).collect();
    let ids: HashSet<i64> = record.orders.iter().map(|o| o.order_id).collect();
    vec![
        Check::new("no request failed", record.errors() == 0),
        Check::new(
            "no oversell: accepted <= stock + orders given back",
            accepted <= sale.stock + sale.returned as i64,
        ),
        Check::new(
            "one accepted order per user, but for orders given back",
            users.len() as i64 + sale.returned as i64 >= accepted,
        ),
        Check::new("order ids are unique", ids.len() as i64 == accepted),
        Check::new(
            "sold out only once the stock may have been gone (accepted + unknown >= stock)",
            record.count("sold_out") == 0 || accepted + unknown >= sale.stock,
        ),
    ]
}

/// The orders the database holds for the sale, `(order id, user id)`,
/// against the answers: accepted ⊆ stored ⊆ accepted ∪ unknown; `returned`:
/// those given back since (their units may have sold again). Also returns
/// how many stored orders had an unknown outcome.
pub fn stored_checks(
    sale: Sale<'_>,
    stored: &[(i64, i64)],
    returned: &HashSet<i64>,
) -> (Vec<Check>, u64) {
    let record = sale.record;
    let accepted: HashSet<i64> = record.orders.iter().map(|o| o.order_id).collect();
    let unknown: HashSet<i64> = record.unknown_users.iter().copied().collect();
    let stored_ids: HashSet<i64> = stored.iter().map(|(id, _)| *id).collect();
    let live: Vec<&(i64, i64)> = stored
        .iter()
        .filter(|(id, _)| !returned.contains(id))
        .collect();
    let live_users: HashSet<i64> = live.iter().map(|(_, user)| *user).collect();
    let not_accepted: Vec<&(i64, i64)> = stored
        .iter()
        .filter(|(id, _)| !accepted.contains(id))
        .collect();
    let unknown_stored = not_accepted
        .iter()
        .filter(|(_, user)| unknown.contains(user))
        .count();
    let live_count = live.len() as i64;
    let mut checks = vec![
        Check::new(
            "every accepted order is stored (accepted ⊆ stored)",
            accepted.is_subset(&stored_ids),
        ),
        Check::new(
            "every stored order was accepted or its answer was lost (stored ⊆ accepted ∪ unknown)",
            unknown_stored == not_accepted.len(),
        ),
        Check::new(
            "no oversell: live orders (stored, not given back) <= stock",
            live_count <= sale.stock,
        ),
        Check::new("one live order per user", live_users.len() == live.len()),
    ];
    if record.count("sold_out") > 0 {
        checks.push(Check::new(
            "sold out only once the stock was gone (every unit stored once at least)",
            stored.len() as i64 >= sale.stock,
        ));
    }
    (checks, unknown_stored as u64)
}

/// The stores' figures of a sale at the end of an after-sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifeFigures {
    /// How many of the database's orders are in each state.
    pub states: seckill::db::StateCounts,
    /// The database's stock.
    pub db_stock: i64,
    /// On the fast path: Redis' stock and how many orders it took back.
    pub redis: Option<(i64, usize)>,
    /// Whether no order was due before the figures were read (none past
    /// its deadline still reserved, no return left for Redis): the sweep
    /// had caught up.
    pub nothing_due: bool,
}

/// What the stores showed.
#[derive(Debug, Clone, Default)]
pub struct Verified {
    /// The invariants checked against the stores.
    pub checks: Vec<Check>,
    /// Where Redis and the database disagree, for people.
    pub differences: Vec<String>,
    /// Requests with an unknown outcome whose order turned out stored
    /// (`None`: no database to look in).
    pub unknown_stored: Option<u64>,
    /// The sale's orders given back when checked.
    pub returned: usize,
}

/// Redis and the database, when the run was given them.
pub struct Stores {
    redis: Option<Redis>,
    db: Option<Database>,
}

impl Stores {
    /// Connects to whichever of the two is given (a `rediss` URL with
    /// `redis_tls`'s trust).
    ///
    /// # Errors
    /// If a given store cannot be reached.
    pub async fn connect(
        redis_url: Option<&str>,
        redis_tls: &seckill::store::RedisTls,
        database_url: Option<&str>,
        prefix: &str,
    ) -> anyhow::Result<Self> {
        let redis = match redis_url {
            Some(url) => Some(Redis::new(
                seckill::store::connect_with(url, redis_tls).await?,
                prefix,
            )),
            None => None,
        };
        let db = match database_url {
            Some(url) => Some(Database::connect(url).await?),
            None => None,
        };
        Ok(Self { redis, db })
    }

    /// The orders stored for `voucher`, `(order id, user id, given back)`
    /// (none without a database).
    ///
    /// # Errors
    /// If the database fails.
    pub async fn orders(&self, voucher: i64) -> anyhow::Result<Vec<(i64, i64, bool)>> {
        Ok(match &self.db {
            Some(db) => db
                .voucher_order_states(voucher)
                .await?
                .into_iter()
                .map(|o| (o.order_id, o.user_id, o.returned))
                .collect(),
            None => Vec::new(),
        })
    }

    /// Every stored order of `voucher` with its state and amount (`None`
    /// without a database).
    ///
    /// # Errors
    /// If the database fails.
    pub async fn order_money(
        &self,
        voucher: i64,
    ) -> anyhow::Result<Option<Vec<seckill::db::OrderStateRow>>> {
        Ok(match &self.db {
            Some(db) => Some(db.voucher_order_states(voucher).await?),
            None => None,
        })
    }

    /// The figures of an order's life for `voucher` (`None` without a
    /// database); Redis' side only when `fast_path` (on the locked path
    /// the database alone holds the stock).
    ///
    /// # Errors
    /// If a store fails.
    pub async fn life_figures(
        &self,
        voucher: i64,
        fast_path: bool,
    ) -> anyhow::Result<Option<LifeFigures>> {
        let Some(db) = &self.db else {
            return Ok(None);
        };
        // Whether anything is due is read first. Read last, it could see
        // a sweep that ran after the states were read: an order past its
        // deadline counted reserved, then expired and taken back before
        // the question, and the figures would look settled while one of
        // them is stale. Read first, nothing already due can change
        // under the reads that follow; an order whose deadline passes
        // meanwhile shows as Redis and the database disagreeing, and the
        // caller reads again.
        let nothing_due = db.due_orders(1).await?.is_empty();
        let states = db.order_states(voucher).await?;
        let db_stock = db.voucher_stock(voucher).await?.unwrap_or(0);
        let redis = match &self.redis {
            Some(conn) if fast_path => {
                let sale = seckill::store::read_sale(conn, voucher).await?;
                Some((sale.stock.unwrap_or(0), sale.returned.len()))
            }
            _ => None,
        };
        Ok(Some(LifeFigures {
            states,
            db_stock,
            redis,
            nothing_due,
        }))
    }

    /// Where Redis and the database disagree about `voucher` now (none
    /// without both, or on the locked path; a failure is a line too).
    pub async fn differences(&self, voucher: i64, fast_path: bool) -> Vec<String> {
        let (Some(conn), Some(db), true) = (&self.redis, &self.db, fast_path) else {
            return Vec::new();
        };
        match reconcile(conn, db, voucher).await {
            Ok(found) => found.differences(),
            Err(e) => vec![format!("reconcile failed: {e}")],
        }
    }

    /// Entries in the dead-letter stream (0 without Redis).
    ///
    /// # Errors
    /// If Redis fails.
    pub async fn dead_letters(&self) -> anyhow::Result<i64> {
        Ok(match &self.redis {
            Some(redis) => {
                redis::cmd("XLEN")
                    .arg(seckill::store::dead_letter_stream(redis.prefix()))
                    .query_async(&mut redis.connection().clone())
                    .await?
            }
            None => 0,
        })
    }

    /// Waits (up to `drain_timeout`) for the accepted orders to reach the
    /// database, then checks the stores against the answers.
    /// `dead_letters_before` is [`Stores::dead_letters`] before the run.
    ///
    /// A store that fails meanwhile (restarted, failing over) is asked
    /// again until the deadline: its connection reconnects.
    ///
    /// # Errors
    /// If a store still fails at the deadline (a failed invariant is a
    /// [`Check`], not an error).
    pub async fn verify(
        &self,
        sale: Sale<'_>,
        drain_timeout: Duration,
        dead_letters_before: i64,
    ) -> anyhow::Result<Verified> {
        let deadline = tokio::time::Instant::now() + drain_timeout;
        loop {
            match self.try_verify(sale, deadline, dead_letters_before).await {
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::debug!(error = %e, "a store failed; asking again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// As [`Stores::verify`], with a store that still fails at the deadline
    /// reported as a failed check (so the run's report is still written).
    pub async fn verify_or_report(
        &self,
        sale: Sale<'_>,
        drain_timeout: Duration,
        dead_letters_before: i64,
    ) -> Verified {
        match self.verify(sale, drain_timeout, dead_letters_before).await {
            Ok(verified) => verified,
            Err(e) => Verified {
                checks: vec![Check::new(
                    format!("the stores could be checked ({e:#})"),
                    false,
                )],
                ..Default::default()
            },
        }
    }

    async fn try_verify(
        &self,
        sale: Sale<'_>,
        deadline: tokio::time::Instant,
        dead_letters_before: i64,
    ) -> anyhow::Result<Verified> {
        let Some(db) = &self.db else {
            return Ok(Verified::default());
        };
        let accepted: HashSet<i64> = sale.record.orders.iter().map(|o| o.order_id).collect();
        // The async path answers before the database has the order.
        let pipelined = sale.record.orders.iter().any(|o| o.pending);
        // Orders given back meanwhile (their deadline passing) change the
        // stock between two reads, and a give-back reaches Redis after the
        // database (the sweep finishes one a crash or an outage left half
        // done): the stores are read until one reading is quiet and
        // complete, with no unit still to go back into Redis, or the
        // deadline passes.
        let (stored, returned, db_stock, found) = loop {
            let db_stock = db.voucher_stock(sale.voucher).await?;
            let orders = db.voucher_order_states(sale.voucher).await?;
            let found = match &self.redis {
                Some(conn) if pipelined => Some(reconcile(conn, db, sale.voucher).await?),
                _ => None,
            };
            let quiet = db.voucher_stock(sale.voucher).await? == db_stock;
            let stored: Vec<(i64, i64)> = orders.iter().map(|o| (o.order_id, o.user_id)).collect();
            let returned: HashSet<i64> = orders
                .iter()
                .filter(|o| o.returned)
                .map(|o| o.order_id)
                .collect();
            let settled = found.as_ref().is_none_or(|f| {
                f.in_stream == 0 && f.pending_returns.is_empty() && f.is_consistent()
            });
            let all_in = stored
                .iter()
                .filter(|(id, _)| accepted.contains(id))
                .count();
            if (quiet && settled && all_in == accepted.len())
                || tokio::time::Instant::now() >= deadline
            {
                break (stored, returned, db_stock, found);
            }
            // The pipeline is another process: there is no event to await.
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (mut checks, unknown_stored) = stored_checks(sale, &stored, &returned);
        let live = (stored.len() - returned.len()) as i64;
        checks.push(Check::new(
            "database stock = stock - live orders",
            db_stock == Some(sale.stock - live),
        ));
        let mut verified = Verified {
            checks,
            differences: Vec::new(),
            unknown_stored: Some(unknown_stored),
            returned: returned.len(),
        };
        if let Some(found) = found {
            let dead_letters = self.dead_letters().await? - dead_letters_before;
            verified.checks.extend(redis_checks(&found, dead_letters));
            verified.differences = found.differences();
        }
        Ok(verified)
    }
}

/// On the async path Redis decides and the database follows: they must
/// agree once the pipeline has drained.
fn redis_checks(found: &Reconciliation, dead_letters: i64) -> Vec<Check> {
    vec![
        Check::new("nothing pending in the pipeline", found.in_stream == 0),
        Check::new(
            "Redis stock equals database stock",
            found.redis_stock == found.db_stock,
        ),
        Check::new("nothing dead-lettered", dead_letters == 0),
        Check::new(
            "Redis and database agree (reconcile)",
            found.is_consistent(),
        ),
    ]
}

/// Prints one line per check, then the stores' differences, then the
/// verdict; returns whether all checks held.
pub fn print(checks: &[Check], differences: &[String]) -> bool {
    for check in checks {
        println!(
            "[{}] {}",
            if check.held { "ok" } else { "FAILED" },
            check.name
        );
    }
    for difference in differences {
        println!("  {difference}");
    }
    let ok = checks.iter().all(|c| c.held);
    println!(
        "{}",
        if ok {
            "all invariants hold"
        } else {
            "INVARIANTS FAILED"
        }
    );
    ok
}

/// The money checks of a sale, against the payment provider's own ledger:
/// every order kept exactly its amount if it ends paid or used, and
/// nothing otherwise (charged less voided and refunded); in each currency
/// what the provider kept equals what the paid and used orders cost; and
/// no forged callback was taken. Also the lines of the report that show
/// the money.
pub fn money_checks(
    ledger: &crate::payments::Ledger,
    orders: &[seckill::db::OrderStateRow],
) -> (Vec<Check>, Vec<String>) {
    use seckill::domain::money::{Currency, Money};
    use seckill::domain::order::OrderState;
    use std::collections::BTreeMap;
    let show = |minor: i64, code: &str| match Currency::parse("currency", code) {
        Ok(currency) => Money::new("amount", minor, currency)
            .map_or_else(|_| format!("{minor} {code}"), |m| m.to_string()),
        Err(_) => format!("{minor} {code}"),
    };
    let mut owed: BTreeMap<String, (i64, usize)> = BTreeMap::new();
    let mut wrong = Vec::new();
    for order in orders {
        let keeps = matches!(order.state, OrderState::Paid | OrderState::Used);
        let expected = if keeps { order.amount.minor() } else { 0 };
        let kept = ledger
            .kept_by_order
            .get(&order.order_id.to_string())
            .copied()
            .unwrap_or(0);
        if kept != expected {
            wrong.push(format!(
                "order {} ({:?}): kept {kept}, owed {expected}",
                order.order_id, order.state
            ));
        }
        if keeps {
            let entry = owed
                .entry(order.amount.currency().code().to_owned())
                .or_default();
            entry.0 += order.amount.minor();
            entry.1 += 1;
        }
    }
    let mut checks = vec![Check::new(
        format!(
            "money: every order kept its amount if paid or used, nothing otherwise ({} not)",
            wrong.len()
        ),
        wrong.is_empty(),
    )];
    let mut lines: Vec<String> = wrong.iter().take(5).map(|w| format!("  {w}")).collect();
    let mut currencies: Vec<&String> = ledger.totals.keys().chain(owed.keys()).collect();
    currencies.sort();
    currencies.dedup();
    for code in currencies {
        let totals = ledger.totals.get(code).cloned().unwrap_or_default();
        let (paid, count) = owed.get(code).copied().unwrap_or_default();
        let kept = totals.money.kept_minor();
        lines.push(format!(
            "money ({code}): revenue {} from {count} paid or used orders; provider charged {} in {} charges, voided {} in {}, refunded {} in {}, kept {}; {} declined",
            show(paid, code),
            show(totals.money.charged_minor, code),
            totals.money.charges,
            show(totals.money.voided_minor, code),
            totals.money.voids,
            show(totals.money.refunded_minor, code),
            totals.money.refunds,
            show(kept, code),
            totals.declined,
        ));
        checks.push(Check::new(
            format!("money adds up ({code}): the provider kept what the paid and used orders cost"),
            kept == paid,
        ));
    }
    let count = |what: &str| ledger.callbacks.get(what).copied().unwrap_or(0);
    let all: Vec<String> = ledger
        .callbacks
        .iter()
        .map(|(what, n)| format!("{what} {n}"))
        .collect();
    lines.push(format!("callbacks: {}", all.join(", ")));
    // A forged copy sent while its instance was down went unanswered:
    // neither taken nor refused.
    checks.push(Check::new(
        format!(
            "no forged callback taken ({} refused, {} unanswered)",
            count("forged_refused"),
            count("forged_unanswered")
        ),
        count("forged_taken") == 0,
    ));
    (checks, lines)
}

#[cfg(test)]
mod tests {
    use super::super::load::AcceptedOrder;
    use super::*;

    fn order(user_id: i64, order_id: i64) -> AcceptedOrder {
        AcceptedOrder {
            user_id,
            order_id,
            pending: true,
        }
    }

    fn failed(checks: &[Check]) -> Vec<&str> {
        checks
            .iter()
            .filter(|c| !c.held)
            .map(|c| c.name.as_str())
            .collect()
    }

    /// Users 1 and 2 were accepted (orders 11, 12); users 3 and 4 lost
    /// their answers; the stock of 3 sold out.
    fn record() -> Record {
        Record::of(
            vec![order(1, 11), order(2, 12)],
            vec![3, 4],
            &[("accepted", 2), ("error: transport", 2), ("sold_out", 5)],
        )
    }

    fn sale(record: &Record) -> Sale<'_> {
        Sale {
            voucher: 1,
            stock: 3,
            record,
            returned: 0,
        }
    }

    #[test]
    fn an_unknown_outcome_that_turned_out_stored_is_counted_not_failed() {
        let record = record();
        let (checks, unknown_stored) =
            stored_checks(sale(&record), &[(11, 1), (12, 2), (13, 3)], &HashSet::new());
        assert_eq!(failed(&checks), Vec::<&str>::new());
        assert_eq!(unknown_stored, 1);
        // From the answers alone: 2 accepted + 2 unknown may be the stock.
        assert_eq!(failed(&from_answers(sale(&record))), ["no request failed"]);
    }

    #[test]
    fn an_accepted_order_missing_from_the_database_fails() {
        let record = record();
        // Order 12 was deleted behind the bench's back.
        let (checks, _) =
            stored_checks(sale(&record), &[(11, 1), (13, 3), (14, 4)], &HashSet::new());
        assert_eq!(
            failed(&checks),
            ["every accepted order is stored (accepted ⊆ stored)"]
        );
    }

    #[test]
    fn a_stored_order_nobody_was_told_of_fails() {
        let record = record();
        // User 5 asked nothing that could have bought.
        let (checks, unknown_stored) =
            stored_checks(sale(&record), &[(11, 1), (12, 2), (15, 5)], &HashSet::new());
        assert_eq!(
            failed(&checks),
            ["every stored order was accepted or its answer was lost (stored ⊆ accepted ∪ unknown)"]
        );
        assert_eq!(unknown_stored, 0);
    }

    #[test]
    fn the_sold_out_phase_rate_counts_whole_seconds_after_the_last_sale() {
        use super::super::report::sold_out_rate;
        let mut record = Record::of(vec![], vec![], &[("sold_out", 1)]);
        // Seconds: selling, selling (sells out), 3 whole sold-out seconds,
        // a partial last one.
        for (accepted, refused) in [(5, 0), (3, 4), (0, 10), (0, 12), (0, 14), (0, 1)] {
            record.push_second(accepted, refused);
        }
        assert_eq!(sold_out_rate(&record), Some(12.0));
        record.timeline.truncate(3); // sold out at the very end
        assert_eq!(sold_out_rate(&record), None);
    }

    #[test]
    fn sold_out_before_the_stock_was_gone_fails() {
        let record = Record::of(vec![order(1, 11)], vec![3], &[("sold_out", 1)]);
        let (checks, _) = stored_checks(sale(&record), &[(11, 1)], &HashSet::new());
        assert_eq!(
            failed(&checks),
            ["sold out only once the stock was gone (every unit stored once at least)"]
        );
        assert!(failed(&from_answers(sale(&record))).contains(
            &"sold out only once the stock may have been gone (accepted + unknown >= stock)"
        ));
    }
}
