//! Voucher routes: create, show, buy.

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::domain::voucher::{SaleTerms, Title};
use crate::http::error::ApiError;
use crate::http::extract::{Admin, ApiJson, PathId, User};
use crate::http::{AppState, PurchasePath};
use crate::repair::Scope;
use crate::store::{Purchase, Refusal};

/// Body of `POST /api/vouchers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewVoucher {
    title: String,
    stock: i64,
    begin_ms: u64,
    end_ms: u64,
}

/// A voucher as the API shows it.
#[derive(Debug, Serialize)]
pub struct VoucherView {
    id: i64,
    title: String,
    stock_left: i64,
    begin_ms: i64,
    end_ms: i64,
}

#[tracing::instrument(name = "create_voucher", skip_all)]
pub(crate) async fn create(
    State(state): State<AppState>,
    _: Admin,
    ApiJson(body): ApiJson<NewVoucher>,
) -> Result<(StatusCode, Json<VoucherView>), ApiError> {
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    let title = Title::parse(&body.title)?;
    let terms = SaleTerms::new(body.stock, at(body.begin_ms), at(body.end_ms))?;
    // The database is the record; Redis holds the sale's live state. With
    // Redis failing the voucher is still created: its first purchase finds
    // the sale missing in Redis and restores it from the database (see
    // `repair`), so nothing is left half made and a client that retries
    // does not create it twice.
    let id = state.db.create_voucher(&title, &terms).await?;
    if let Err(e) = state.fast.load_voucher(id, &terms).await {
        tracing::warn!(voucher = id, error = %e, "voucher created; Redis will get its sale on the first purchase");
    } else if matches!(state.purchases, PurchasePath::Async(_)) {
        // A Redis that restarted since its state was last verified is
        // verified now, before this sale can be bought from.
        if let Err(e) = state.repair.ensure_verified(Some(id)).await {
            tracing::warn!(voucher = id, error = %e, "sale state not verified; the first purchase will");
        }
    }
    Ok((
        StatusCode::CREATED,
        Json(VoucherView {
            id,
            title: body.title,
            stock_left: terms.stock(),
            begin_ms: terms.begin_ms(),
            end_ms: terms.end_ms(),
        }),
    ))
}

/// Vouchers listed at most.
const LIST_LIMIT: i64 = 100;

pub(crate) async fn list(
    State(state): State<AppState>,
) -> Result<Json<Vec<VoucherView>>, ApiError> {
    let rows = state.db.vouchers(LIST_LIMIT).await?;
    // The fast path's live stock runs ahead of the database's.
    let live = match &state.purchases {
        PurchasePath::Async(fast) => {
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            fast.remaining_stocks(&ids).await?
        }
        PurchasePath::Sync(_) => vec![None; rows.len()],
    };
    Ok(Json(
        rows.into_iter()
            .zip(live)
            .map(|(row, live)| VoucherView {
                id: row.id,
                title: row.title,
                stock_left: live.unwrap_or(row.stock),
                begin_ms: row.begin_ms,
                end_ms: row.end_ms,
            })
            .collect(),
    ))
}

/// The fast path's live stock runs ahead of the database's.
async fn live_stock(state: &AppState, id: i64, db_stock: i64) -> Result<i64, ApiError> {
    Ok(match &state.purchases {
        PurchasePath::Async(fast) => fast.remaining_stock(id).await?.unwrap_or(db_stock),
        PurchasePath::Sync(_) => db_stock,
    })
}

pub(crate) async fn show(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> Result<Json<VoucherView>, ApiError> {
    let row = state
        .db
        .voucher(id)
        .await?
        .ok_or(ApiError::NotFound("voucher"))?;
    let stock_left = live_stock(&state, id, row.stock).await?;
    Ok(Json(VoucherView {
        id: row.id,
        title: row.title,
        stock_left,
        begin_ms: row.begin_ms,
        end_ms: row.end_ms,
    }))
}

/// Answer to an accepted purchase.
#[derive(Debug, Serialize)]
pub struct Accepted {
    /// The order id, as a string (it exceeds JavaScript's safe integers).
    order_id: String,
    /// `pending` (on its way to the database) or `created` (stored).
    state: &'static str,
}

#[tracing::instrument(name = "purchase", skip_all, fields(voucher, user))]
pub(crate) async fn purchase(
    State(state): State<AppState>,
    User(user): User,
    PathId(voucher): PathId,
) -> Result<Json<Accepted>, ApiError> {
    tracing::Span::current()
        .record("voucher", voucher)
        .record("user", user);
    state.limits.check_user(user)?;
    let (outcome, stored) = match &state.purchases {
        PurchasePath::Async(fast) => match fast.purchase(voucher, user).await {
            Err(crate::Error::SaleUnverified) => {
                state.repair.start(Scope::Restarted {
                    voucher: Some(voucher),
                });
                return Err(ApiError::Repairing);
            }
            Ok(Purchase::Refused(Refusal::UnknownVoucher))
                if state.db.voucher_window(voucher).await?.is_some() =>
            {
                // Redis lost this sale's state; the database has it.
                state.repair.start(Scope::Voucher(voucher));
                return Err(ApiError::Repairing);
            }
            outcome => (outcome?, "pending"),
        },
        PurchasePath::Sync(sync) => (sync.purchase(voucher, user).await?, "created"),
    };
    match outcome {
        Purchase::Accepted(id) => Ok(Json(Accepted {
            order_id: id.to_string(),
            state: stored,
        })),
        Purchase::Refused(refusal) => Err(ApiError::Refused(refusal)),
    }
}
