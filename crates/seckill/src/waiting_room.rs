//! Waiting rooms in front of hot sales: joining, where a person stands,
//! the pass an admitted person buys with, and the admission every instance
//! runs.
//!
//! The line lives in Redis ([`RoomLines`]); the room's settings in the
//! database with the voucher's other terms. Every instance runs
//! [`admit_until_stopped`]: each [`ADMIT_TICK`] it draws the line of a sale
//! that just started and admits from the head of each open room's line
//! what the rate allows since the last admission (by any instance), so an
//! instance killed or restarted costs nobody their place and several
//! instances admit no more than one.
//!
//! A pass is signed by the service ([`PassKey`], shared through Redis) and
//! names the person, the sale, their ticket and when it runs out; a
//! purchase in a sale with a room needs one, which the handler checks
//! before the purchase script, which refuses any purchase without it
//! while the sale's `room` flag is set.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::db::{Database, VoucherRow};
use crate::domain::now_ms;
use crate::domain::waiting_room::{Pass, PassError, PassKey, Place, RoomSettings};
use crate::error::{Error, Result};
use crate::store::{Draw, FastPath, RoomLines, Standing};

/// How often every instance admits (and draws lines of sales that just
/// started).
pub const ADMIT_TICK: Duration = Duration::from_millis(100);

/// How often the open rooms are read from the database again: a room set,
/// changed, paused or resumed takes effect within this.
pub const ROOMS_REFRESH: Duration = Duration::from_secs(1);

/// A sale with a room, as the instance knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomSale {
    /// The voucher.
    pub voucher: i64,
    /// Its sale's start: the draw.
    pub begin_ms: i64,
    /// Its sale's end.
    pub end_ms: i64,
    /// The room's settings.
    pub settings: RoomSettings,
}

impl RoomSale {
    /// The room of `row`, if it has one.
    pub fn of(row: &VoucherRow) -> Option<Self> {
        Some(Self {
            voucher: row.id,
            begin_ms: row.begin_ms,
            end_ms: row.end_ms,
            settings: row.room?,
        })
    }
}

/// What a person sees of the room they stand in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The sale's room.
    pub room: RoomSale,
    /// Where they stand.
    pub standing: Standing,
    /// Their pass, signed, while they are admitted.
    pub pass: Option<String>,
}

/// The waiting rooms of a deployment, as one instance serves them.
#[derive(Debug)]
pub struct WaitingRooms {
    lines: RoomLines,
    db: Database,
    fast: Option<Arc<FastPath>>,
    /// The rooms of open sales, from the last refresh.
    open: RwLock<HashMap<i64, RoomSale>>,
    /// The pass key as last read from Redis.
    key: RwLock<Option<PassKey>>,
    /// When the key was last read again for a pass that did not verify.
    key_reread_ms: AtomicI64,
}

impl WaitingRooms {
    /// Rooms whose lines are in `lines`, settings in `db`; `fast` is the
    /// fast path whose sales get the room flag (`None` on the locked path,
    /// which reads the room from the database at each purchase:
    /// `SyncPath::purchase_with_pass`).
    pub fn new(lines: RoomLines, db: Database, fast: Option<Arc<FastPath>>) -> Self {
        Self {
            lines,
            db,
            fast,
            open: RwLock::new(HashMap::new()),
            key: RwLock::new(None),
            key_reread_ms: AtomicI64::new(i64::MIN / 2),
        }
    }

    /// The lines.
    pub fn lines(&self) -> &RoomLines {
        &self.lines
    }

    /// The room of `voucher`: from the instance's list if open, else from
    /// the database. `None`: no such voucher, or no room.
    ///
    /// # Errors
    /// [`Error::Database`] if the database fails.
    pub async fn room(&self, voucher: i64) -> Result<Option<RoomSale>> {
        if let Some(room) = self
            .open
            .read()
            .ok()
            .and_then(|open| open.get(&voucher).copied())
        {
            return Ok(Some(room));
        }
        Ok(self
            .db
            .voucher(voucher)
            .await?
            .as_ref()
            .and_then(RoomSale::of))
    }

    /// Sets (or with `None` removes) the room of `voucher`: in the
    /// database, then the sale's flag in Redis; `false` if there is no such
    /// voucher.
    ///
    /// # Errors
    /// [`Error::Database`] or [`Error::Redis`]: then the room may be set
    /// in the database and not in force yet; ask again (it is idempotent).
    pub async fn set(&self, voucher: i64, room: Option<&RoomSettings>) -> Result<bool> {
        if !self.db.set_room(voucher, room).await? {
            return Ok(false);
        }
        if let Some(fast) = &self.fast {
            fast.set_room(voucher, room.is_some()).await?;
        }
        let mut open = self.open.write().unwrap_or_else(|e| e.into_inner());
        match (room, open.get_mut(&voucher)) {
            (Some(settings), Some(known)) => known.settings = *settings,
            (None, Some(_)) => {
                open.remove(&voucher);
            }
            _ => {}
        }
        Ok(true)
    }

    /// `user` joins the room of `voucher` (joining again changes nothing).
    ///
    /// # Errors
    /// [`Error::Redis`] or [`Error::Database`]; `Ok(None)`: the sale has no
    /// room.
    pub async fn join(&self, voucher: i64, user: i64) -> Result<Option<Seen>> {
        let Some(room) = self.room(voucher).await? else {
            return Ok(None);
        };
        let opens_ms = room.settings.opens_ms(room.begin_ms);
        // Before the room opens nothing is recorded: the standing then
        // says when it opens.
        self.lines
            .join(voucher, user, opens_ms, room.begin_ms)
            .await?;
        self.seen(room, user).await.map(Some)
    }

    /// Where `user` stands in the room of `voucher`, with their pass while
    /// they are admitted.
    ///
    /// # Errors
    /// [`Error::Redis`] or [`Error::Database`]; `Ok(None)`: the sale has no
    /// room.
    pub async fn standing(&self, voucher: i64, user: i64) -> Result<Option<Seen>> {
        let Some(room) = self.room(voucher).await? else {
            return Ok(None);
        };
        self.seen(room, user).await.map(Some)
    }

    async fn seen(&self, room: RoomSale, user: i64) -> Result<Seen> {
        let mut standing = self.lines.standing(room.voucher, user).await?;
        let opens_ms = room.settings.opens_ms(room.begin_ms);
        if standing.place == Place::Outside && now_ms() < opens_ms {
            standing.place = Place::NotOpen { opens_ms };
        }
        let pass = match (standing.place, standing.pass_until_ms) {
            (Place::Ticket(ticket), Some(expires_ms)) => {
                let key = self.key().await?;
                Some(key.sign(&Pass {
                    voucher: room.voucher,
                    user,
                    ticket,
                    expires_ms,
                }))
            }
            _ => None,
        };
        Ok(Seen {
            room,
            standing,
            pass,
        })
    }

    /// The pass `signed`, if it lets `user` buy `voucher` now, signed with
    /// the deployment's current key: a pass that verifies with the key
    /// this instance holds is checked against the key in Redis too (one
    /// `GET`, for admitted people only), so that after Redis lost its data,
    /// and with it the key, no pass signed before buys.
    ///
    /// # Errors
    /// [`Error::Pass`] saying what is wrong with it; [`Error::Redis`] if
    /// the key cannot be read.
    pub async fn check_pass(&self, signed: &str, voucher: i64, user: i64) -> Result<Pass> {
        let held = self.key().await?;
        match held.verify(signed, voucher, user, now_ms()) {
            Ok(pass) => {
                let current = self.read_key().await?;
                if current == held {
                    Ok(pass)
                } else {
                    current
                        .verify(signed, voucher, user, now_ms())
                        .map_err(Error::Pass)
                }
            }
            // Perhaps signed with a key made since this instance read its
            // own (another instance made it after a data loss): read it
            // again, at most once a second (forged passes cost no more).
            Err(PassError::Forged) if self.may_reread() => {
                let current = self.read_key().await?;
                current
                    .verify(signed, voucher, user, now_ms())
                    .map_err(Error::Pass)
            }
            Err(e) => Err(Error::Pass(e)),
        }
    }

    /// Whether a second has passed since the key was last read again for
    /// a pass that did not verify (and if so, notes now).
    fn may_reread(&self) -> bool {
        let now = now_ms();
        let last = self.key_reread_ms.load(Ordering::Relaxed);
        now - last >= 1_000
            && self
                .key_reread_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// `pass`'s holder bought: their place no longer counts against the
    /// room's cap. A failure only keeps it counted until the pass runs out.
    pub async fn bought(&self, pass: &Pass) {
        if let Err(e) = self.lines.leave(pass.voucher, pass.ticket).await {
            tracing::debug!(error = %e, voucher = pass.voucher, "leaving the room failed; the place counts until its pass runs out");
        }
    }

    async fn key(&self) -> Result<PassKey> {
        if let Some(key) = self.key.read().ok().and_then(|k| k.clone()) {
            return Ok(key);
        }
        self.read_key().await
    }

    async fn read_key(&self) -> Result<PassKey> {
        let key = self.lines.pass_key().await?;
        *self.key.write().unwrap_or_else(|e| e.into_inner()) = Some(key.clone());
        Ok(key)
    }

    /// Reads the open sales' rooms from the database.
    async fn refresh(&self) -> Result<()> {
        let rooms = self.db.open_rooms(now_ms()).await?;
        let open = rooms
            .iter()
            .filter_map(RoomSale::of)
            .map(|room| (room.voucher, room))
            .collect();
        *self.open.write().unwrap_or_else(|e| e.into_inner()) = open;
        Ok(())
    }

    /// One admission step over every open room: lines of sales that
    /// started are drawn, then each admits what is due.
    async fn step(&self) {
        let rooms: Vec<RoomSale> = self
            .open
            .read()
            .map(|open| open.values().copied().collect())
            .unwrap_or_default();
        let now = now_ms();
        for room in rooms {
            if now < room.begin_ms {
                continue;
            }
            let admitted = self.lines.admit(room.voucher, &room.settings).await;
            let drawn = match admitted {
                Ok(a) => a.drawn,
                Err(e) => {
                    tracing::debug!(error = %e, voucher = room.voucher, "admission failed");
                    continue;
                }
            };
            if !drawn {
                match self.lines.draw(room.voucher, room.begin_ms).await {
                    Ok(Draw::Drawn(early)) => {
                        tracing::info!(voucher = room.voucher, early, "waiting room drawn")
                    }
                    Ok(Draw::Already | Draw::TooSoon) => {}
                    Err(e) => tracing::debug!(error = %e, voucher = room.voucher, "draw failed"),
                }
            }
        }
    }
}

/// Admits every [`ADMIT_TICK`] (reading the rooms every
/// [`ROOMS_REFRESH`]) until `stop`.
pub async fn admit_until_stopped(rooms: Arc<WaitingRooms>, mut stop: watch::Receiver<bool>) {
    let mut refreshed: Option<tokio::time::Instant> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let next = tokio::time::Instant::now() + ADMIT_TICK;
        if refreshed.is_none_or(|at| at.elapsed() >= ROOMS_REFRESH) {
            match rooms.refresh().await {
                Ok(()) => refreshed = Some(tokio::time::Instant::now()),
                Err(e) => tracing::debug!(error = %e, "reading the open rooms failed"),
            }
        }
        rooms.step().await;
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => {}
        }
    }
}
