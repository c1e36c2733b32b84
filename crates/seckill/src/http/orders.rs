//! Order routes: a user sees only their own orders.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use crate::domain::order::OrderState;
use crate::http::error::ApiError;
use crate::http::extract::{PathId, User};
use crate::http::AppState;

/// An order as its owner sees it.
#[derive(Debug, Serialize)]
pub struct OrderView {
    /// The order id (a string: it exceeds JavaScript's safe integers).
    order_id: String,
    /// The voucher.
    voucher_id: i64,
    /// Pending, created or failed.
    state: OrderState,
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
    let found = state.sales.order_of(voucher, user).await?;
    let (id, order_state) = found.ok_or(ApiError::NotFound("order"))?;
    Ok(Json(OrderView {
        order_id: id.to_string(),
        voucher_id: voucher,
        state: order_state,
    }))
}

#[tracing::instrument(name = "my_orders", skip_all, fields(user))]
pub(crate) async fn mine(
    State(state): State<AppState>,
    User(user): User,
) -> Result<Json<Vec<OrderView>>, ApiError> {
    tracing::Span::current().record("user", user);
    let orders = state.db.orders_of(user).await?;
    Ok(Json(
        orders
            .into_iter()
            .map(|(id, voucher_id, _)| OrderView {
                order_id: id.to_string(),
                voucher_id,
                state: OrderState::Created,
            })
            .collect(),
    ))
}
