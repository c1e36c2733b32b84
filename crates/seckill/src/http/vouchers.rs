//! Voucher routes: create, show, buy.

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::db::VoucherRow;
use crate::domain::money::{Currency, Money};
use crate::domain::purchase::Purchase;
use crate::domain::voucher::{Offer, RefundRestock, SaleTerms, Shop, Title};
use crate::domain::waiting_room::{PassError, RoomSettings};
use crate::error::Error;
use crate::http::error::ApiError;
use crate::http::extract::{Admin, ApiJson, NoBody, PathId, RoomPass, User};
use crate::http::AppState;
use crate::live::{now_ms, SaleView};

/// Body of `POST /api/vouchers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewVoucher {
    title: String,
    stock: i64,
    begin_ms: u64,
    end_ms: u64,
    /// How long a buyer has to pay (default: the service's).
    pay_within_ms: Option<u64>,
    /// Whether a buyer whose order was given back may buy again (default:
    /// yes).
    rebuy_after_cancel: Option<bool>,
    /// The shop it is spent at (default: none named).
    shop: Option<NewShop>,
    /// Sub-title (default: empty).
    #[serde(default)]
    subtitle: String,
    /// Rules shown to buyers (default: empty).
    #[serde(default)]
    rules: String,
    /// What a buyer pays, in minor units (default: 0, a free voucher).
    #[serde(default)]
    price_minor: i64,
    /// What it is worth at its shop, in minor units (default: the price).
    face_value_minor: Option<i64>,
    /// ISO 4217 code of both; required unless both are 0.
    currency: Option<String>,
    /// Whether a price above the face value may be published (default:
    /// no).
    #[serde(default)]
    allow_price_above_face: bool,
    /// Whether refunded units go back on sale (default: while the sale is
    /// open).
    #[serde(default)]
    refund_restock: RefundRestock,
    /// A waiting room in front of the sale (default: none).
    waiting_room: Option<RoomSettings>,
}

/// The shop of a [`NewVoucher`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewShop {
    id: i64,
    name: String,
}

impl NewVoucher {
    /// The offer this request describes, checked.
    fn offer(&self) -> Result<Offer, Error> {
        let face_value_minor = self.face_value_minor.unwrap_or(self.price_minor);
        let currency = match &self.currency {
            Some(code) => Currency::parse("currency", code)?,
            None if self.price_minor == 0 && face_value_minor == 0 => Currency::NONE,
            None => {
                return Err(Error::invalid(
                    "currency",
                    "is required for a price or face value that is not zero",
                ))
            }
        };
        let price = Money::new("price_minor", self.price_minor, currency)?;
        let face_value = Money::new("face_value_minor", face_value_minor, currency)?;
        let mut offer = Offer::priced(price, face_value, self.allow_price_above_face)?
            .with_subtitle(&self.subtitle)?
            .with_rules(&self.rules)?
            .with_refund_restock(self.refund_restock);
        if let Some(shop) = &self.shop {
            offer = offer.at_shop(Shop::new(shop.id, &shop.name)?);
        }
        Ok(offer)
    }
}

/// A voucher as the API shows it: its terms, its stock left, and when
/// that stock was read (`as_of_ms`, the server's clock: the answer reflects
/// every change committed before; at most
/// [`FRESH_FOR`](crate::live::FRESH_FOR) before it was
/// given).
#[derive(Debug, Serialize)]
pub struct VoucherView {
    #[serde(flatten)]
    sale: SaleView,
    as_of_ms: i64,
}

#[tracing::instrument(name = "create_voucher", skip_all)]
pub(crate) async fn create(
    State(state): State<AppState>,
    _: Admin,
    ApiJson(body): ApiJson<NewVoucher>,
) -> Result<(StatusCode, Json<VoucherView>), ApiError> {
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    let title = Title::parse(&body.title)?;
    let window = body
        .pay_within_ms
        .map_or(state.pay_within, Duration::from_millis);
    let terms = SaleTerms::new(body.stock, at(body.begin_ms), at(body.end_ms))?
        .with_pay_within(window)?
        .with_rebuy_after_cancel(body.rebuy_after_cancel.unwrap_or(true));
    let offer = body.offer()?;
    let room = body.waiting_room.map(RoomSettings::checked).transpose()?;
    // The database is the record; Redis holds the sale's live state. With
    // Redis failing the voucher is still created: its first purchase finds
    // the sale missing in Redis and restores it from the database (see
    // `repair`), so nothing is left half made and a client that retries
    // does not create it twice.
    let id = state
        .db
        .publish_voucher_with_room(&title, &offer, &terms, room.as_ref())
        .await?;
    state.sales.open(id, &terms, room.is_some()).await;
    let row = VoucherRow {
        id,
        title: body.title,
        stock: terms.stock(),
        begin_ms: terms.begin_ms(),
        end_ms: terms.end_ms(),
        pay_within_ms: terms.pay_within_ms(),
        rebuy_after_cancel: terms.rebuy_after_cancel(),
        shop: offer.shop().cloned(),
        subtitle: offer.subtitle().to_owned(),
        rules: offer.rules().to_owned(),
        price: offer.price(),
        face_value: offer.face_value(),
        refund_restock: offer.refund_restock(),
        room,
    };
    Ok((
        StatusCode::CREATED,
        Json(VoucherView {
            sale: SaleView::new(row, terms.stock()),
            as_of_ms: now_ms(),
        }),
    ))
}

/// Vouchers listed at most.
const LIST_LIMIT: i64 = 100;

/// The newest vouchers: from the live figures while they are fresh (one
/// read per tick for every reader), else from the stores.
pub(crate) async fn list(
    State(state): State<AppState>,
) -> Result<Json<Vec<VoucherView>>, ApiError> {
    if let Some(snapshot) = state.live.fresh() {
        let as_of_ms = snapshot.as_of_ms;
        return Ok(Json(
            snapshot
                .sales
                .iter()
                .take(LIST_LIMIT as usize)
                .map(|sale| VoucherView {
                    sale: sale.clone(),
                    as_of_ms,
                })
                .collect(),
        ));
    }
    let as_of_ms = now_ms();
    let rows = state.db.vouchers(LIST_LIMIT).await?;
    let stocks: Vec<(i64, i64)> = rows.iter().map(|r| (r.id, r.stock)).collect();
    let left = state.sales.stock_left(&stocks).await?;
    Ok(Json(
        rows.into_iter()
            .zip(left)
            .map(|(row, stock_left)| VoucherView {
                sale: SaleView::new(row, stock_left),
                as_of_ms,
            })
            .collect(),
    ))
}

pub(crate) async fn show(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Response, ApiError> {
    if let Some(snapshot) = state.live.fresh() {
        if let Some(answer) = snapshot.answers.get(&id) {
            // Serialised once per tick for every reader.
            return Ok((
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                answer.clone(),
            )
                .into_response());
        }
    }
    // Not among the newest, or the figures are not fresh: the stores (in
    // a span of their own, as the purchase's).
    use tracing::Instrument;
    Box::pin(show_from_stores(&state, id))
        .instrument(tracing::debug_span!("show_voucher", voucher = id))
        .await
}

async fn show_from_stores(state: &AppState, id: i64) -> Result<Response, ApiError> {
    let as_of_ms = now_ms();
    let row = state
        .db
        .voucher(id)
        .await?
        .ok_or(ApiError::NotFound("voucher"))?;
    let stock_left = state.sales.stock_left(&[(id, row.stock)]).await?[0];
    Ok(Json(VoucherView {
        sale: SaleView::new(row, stock_left),
        as_of_ms,
    })
    .into_response())
}

/// Answer to an accepted purchase.
#[derive(Debug, Serialize)]
pub struct Accepted {
    /// The order id, as a string (it exceeds JavaScript's safe integers).
    order_id: String,
    /// `pending` (on its way to the database) or `reserved` (stored).
    state: crate::domain::order::OrderState,
}

pub(crate) async fn purchase(
    State(state): State<AppState>,
    _: NoBody,
    User(user): User,
    PathId(voucher): PathId,
    RoomPass(signed): RoomPass,
) -> Result<Json<Accepted>, ApiError> {
    use tracing::Instrument;
    // A debug span: the request's own span (its id and route) is on every
    // line logged; this one, made for each of the sale's busiest requests,
    // costs the log formatter microseconds, so it is there when asked for.
    let span = tracing::debug_span!("purchase", voucher, user);
    buy(&state, voucher, user, signed).instrument(span).await
}

async fn buy(
    state: &AppState,
    voucher: i64,
    user: i64,
    signed: Option<axum::http::HeaderValue>,
) -> Result<Json<Accepted>, ApiError> {
    state.limits.check_user(user)?;
    // A pass is checked here (signature, person, sale, time); whether the
    // sale needs one is the purchase's own check, atomic with it.
    let pass = match signed {
        Some(value) => {
            let signed = value.to_str().map_err(|_| Error::Pass(PassError::Forged))?;
            // Boxed, as the room's other call below: most purchases carry
            // no pass, and their future need not hold these.
            Some(Box::pin(state.rooms.check_pass(signed, voucher, user)).await?)
        }
        None => None,
    };
    let outcome = state
        .sales
        .purchase_with_pass(voucher, user, pass.is_some())
        .await?;
    match outcome {
        Purchase::Accepted(id) => {
            if let Some(pass) = &pass {
                Box::pin(state.rooms.bought(pass)).await;
            }
            Ok(Json(Accepted {
                order_id: id.to_string(),
                state: state.sales.accepted_state(),
            }))
        }
        Purchase::Refused(refusal) => Err(ApiError::Refused(refusal)),
    }
}
