//! A sale's waiting room as values: its settings, a person's place in its
//! line, and the signed pass that lets an admitted person buy.
//!
//! The line: everyone who joins before the sale opens is drawn into a
//! uniformly random order at the opening (arriving early with a script buys
//! no better place than arriving early by hand); everyone who joins after
//! queues in arrival order behind them. Places are tickets 1, 2, 3, ...; the
//! room admits from the head of the line at the rate the shop sets, and an
//! admitted person holds a [`Pass`] until it is used or its time is up.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub use crate::error::PassError;
use crate::error::{Error, Result};

/// Admissions per second a room takes at most (a room faster than this
/// is no room).
pub const MAX_ADMIT_PER_S: u32 = 100_000;

/// How long before the sale a room may open at most.
pub const MAX_OPENS_BEFORE: Duration = Duration::from_secs(24 * 3600);

/// The shortest and longest time an admitted person has to buy.
pub const PASS_TTL_RANGE: (Duration, Duration) =
    (Duration::from_secs(10), Duration::from_secs(3600));

/// A room's settings, as the shop sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomSettings {
    /// People admitted per second from the head of the line.
    pub admit_per_s: u32,
    /// People admitted and not done (not bought, pass not run out) at most;
    /// `None`: no cap but the rate.
    #[serde(default)]
    pub max_active: Option<u32>,
    /// How long before the sale's start people may join (ms). Everyone
    /// who joins before the start is drawn into a random order at it.
    #[serde(default = "default_opens_before_ms")]
    pub opens_before_ms: u64,
    /// How long an admitted person has to buy (ms): the pass's life.
    #[serde(default = "default_pass_ttl_ms")]
    pub pass_ttl_ms: u64,
    /// Whether admission is paused (joining goes on; nobody is admitted).
    #[serde(default)]
    pub paused: bool,
}

fn default_opens_before_ms() -> u64 {
    15 * 60 * 1000
}

fn default_pass_ttl_ms() -> u64 {
    120_000
}

impl RoomSettings {
    /// Settings admitting `admit_per_s` people a second, with the defaults
    /// otherwise (open 15 minutes before the sale, two minutes to buy, no
    /// cap, not paused).
    ///
    /// # Errors
    /// [`Error::Invalid`] as [`RoomSettings::checked`].
    pub fn new(admit_per_s: u32) -> Result<Self> {
        Self {
            admit_per_s,
            max_active: None,
            opens_before_ms: default_opens_before_ms(),
            pass_ttl_ms: default_pass_ttl_ms(),
            paused: false,
        }
        .checked()
    }

    /// These settings if a shop may set them.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the field: a rate of 0 or above
    /// [`MAX_ADMIT_PER_S`], a cap of 0, an opening more than
    /// [`MAX_OPENS_BEFORE`] before the sale, a pass life outside
    /// [`PASS_TTL_RANGE`].
    pub fn checked(self) -> Result<Self> {
        if self.admit_per_s == 0 || self.admit_per_s > MAX_ADMIT_PER_S {
            return Err(Error::invalid(
                "admit_per_s",
                format!("must be between 1 and {MAX_ADMIT_PER_S}"),
            ));
        }
        if self.max_active == Some(0) {
            return Err(Error::invalid(
                "max_active",
                "must be at least 1 (leave it out for no cap)",
            ));
        }
        if self.opens_before_ms > MAX_OPENS_BEFORE.as_millis() as u64 {
            return Err(Error::invalid(
                "opens_before_ms",
                "a room opens at most a day before its sale",
            ));
        }
        let (shortest, longest) = PASS_TTL_RANGE;
        if !(shortest.as_millis() as u64..=longest.as_millis() as u64).contains(&self.pass_ttl_ms) {
            return Err(Error::invalid(
                "pass_ttl_ms",
                format!(
                    "must be between {} and {} ms",
                    shortest.as_millis(),
                    longest.as_millis()
                ),
            ));
        }
        Ok(self)
    }

    /// This room with admission paused or resumed.
    pub fn with_paused(self, paused: bool) -> Self {
        Self { paused, ..self }
    }

    /// This room with a cap on people admitted and not done.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a cap of 0.
    pub fn with_max_active(self, max_active: u32) -> Result<Self> {
        Self {
            max_active: Some(max_active),
            ..self
        }
        .checked()
    }

    /// This room opening `before` the sale's start.
    ///
    /// # Errors
    /// [`Error::Invalid`] beyond [`MAX_OPENS_BEFORE`].
    pub fn opening_before(self, before: Duration) -> Result<Self> {
        Self {
            opens_before_ms: u64::try_from(before.as_millis()).unwrap_or(u64::MAX),
            ..self
        }
        .checked()
    }

    /// This room giving admitted people `ttl` to buy.
    ///
    /// # Errors
    /// [`Error::Invalid`] outside [`PASS_TTL_RANGE`].
    pub fn with_pass_ttl(self, ttl: Duration) -> Result<Self> {
        Self {
            pass_ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            ..self
        }
        .checked()
    }

    /// When people may start joining, for a sale starting at `begin_ms`.
    pub fn opens_ms(&self, begin_ms: i64) -> i64 {
        begin_ms.saturating_sub(i64::try_from(self.opens_before_ms).unwrap_or(i64::MAX))
    }
}

/// Where a person stands in a room's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The room is not open yet; it opens at this time (Unix ms).
    NotOpen {
        /// When joining opens.
        opens_ms: i64,
    },
    /// Not in the line.
    Outside,
    /// Joined before the opening: the place is drawn when the sale opens.
    AwaitingDraw,
    /// In the line with this ticket (1 is the first place).
    Ticket(u64),
}

/// A pass: proof, signed by the service, that `user` was admitted to the
/// room of `voucher` with `ticket` and may buy until `expires_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// The sale it is for.
    pub voucher: i64,
    /// The person it was issued to.
    pub user: i64,
    /// Their place in the line.
    pub ticket: u64,
    /// When it runs out (Unix ms, the Redis server's clock).
    pub expires_ms: i64,
}

/// The key passes are signed with: shared by every instance of a
/// deployment. Two keys are equal if made from the same secret (their
/// digests are compared, never the secrets).
#[derive(Clone)]
pub struct PassKey {
    mac: Hmac<Sha256>,
    /// A digest of the secret, to tell keys apart without keeping it.
    id: [u8; 32],
}

impl PartialEq for PassKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for PassKey {}

impl std::fmt::Debug for PassKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassKey(<redacted>)")
    }
}

impl PassKey {
    /// A key from `secret` (32 random bytes in practice).
    ///
    /// # Errors
    /// [`Error::Invalid`] for an empty secret.
    pub fn new(secret: &[u8]) -> Result<Self> {
        if secret.is_empty() {
            return Err(Error::invalid("pass key", "must not be empty"));
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret)
            .map_err(|e| Error::invalid("pass key", e.to_string()))?;
        let id = <Sha256 as sha2::Digest>::digest(secret).into();
        Ok(Self { mac, id })
    }

    /// `pass` signed: `<payload>.<signature>`, both base64url.
    pub fn sign(&self, pass: &Pass) -> String {
        let payload = format!(
            "1:{}:{}:{}:{}",
            pass.voucher, pass.user, pass.ticket, pass.expires_ms
        );
        let mut mac = self.mac.clone();
        mac.update(payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        )
    }

    /// The pass `signed` carries, if this key signed it (compared in
    /// constant time), before looking at what it says.
    ///
    /// # Errors
    /// [`PassError::Forged`] if it does not verify or cannot be read.
    pub fn open(&self, signed: &str) -> Result<Pass, PassError> {
        let (payload, signature) = signed.split_once('.').ok_or(PassError::Forged)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| PassError::Forged)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| PassError::Forged)?;
        let mut mac = self.mac.clone();
        mac.update(&payload);
        mac.verify_slice(&signature)
            .map_err(|_| PassError::Forged)?;
        let text = std::str::from_utf8(&payload).map_err(|_| PassError::Forged)?;
        let mut fields = text.split(':');
        let (Some("1"), Some(voucher), Some(user), Some(ticket), Some(expires), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(PassError::Forged);
        };
        let number = |s: &str| s.parse::<i64>().map_err(|_| PassError::Forged);
        Ok(Pass {
            voucher: number(voucher)?,
            user: number(user)?,
            ticket: ticket.parse().map_err(|_| PassError::Forged)?,
            expires_ms: number(expires)?,
        })
    }

    /// The pass `signed` if it lets `user` buy `voucher` at `now_ms`.
    ///
    /// # Errors
    /// What is wrong with it, the signature first.
    pub fn verify(
        &self,
        signed: &str,
        voucher: i64,
        user: i64,
        now_ms: i64,
    ) -> Result<Pass, PassError> {
        let pass = self.open(signed)?;
        if pass.voucher != voucher {
            return Err(PassError::OtherSale);
        }
        if pass.user != user {
            return Err(PassError::NotYours);
        }
        if now_ms >= pass.expires_ms {
            return Err(PassError::Expired);
        }
        Ok(pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass() -> Pass {
        Pass {
            voucher: 7,
            user: 42,
            ticket: 3,
            expires_ms: 10_000,
        }
    }

    #[test]
    fn a_pass_verifies_for_its_person_sale_and_time_only() {
        let key = PassKey::new(b"one deployment's key").unwrap();
        let signed = key.sign(&pass());
        assert_eq!(key.verify(&signed, 7, 42, 9_999), Ok(pass()));
        assert_eq!(key.verify(&signed, 8, 42, 0), Err(PassError::OtherSale));
        assert_eq!(key.verify(&signed, 7, 43, 0), Err(PassError::NotYours));
        assert_eq!(key.verify(&signed, 7, 42, 10_000), Err(PassError::Expired));
        let other = PassKey::new(b"another deployment's key").unwrap();
        assert_eq!(other.verify(&signed, 7, 42, 0), Err(PassError::Forged));
    }

    #[test]
    fn an_altered_or_garbled_pass_is_forged() {
        let key = PassKey::new(b"k").unwrap();
        let signed = key.sign(&pass());
        let (_, signature) = signed.split_once('.').unwrap();
        let altered = format!(
            "{}.{signature}",
            URL_SAFE_NO_PAD.encode("1:7:42:1:99999999")
        );
        for bad in [
            altered.as_str(),
            "",
            ".",
            "abc",
            "abc.def",
            &signed[1..],
            &signed[..signed.len() - 1],
        ] {
            assert_eq!(key.verify(bad, 7, 42, 0), Err(PassError::Forged), "{bad}");
        }
    }

    #[test]
    fn settings_out_of_range_name_their_field() {
        let field = |r: Result<RoomSettings>| match r {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(RoomSettings::new(0)), "admit_per_s");
        assert_eq!(field(RoomSettings::new(MAX_ADMIT_PER_S + 1)), "admit_per_s");
        let room = RoomSettings::new(10).unwrap();
        assert_eq!(field(room.with_max_active(0)), "max_active");
        assert_eq!(
            field(room.opening_before(MAX_OPENS_BEFORE + Duration::from_millis(1))),
            "opens_before_ms"
        );
        assert_eq!(
            field(room.with_pass_ttl(Duration::from_secs(1))),
            "pass_ttl_ms"
        );
        assert_eq!(room.opens_ms(1_000_000), 1_000_000 - 15 * 60 * 1000);
    }
}
