//! Order ids: 64 bits that sort by time and never repeat.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// Seconds from the Unix epoch to 2024-01-01T00:00:00Z, the order id epoch.
pub const EPOCH_UNIX_SECS: u64 = 1_704_067_200;

const SEQUENCE_BITS: u32 = 32;
const MAX_SECONDS: u64 = (1 << 31) - 1;

/// A globally unique order id:
///
/// | bit 63 | bits 62–32 | bits 31–0 |
/// |---|---|---|
/// | 0 (sign) | seconds since 2024-01-01 UTC | sequence number within the UTC day |
///
/// Ids of one day differ in their sequence (one Redis counter per day,
/// shared by every instance); ids of different days differ in their seconds.
/// The sign bit stays 0, so an id fits a SQL `BIGINT` as a positive number.
/// 31 bits of seconds last until 2092.
///
/// ```
/// use seckill::OrderId;
/// let id = OrderId::compose(86_400, 7).unwrap();
/// assert_eq!((id.seconds(), id.sequence()), (86_400, 7));
/// assert!(id.as_i64() > 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderId(u64);

impl OrderId {
    /// The id for `seconds` since the order epoch and a day's `sequence`.
    ///
    /// # Errors
    /// [`Error::Clock`] if `seconds` needs more than 31 bits.
    pub fn compose(seconds: u64, sequence: u32) -> Result<Self> {
        if seconds > MAX_SECONDS {
            return Err(Error::Clock(format!(
                "{seconds} s after the order epoch exceeds 31 bits"
            )));
        }
        Ok(Self((seconds << SEQUENCE_BITS) | u64::from(sequence)))
    }

    /// Seconds since the order epoch.
    pub fn seconds(self) -> u64 {
        self.0 >> SEQUENCE_BITS
    }

    /// The sequence number within its UTC day.
    pub fn sequence(self) -> u32 {
        self.0 as u32
    }

    /// When the id was made, to the second.
    pub fn created_at(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(EPOCH_UNIX_SECS + self.seconds())
    }

    /// The id as a (positive) signed integer, for SQL `BIGINT`.
    pub fn as_i64(self) -> i64 {
        self.0 as i64
    }

    /// Parses an id read back from storage.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a negative value.
    pub fn from_i64(value: i64) -> Result<Self> {
        u64::try_from(value)
            .map(Self)
            .map_err(|_| Error::invalid("order_id", "must not be negative"))
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Seconds since the order epoch and the UTC day number (days since
/// 1970-01-01) of `now`.
pub(crate) fn clock_parts(now: SystemTime) -> Result<(u64, u64)> {
    let unix = now
        .duration_since(UNIX_EPOCH)
        .map_err(|e| Error::Clock(e.to_string()))?
        .as_secs();
    let seconds = unix
        .checked_sub(EPOCH_UNIX_SECS)
        .ok_or_else(|| Error::Clock("the clock is before 2024-01-01".into()))?;
    Ok((seconds, unix / 86_400))
}

/// `YYYYMMDD` of a UTC day number (days since 1970-01-01), for key names.
pub(crate) fn civil_date(day: u64) -> String {
    // Howard Hinnant's days-from-civil, inverted.
    let z = day as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_the_sign_bit_stays_clear() {
        let id = OrderId::compose(MAX_SECONDS, u32::MAX).unwrap();
        assert_eq!(id.seconds(), MAX_SECONDS);
        assert_eq!(id.sequence(), u32::MAX);
        assert!(id.as_i64() > 0);
        assert_eq!(OrderId::from_i64(id.as_i64()).unwrap(), id);
    }

    #[test]
    fn seconds_beyond_31_bits_are_refused() {
        assert!(OrderId::compose(MAX_SECONDS + 1, 0).is_err());
    }

    #[test]
    fn ids_sort_by_time_first() {
        let early = OrderId::compose(10, u32::MAX).unwrap();
        let late = OrderId::compose(11, 0).unwrap();
        assert!(early < late);
    }

    #[test]
    fn civil_dates_are_right_across_leap_years() {
        assert_eq!(civil_date(0), "19700101");
        assert_eq!(civil_date(EPOCH_UNIX_SECS / 86_400), "20240101");
        assert_eq!(civil_date(19_782), "20240229");
        assert_eq!(civil_date(19_783), "20240301");
        assert_eq!(civil_date(20_414), "20251122");
    }

    #[test]
    fn the_clock_before_the_epoch_is_an_error() {
        assert!(clock_parts(UNIX_EPOCH).is_err());
    }
}
