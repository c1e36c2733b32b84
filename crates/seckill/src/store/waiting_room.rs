//! The waiting rooms' lines in Redis: joining (O(1)), the draw at a sale's
//! start, admission at a rate, where a person stands, and the key passes
//! are signed with. The line's rules are the domain's
//! ([`crate::domain::waiting_room`]); the scripts keep each step atomic.

use std::sync::LazyLock;

use rand::seq::SliceRandom;

use super::redis::Redis;
use crate::domain::waiting_room::{PassKey, Place, RoomSettings};
use crate::error::{Error, Result};

static JOIN: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/room_join.lua")));
static DRAW: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/room_draw.lua")));
static ADMIT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/room_admit.lua")));
static STATUS: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/room_status.lua")));

/// Where a person stands, and the line around them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Their place ([`Place::Outside`] if they never joined).
    pub place: Place,
    /// The line around them.
    pub line: LineFigures,
    /// When the pass of an admitted person runs out (Unix ms, Redis'
    /// clock); `None` if not admitted, or no longer (bought, or the time
    /// ran out).
    pub pass_until_ms: Option<i64>,
    /// Units left to sell (`None`: the sale is not in Redis).
    pub stock_left: Option<i64>,
}

/// A line's figures: what every person in it needs to see where they
/// stand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LineFigures {
    /// Whether the draw was made (the sale started; tickets are handed out).
    pub drawn: bool,
    /// The last ticket admitted (0: nobody yet).
    pub admitted_through: u64,
    /// The last ticket handed out.
    pub last_ticket: u64,
    /// People who joined and await the draw.
    pub awaiting_draw: u64,
}

impl LineFigures {
    /// People in line and not admitted yet.
    pub fn waiting(&self) -> u64 {
        self.last_ticket.saturating_sub(self.admitted_through) + self.awaiting_draw
    }
}

/// What one admission step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Admitted {
    /// People admitted by this step.
    pub now: u64,
    /// The line after it.
    pub admitted_through: u64,
    /// The last ticket handed out.
    pub last_ticket: u64,
    /// People admitted and not done.
    pub active: u64,
    /// Whether the line was drawn (before, nothing is admitted).
    pub drawn: bool,
}

/// What the draw did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draw {
    /// Drawn now, with this many people who joined early.
    Drawn(usize),
    /// Drawn before.
    Already,
    /// The sale has not started by Redis' clock.
    TooSoon,
}

/// The lines of every sale's waiting room.
///
/// ```
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
/// # async fn main() -> Result<(), seckill::Error> {
/// use seckill::domain::waiting_room::{Place, RoomSettings};
/// use seckill::store::{connect, Draw, Redis, RoomLines};
///
/// let server = testkit::RedisServer::start(); // any Redis URL works
/// let redis = Redis::new(connect(&server.url()).await?, "shop");
/// let lines = RoomLines::new(redis);
/// // Sale 7 starts now; 42 joins just before, 43 after the draw.
/// let begin = std::time::SystemTime::now()
///     .duration_since(std::time::UNIX_EPOCH)
///     .unwrap()
///     .as_millis() as i64
///     + 1_000;
/// assert_eq!(lines.join(7, 42, 0, begin).await?, Place::AwaitingDraw);
/// tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
/// assert_eq!(lines.draw(7, begin).await?, Draw::Drawn(1));
/// assert_eq!(lines.join(7, 43, 0, begin).await?, Place::Ticket(2));
/// // Admission needs units on sale: none here, so nobody is admitted.
/// let admitted = lines.admit(7, &RoomSettings::new(100)?).await?;
/// assert_eq!(admitted.admitted_through, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RoomLines {
    redis: Redis,
}

impl RoomLines {
    /// The lines kept in `redis`.
    pub fn new(redis: Redis) -> Self {
        Self { redis }
    }

    /// `user` joins the room of `voucher` (joining opens at `opens_ms`; the
    /// draw is at `begin_ms`, the sale's start); joining again changes
    /// nothing and answers the same place.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails (then ask again: it is idempotent).
    pub async fn join(
        &self,
        voucher: i64,
        user: i64,
        opens_ms: i64,
        begin_ms: i64,
    ) -> Result<Place> {
        let keys = self.redis.voucher(voucher);
        let (code, n): (i64, i64) = JOIN
            .key(&keys.room)
            .key(&keys.room_early)
            .key(&keys.room_late)
            .key(&keys.room_ticket)
            .arg(user)
            .arg(opens_ms)
            .arg(begin_ms)
            .invoke_async(&mut self.redis.conn())
            .await?;
        Ok(match code {
            0 => Place::NotOpen { opens_ms: n },
            1 => Place::AwaitingDraw,
            2 => Place::Ticket(ticket(n)?),
            other => {
                return Err(Error::Protocol(format!(
                    "room join script returned {other}"
                )))
            }
        })
    }

    /// Where `user` stands in the room of `voucher`.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn standing(&self, voucher: i64, user: i64) -> Result<Standing> {
        let keys = self.redis.voucher(voucher);
        type Reply = (i64, i64, i64, i64, i64, i64, i64);
        let (place, head, tail, awaiting, deadline, drawn, stock): Reply = STATUS
            .key(&keys.room)
            .key(&keys.room_early)
            .key(&keys.room_late)
            .key(&keys.room_ticket)
            .key(&keys.room_active)
            .key(&keys.voucher)
            .arg(user)
            .invoke_async(&mut self.redis.conn())
            .await?;
        Ok(Standing {
            place: match place {
                -1 => Place::Outside,
                0 => Place::AwaitingDraw,
                n => Place::Ticket(ticket(n)?),
            },
            line: LineFigures {
                drawn: drawn == 1,
                admitted_through: ticket(head)?,
                last_ticket: ticket(tail)?,
                awaiting_draw: ticket(awaiting)?,
            },
            pass_until_ms: (deadline >= 0).then_some(deadline),
            stock_left: (stock >= 0).then_some(stock),
        })
    }

    /// The draw for the room of `voucher`, whose sale starts at
    /// `begin_ms`: the people who joined before the start in a uniformly
    /// random order (from the operating system's entropy, so a joiner
    /// cannot predict it), then those who joined since in arrival order.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails (then ask again: it is done once).
    pub async fn draw(&self, voucher: i64, begin_ms: i64) -> Result<Draw> {
        let keys = self.redis.voucher(voucher);
        // The early set stops growing at the start (later joiners go to
        // the late list), so a read after it is the whole of it; a read
        // that raced a last early joiner is refused by the script.
        for _ in 0..3 {
            let mut early: Vec<i64> = redis::cmd("SMEMBERS")
                .arg(&keys.room_early)
                .query_async(&mut self.redis.conn())
                .await?;
            early.shuffle(&mut rand::rng());
            let mut call = DRAW.key(&keys.room);
            call.key(&keys.room_early)
                .key(&keys.room_late)
                .key(&keys.room_ticket)
                .arg(begin_ms)
                .arg(&early);
            let code: i64 = call.invoke_async(&mut self.redis.conn()).await?;
            match code {
                1 => return Ok(Draw::Drawn(early.len())),
                0 => return Ok(Draw::Already),
                -1 => return Ok(Draw::TooSoon),
                -2 => continue,
                other => {
                    return Err(Error::Protocol(format!(
                        "room draw script returned {other}"
                    )))
                }
            }
        }
        // Still joining as the sale starts: the next step draws.
        Ok(Draw::TooSoon)
    }

    /// Admits from the head of `voucher`'s line what `room`'s rate allows
    /// since the last admission (by anyone: every instance may call it
    /// every tick), and no more than the sale has units left for: each
    /// admitted person not done has a unit to buy.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn admit(&self, voucher: i64, room: &RoomSettings) -> Result<Admitted> {
        let keys = self.redis.voucher(voucher);
        let (now, head, tail, active, drawn): (i64, i64, i64, i64, i64) = ADMIT
            .key(&keys.room)
            .key(&keys.room_active)
            .key(&keys.voucher)
            .arg(room.admit_per_s)
            .arg(room.max_active.unwrap_or(0))
            .arg(if room.paused { "1" } else { "0" })
            .arg(room.pass_ttl_ms)
            .invoke_async(&mut self.redis.conn())
            .await?;
        Ok(Admitted {
            now: ticket(now)?,
            admitted_through: ticket(head)?,
            last_ticket: ticket(tail)?,
            active: ticket(active)?,
            drawn: drawn == 1,
        })
    }

    /// The person with `ticket` is done in `voucher`'s room (they bought):
    /// their place no longer counts against the room's cap.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails (the place then counts until its
    /// pass runs out).
    pub async fn leave(&self, voucher: i64, ticket: u64) -> Result<()> {
        let keys = self.redis.voucher(voucher);
        let () = redis::cmd("ZREM")
            .arg(&keys.room_active)
            .arg(ticket)
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(())
    }

    /// The lines of `vouchers`' rooms, in one round trip.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn lines(&self, vouchers: &[i64]) -> Result<Vec<LineFigures>> {
        if vouchers.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for &voucher in vouchers {
            let keys = self.redis.voucher(voucher);
            pipe.hmget(&keys.room, &["drawn", "head", "tail"])
                .scard(&keys.room_early)
                .llen(&keys.room_late);
        }
        type Read = ((Option<i64>, Option<i64>, Option<i64>), i64, i64);
        let read: Vec<Read> = in_threes(pipe.query_async(&mut self.redis.conn()).await?)?;
        read.into_iter()
            .map(|((drawn, head, tail), early, late)| {
                Ok(LineFigures {
                    drawn: drawn == Some(1),
                    admitted_through: ticket(head.unwrap_or(0))?,
                    last_ticket: ticket(tail.unwrap_or(0))?,
                    awaiting_draw: ticket(early + late)?,
                })
            })
            .collect()
    }

    /// The key passes are signed with: made (32 random bytes) by the
    /// first instance that needs it, then shared. A Redis that lost its
    /// data makes a new one, and every pass signed before stops verifying.
    ///
    /// # Errors
    /// [`Error::Redis`] if Redis fails.
    pub async fn pass_key(&self) -> Result<PassKey> {
        let key = super::keys::room_pass_key(self.redis.prefix());
        let fresh: [u8; 32] = rand::random();
        let (_, stored): ((), Vec<u8>) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(&fresh[..])
            .arg("NX")
            .get(&key)
            .query_async(&mut self.redis.conn())
            .await?;
        PassKey::new(&stored)
    }
}

/// A count or ticket from a script (never negative).
fn ticket(n: i64) -> Result<u64> {
    u64::try_from(n)
        .map_err(|_| Error::Protocol(format!("a negative count from a room script: {n}")))
}

/// A pipeline's flat replies as triples (`HMGET`, `SCARD`, `LLEN` per room).
fn in_threes<T: redis::FromRedisValue>(values: Vec<redis::Value>) -> Result<Vec<T>> {
    values
        .chunks(3)
        .map(|chunk| {
            redis::from_redis_value(redis::Value::Array(chunk.to_vec()))
                .map_err(|e| Error::Protocol(format!("a room's line: {e}")))
        })
        .collect()
}
