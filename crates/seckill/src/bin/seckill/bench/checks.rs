//! The invariants of a sale, checked after a load run: first against what
//! the service answered, then against Redis and the database themselves.

use std::collections::HashSet;
use std::time::Duration;

use seckill::store::RedisConn;
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
}

/// What the answers alone prove or disprove.
pub fn from_answers(sale: Sale<'_>) -> Vec<Check> {
    let record = sale.record;
    let accepted = record.orders.len() as i64;
    let users: HashSet<i64> = record.orders.iter().map(|o| o.user_id).collect();
    let ids: HashSet<i64> = record.orders.iter().map(|o| o.order_id).collect();
    vec![
        Check::new("no request failed", record.errors() == 0),
        Check::new("no oversell: accepted <= stock", accepted <= sale.stock),
        Check::new("one order per user", users.len() as i64 == accepted),
        Check::new("order ids are unique", ids.len() as i64 == accepted),
        Check::new(
            "sold out only once the stock was gone",
            record.count("sold_out") == 0 || accepted == sale.stock,
        ),
    ]
}

/// Redis and the database, when the run was given them.
pub struct Stores {
    prefix: String,
    redis: Option<RedisConn>,
    db: Option<Database>,
}

impl Stores {
    /// Connects to whichever of the two is given.
    ///
    /// # Errors
    /// If a given store cannot be reached.
    pub async fn connect(
        redis_url: Option<&str>,
        database_url: Option<&str>,
        prefix: &str,
    ) -> anyhow::Result<Self> {
        let redis = match redis_url {
            Some(url) => Some(seckill::store::connect(url).await?),
            None => None,
        };
        let db = match database_url {
            Some(url) => Some(Database::connect(url).await?),
            None => None,
        };
        Ok(Self {
            prefix: prefix.to_owned(),
            redis,
            db,
        })
    }

    /// Entries in the dead-letter stream (0 without Redis).
    ///
    /// # Errors
    /// If Redis fails.
    pub async fn dead_letters(&self) -> anyhow::Result<i64> {
        Ok(match &self.redis {
            Some(conn) => {
                redis::cmd("XLEN")
                    .arg(seckill::store::dead_letter_stream(&self.prefix))
                    .query_async(&mut conn.clone())
                    .await?
            }
            None => 0,
        })
    }

    /// Waits (up to `drain_timeout`) for the accepted orders to reach the
    /// database, then checks the stores against the answers.
    /// `dead_letters_before` is [`Stores::dead_letters`] before the run.
    /// Also returns the reconciliation's differences, for people.
    ///
    /// # Errors
    /// If a store fails (a failed invariant is a [`Check`], not an error).
    pub async fn verify(
        &self,
        sale: Sale<'_>,
        drain_timeout: Duration,
        dead_letters_before: i64,
    ) -> anyhow::Result<(Vec<Check>, Vec<String>)> {
        let Some(db) = &self.db else {
            return Ok((Vec::new(), Vec::new()));
        };
        let accepted: HashSet<i64> = sale.record.orders.iter().map(|o| o.order_id).collect();
        // The async path answers before the database has the order.
        let pipelined = sale.record.orders.iter().any(|o| o.pending);
        let deadline = tokio::time::Instant::now() + drain_timeout;
        let (stored, found) = loop {
            let stored: HashSet<i64> = db.order_ids(sale.voucher).await?.into_iter().collect();
            let found = match &self.redis {
                Some(conn) if pipelined => {
                    Some(reconcile(conn, db, &self.prefix, sale.voucher).await?)
                }
                _ => None,
            };
            let drained = found.as_ref().is_none_or(|f| f.in_stream == 0);
            if (drained && stored.len() >= accepted.len())
                || tokio::time::Instant::now() >= deadline
            {
                break (stored, found);
            }
            // The pipeline is another process: there is no event to await.
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let db_stock = db.voucher_stock(sale.voucher).await?;
        let mut checks = vec![
            Check::new(
                "the database holds exactly the accepted orders (same ids)",
                stored == accepted,
            ),
            Check::new(
                "database stock = stock - orders",
                db_stock == Some(sale.stock - stored.len() as i64),
            ),
        ];
        let Some(found) = found else {
            return Ok((checks, Vec::new()));
        };
        let dead_letters = self.dead_letters().await? - dead_letters_before;
        checks.extend(redis_checks(&found, dead_letters));
        Ok((checks, found.differences()))
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
