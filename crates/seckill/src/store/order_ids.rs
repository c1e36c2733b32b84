//! Allocation of order ids from the per-day Redis sequence, in blocks.

use std::time::SystemTime;

use std::sync::LazyLock;

use crate::store::Redis;
use tokio::sync::Mutex;

use crate::domain::order_id::{civil_date, clock_parts, OrderId};
use crate::error::{Error, Result};
use crate::store::keys::order_sequence;

/// Per-day sequence keys outlive their day by this much (for inspection);
/// ids never depend on an old day's counter.
const SEQUENCE_TTL_SECS: i64 = 7 * 86_400;

static NEXT_BLOCK: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/next_block.lua")));

/// Hands out [`OrderId`]s unique across instances and restarts.
///
/// Sequence numbers come from one Redis counter per UTC day, taken
/// `block` at a time with `INCRBY`, so most ids cost no round trip. A block
/// belongs to its day: at midnight the rest of it is dropped, never reused
/// under the new day's timestamps. Numbers of a block not used before a
/// restart are skipped, never repeated.
///
/// The counter never falls below the day's time floor (seconds elapsed ×
/// 49,710, the 32-bit sequence spread over the day, by Redis' clock), so a
/// counter Redis lost starts again above what was handed out before: ids
/// stay unique across a Redis restart without data as long as a day's ids
/// average at most 49,710 per second (`next_block.lua`).
#[derive(Debug)]
pub struct OrderIdGenerator {
    redis: Redis,
    block: u32,
    state: Mutex<Block>,
}

#[derive(Debug, Default)]
struct Block {
    day: u64,
    next: u64,
    end: u64,
}

impl OrderIdGenerator {
    /// A generator taking `block` sequence numbers per Redis call.
    ///
    /// # Errors
    /// [`Error::Invalid`] if `block` is 0.
    pub fn new(redis: Redis, block: u32) -> Result<Self> {
        if block == 0 {
            return Err(Error::invalid("block", "must be at least 1"));
        }
        Ok(Self {
            redis,
            block,
            state: Mutex::new(Block::default()),
        })
    }

    /// The next id.
    ///
    /// # Errors
    /// [`Error::Redis`] if a new block is needed and Redis is unreachable;
    /// [`Error::SequenceExhausted`] past 2^32 ids in a day.
    ///
    /// # Cancel safety
    /// Cancel safe: a block fetched for a dropped call is skipped, not
    /// reused.
    pub async fn next_id(&self) -> Result<OrderId> {
        let (seconds, day) = clock_parts(SystemTime::now())?;
        let mut block = self.state.lock().await;
        if block.day != day || block.next >= block.end {
            // Boxed: one call in `block` takes this way, and the others'
            // futures need not be as large as a script call's.
            *block = Box::pin(self.new_block(day)).await?;
        }
        let sequence = u32::try_from(block.next).map_err(|_| Error::SequenceExhausted { day })?;
        block.next += 1;
        OrderId::compose(seconds, sequence)
    }

    /// The next block of day `day`'s sequence numbers.
    async fn new_block(&self, day: u64) -> Result<Block> {
        let key = order_sequence(self.redis.prefix(), &civil_date(day));
        let last: u64 = NEXT_BLOCK
            .key(&key)
            .arg(self.block)
            .arg(day * 86_400)
            .arg(SEQUENCE_TTL_SECS)
            .invoke_async(&mut self.redis.conn())
            .await?;
        Ok(Block {
            day,
            next: last - u64::from(self.block) + 1,
            end: last + 1,
        })
    }
}
