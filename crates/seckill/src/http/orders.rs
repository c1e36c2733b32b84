//! Order routes: a user sees and changes only their own orders.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::db::Transition;
use crate::domain::money::Currency;
use crate::domain::order::RedeemCode;
use crate::domain::order::{OrderState, StoredOrder};
use crate::http::error::ApiError;
use crate::http::extract::{Admin, ApiJson, IdempotencyKey, PathId, User};
use crate::http::AppState;
use crate::sale::OrderOf;
use crate::OrderId;

/// An order as its owner sees it.
#[derive(Debug, Serialize)]
pub struct OrderView {
    /// The order id (a string: it exceeds JavaScript's safe integers).
    order_id: String,
    /// The voucher.
    voucher_id: i64,
    /// Pending, reserved, paid, cancelled, expired or failed.
    state: OrderState,
    /// The payment deadline (Unix ms), once stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pay_by_ms: Option<i64>,
    /// When it was paid (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    paid_ms: Option<i64>,
    /// When it was cancelled or expired (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    closed_ms: Option<i64>,
    /// What its buyer pays, in minor units, once stored (the voucher's
    /// price then).
    #[serde(skip_serializing_if = "Option::is_none")]
    amount_minor: Option<i64>,
    /// The amount's currency, once stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    currency: Option<Currency>,
    /// The one-time code its buyer shows at the shop, once paid.
    #[serde(skip_serializing_if = "Option::is_none")]
    redeem_code: Option<String>,
    /// When its shop redeemed it (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    used_ms: Option<i64>,
    /// When its refund completed (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    refunded_ms: Option<i64>,
    /// Whether its unit went back on sale (cancelled, expired, or refunded
    /// while its voucher takes refunded units back), once stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    unit_returned: Option<bool>,
    /// `pending` while a payment asked of the provider awaits its
    /// callback (the order is still reserved).
    #[serde(skip_serializing_if = "Option::is_none")]
    payment: Option<&'static str>,
}

impl From<&StoredOrder> for OrderView {
    fn from(order: &StoredOrder) -> Self {
        Self {
            order_id: order.record.id.to_string(),
            voucher_id: order.record.voucher_id,
            state: order.state,
            pay_by_ms: Some(order.pay_by_ms),
            paid_ms: order.paid_ms,
            closed_ms: order.closed_ms,
            amount_minor: Some(order.amount.minor()),
            currency: Some(order.amount.currency()),
            redeem_code: order.redeem_code.clone(),
            used_ms: order.used_ms,
            refunded_ms: order.refunded_ms,
            unit_returned: Some(order.returned),
            payment: (order.state == OrderState::Reserved && order.pay_reference.is_some())
                .then_some("pending"),
        }
    }
}

impl OrderView {
    fn unstored(id: OrderId, voucher_id: i64, state: OrderState) -> Self {
        Self {
            order_id: id.to_string(),
            voucher_id,
            state,
            pay_by_ms: None,
            paid_ms: None,
            closed_ms: None,
            amount_minor: None,
            currency: None,
            redeem_code: None,
            used_ms: None,
            refunded_ms: None,
            unit_returned: None,
            payment: None,
        }
    }
}

#[tracing::instrument(name = "order_of", skip_all, fields(voucher, user))]
pub(crate) async fn for_voucher(
    State(state): State<AppState>,
    User(user): User,
    PathId(voucher): PathId,
) -> Result<Json<OrderView>, ApiError> {
    tracing::Span::current()
        .record("voucher", voucher)
        .record("user", user);
    match state.sales.order_of(voucher, user).await? {
        Some(OrderOf::Stored(order)) => Ok(Json(OrderView::from(&order))),
        Some(OrderOf::Unstored(id, order_state)) => {
            Ok(Json(OrderView::unstored(id, voucher, order_state)))
        }
        None => Err(ApiError::NotFound("order")),
    }
}

#[tracing::instrument(name = "my_orders", skip_all, fields(user))]
pub(crate) async fn mine(
    State(state): State<AppState>,
    User(user): User,
) -> Result<Json<Vec<OrderView>>, ApiError> {
    tracing::Span::current().record("user", user);
    let orders = state.db.orders_of(user).await?;
    Ok(Json(orders.iter().map(OrderView::from).collect()))
}

#[tracing::instrument(name = "show_order", skip_all, fields(order, user))]
pub(crate) async fn show(
    State(state): State<AppState>,
    User(user): User,
    PathId(id): PathId,
) -> Result<Json<OrderView>, ApiError> {
    tracing::Span::current()
        .record("order", id)
        .record("user", user);
    match state.db.order(id).await? {
        Some(order) if order.record.user_id == user => Ok(Json(OrderView::from(&order))),
        // Another buyer's order is not found, as an unknown one.
        _ => Err(ApiError::NotFound("stored order")),
    }
}

#[tracing::instrument(name = "pay_order", skip_all, fields(order, user))]
pub(crate) async fn pay(
    State(state): State<AppState>,
    User(user): User,
    PathId(id): PathId,
    IdempotencyKey(key): IdempotencyKey,
) -> Result<(StatusCode, Json<OrderView>), ApiError> {
    tracing::Span::current()
        .record("order", id)
        .record("user", user);
    let outcome = state.orders.pay(id, user, &key).await?;
    answer(&state, user, id, outcome).await
}

#[tracing::instrument(name = "cancel_order", skip_all, fields(order, user))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    User(user): User,
    PathId(id): PathId,
) -> Result<(StatusCode, Json<OrderView>), ApiError> {
    tracing::Span::current()
        .record("order", id)
        .record("user", user);
    let outcome = state.orders.cancel(id, user).await?;
    answer(&state, user, id, outcome).await
}

#[tracing::instrument(name = "refund_order", skip_all, fields(order, user))]
pub(crate) async fn refund(
    State(state): State<AppState>,
    User(user): User,
    PathId(id): PathId,
    IdempotencyKey(key): IdempotencyKey,
) -> Result<(StatusCode, Json<OrderView>), ApiError> {
    tracing::Span::current()
        .record("order", id)
        .record("user", user);
    match state.orders.refund(id, user, &key).await? {
        Transition::Refused(order) if order.state == OrderState::Reserved => Err(ApiError::NotPaid),
        outcome => answer(&state, user, id, outcome).await,
    }
}

/// Body of `POST /api/redemptions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redemption {
    /// The code the buyer shows.
    code: String,
}

/// The shop redeems the order whose code its buyer shows: it becomes
/// used, once; a second redemption of the code is a 409 `order_used`.
#[tracing::instrument(name = "redeem_order", skip_all)]
pub(crate) async fn redeem(
    State(state): State<AppState>,
    _: Admin,
    ApiJson(body): ApiJson<Redemption>,
) -> Result<Json<OrderView>, ApiError> {
    let code = RedeemCode::parse(&body.code)?;
    match state.orders.redeem(code.as_str()).await? {
        Transition::Done(order) | Transition::Already(order) | Transition::Pending(order) => {
            Ok(Json(OrderView::from(&order)))
        }
        Transition::Refused(order) => Err(ApiError::OrderConflict(order.state)),
        Transition::NotFound => Err(ApiError::NotFound("redemption code")),
    }
}

/// A change done now or before is the order as it stands (200); one asked
/// of the payment provider, whose callback decides, the order meanwhile
/// (202); a refused one a 409 naming the state; an order of `user`
/// accepted but not stored yet a 409 `order_pending` (ask again in a
/// moment) or `order_failed`; any other (unknown, or another buyer's) a
/// 404.
async fn answer(
    state: &AppState,
    user: i64,
    id: i64,
    outcome: Transition,
) -> Result<(StatusCode, Json<OrderView>), ApiError> {
    match outcome {
        Transition::Done(order) | Transition::Already(order) => {
            Ok((StatusCode::OK, Json(OrderView::from(&order))))
        }
        Transition::Pending(order) => Ok((StatusCode::ACCEPTED, Json(OrderView::from(&order)))),
        Transition::Refused(order) => Err(ApiError::OrderConflict(order.state)),
        Transition::NotFound => match state.sales.unstored_order(user, id).await? {
            Some(unstored) => Err(ApiError::OrderConflict(unstored)),
            None => Err(ApiError::NotFound("stored order")),
        },
    }
}
