//! Waiting-room routes: the shop sets a sale's room; a buyer joins it and
//! asks where they stand, and receives their pass once admitted.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use crate::domain::waiting_room::{Place, RoomSettings};
use crate::http::error::ApiError;
use crate::http::extract::{Admin, ApiJson, PathId, User};
use crate::http::AppState;
use crate::waiting_room::Seen;

/// The header a purchase carries its pass in.
pub const PASS_HEADER: &str = "room-pass";

/// A sale's room as its operator set it.
#[derive(Debug, Serialize)]
pub struct RoomView {
    voucher_id: i64,
    #[serde(flatten)]
    settings: RoomSettings,
}

/// Where a person stands, as the storefront shows it.
#[derive(Debug, Serialize)]
pub struct StandingView {
    voucher_id: i64,
    /// `not_open`, `outside`, `awaiting_draw`, `waiting`, `admitted`,
    /// `done` (bought, or the turn passed) or `sold_out` (every unit is
    /// bought while they wait: a unit given back reopens the line).
    state: &'static str,
    /// When joining opens (Unix ms).
    opens_ms: i64,
    /// The draw: the sale's start (Unix ms).
    draw_ms: i64,
    /// Their ticket (1 is the first place); `null` before the draw.
    ticket: Option<u64>,
    /// The last ticket admitted.
    admitted_through: u64,
    /// People ahead of them, while waiting.
    ahead: Option<u64>,
    /// How long until their turn at the room's rate (ms), while waiting.
    estimate_ms: Option<u64>,
    /// People in line and not admitted.
    waiting: u64,
    /// People admitted per second.
    admit_per_s: u32,
    /// Whether admission is paused.
    paused: bool,
    /// Their pass, while admitted: send it as the `Room-Pass` header of the
    /// purchase.
    pass: Option<String>,
    /// When the pass runs out (Unix ms).
    pass_until_ms: Option<i64>,
}

impl From<Seen> for StandingView {
    fn from(seen: Seen) -> Self {
        let room = seen.room;
        let line = seen.standing.line;
        let (state, ticket) = match seen.standing.place {
            Place::NotOpen { .. } => ("not_open", None),
            Place::Outside => ("outside", None),
            Place::AwaitingDraw => ("awaiting_draw", None),
            Place::Ticket(t) if t > line.admitted_through => ("waiting", Some(t)),
            Place::Ticket(t) if seen.pass.is_some() => ("admitted", Some(t)),
            Place::Ticket(t) => ("done", Some(t)),
        };
        let (state, ticket) = match (state, seen.standing.stock_left) {
            ("outside" | "awaiting_draw" | "waiting", Some(0)) => ("sold_out", ticket),
            other => (other.0, ticket),
        };
        let ahead = (state == "waiting")
            .then(|| ticket.map(|t| t - line.admitted_through - 1))
            .flatten();
        let rate = u64::from(room.settings.admit_per_s.max(1));
        Self {
            voucher_id: room.voucher,
            state,
            opens_ms: room.settings.opens_ms(room.begin_ms),
            draw_ms: room.begin_ms,
            ticket,
            admitted_through: line.admitted_through,
            ahead,
            estimate_ms: ahead.map(|n| (n + 1).saturating_mul(1000) / rate),
            waiting: line.waiting(),
            admit_per_s: room.settings.admit_per_s,
            paused: room.settings.paused,
            pass: seen.pass,
            pass_until_ms: seen.standing.pass_until_ms,
        }
    }
}

/// `PUT /api/vouchers/{id}/room`: set, change, pause or resume a sale's
/// room.
pub(crate) async fn set(
    State(state): State<AppState>,
    _: Admin,
    PathId(id): PathId,
    ApiJson(settings): ApiJson<RoomSettings>,
) -> Result<Json<RoomView>, ApiError> {
    let settings = settings.checked()?;
    if !state.rooms.set(id, Some(&settings)).await? {
        return Err(ApiError::NotFound("voucher"));
    }
    Ok(Json(RoomView {
        voucher_id: id,
        settings,
    }))
}

/// `DELETE /api/vouchers/{id}/room`: the sale without a room.
pub(crate) async fn remove(
    State(state): State<AppState>,
    _: Admin,
    PathId(id): PathId,
) -> Result<StatusCode, ApiError> {
    if !state.rooms.set(id, None).await? {
        return Err(ApiError::NotFound("voucher"));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/vouchers/{id}/room`: join (again: the same place).
pub(crate) async fn join(
    State(state): State<AppState>,
    User(user): User,
    PathId(id): PathId,
) -> Result<Json<StandingView>, ApiError> {
    state.limits.check_user(user)?;
    let seen = state
        .rooms
        .join(id, user)
        .await?
        .ok_or(ApiError::NotFound("waiting room"))?;
    Ok(Json(seen.into()))
}

/// `GET /api/vouchers/{id}/room`: where the caller stands.
pub(crate) async fn standing(
    State(state): State<AppState>,
    User(user): User,
    PathId(id): PathId,
) -> Result<Json<StandingView>, ApiError> {
    let seen = state
        .rooms
        .standing(id, user)
        .await?
        .ok_or(ApiError::NotFound("waiting room"))?;
    Ok(Json(seen.into()))
}
