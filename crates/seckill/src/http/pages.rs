//! The storefront (`/`) and the operator console (`/admin`): plain HTML, a
//! style sheet and one small script, embedded in the binary (no build step,
//! nothing fetched from elsewhere). The pages call the JSON API with the
//! bearer token a person pastes in (kept in the tab's session storage);
//! the console's data needs an operator's token, as the API does.
//!
//! For a demo on one machine only, `POST /api/demo/sign-in` hands out a
//! token for a user id or the operator when the service was started with
//! `demo_sign_in` (refused at start unless it listens on loopback).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use crate::auth::Principal;
use crate::http::error::ApiError;
use crate::http::extract::{ApiJson, Bearer};
use crate::http::AppState;

const STOREFRONT: &str = include_str!("assets/storefront.html");
const CONSOLE: &str = include_str!("assets/console.html");
const SCRIPT: &str = include_str!("assets/seckill.js");
const STYLE: &str = include_str!("assets/seckill.css");
const ICON: &str = include_str!("assets/favicon.svg");

/// How long a demo sign-in's token lasts.
const DEMO_TOKEN_TTL: Duration = Duration::from_secs(8 * 3600);

/// `GET /`.
pub(crate) async fn storefront(State(state): State<AppState>) -> Html<String> {
    page(STOREFRONT, &state)
}

/// `GET /admin`.
pub(crate) async fn console(State(state): State<AppState>) -> Html<String> {
    page(CONSOLE, &state)
}

/// `html`, marked for the script when the demo sign-in is on (its forms
/// show only then).
fn page(html: &str, state: &AppState) -> Html<String> {
    let demo = if state.demo_sign_in { "on" } else { "off" };
    Html(html.replacen("<body ", &format!("<body data-demo=\"{demo}\" "), 1))
}

/// `GET /assets/{file}`.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "seckill.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "seckill.css" => (STYLE, "text/css; charset=utf-8"),
        "favicon.svg" => (ICON, "image/svg+xml"),
        _ => return ApiError::NotFound("asset").into_response(),
    };
    ([(CONTENT_TYPE, kind), (CACHE_CONTROL, "no-cache")], body).into_response()
}

/// Body of `POST /api/demo/sign-in`: a user id, or the operator.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoSignIn {
    user_id: Option<i64>,
    #[serde(default)]
    operator: bool,
}

/// A demo sign-in's answer.
#[derive(Debug, Serialize)]
pub struct DemoToken {
    token: String,
}

/// `POST /api/demo/sign-in`: a 404 unless the demo sign-in is on.
/// Who the caller's token speaks for, as `GET /api/me` answers.
#[derive(Debug, Serialize)]
pub struct Me {
    /// `user` or `operator`.
    role: &'static str,
    /// The buyer's id (a user only).
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<i64>,
}

/// `GET /api/me`: whom the bearer token names (the pages show it; a token
/// is opaque to them).
pub(crate) async fn me(Bearer(who): Bearer) -> Json<Me> {
    Json(match who {
        Principal::User(id) => Me {
            role: "user",
            user_id: Some(id),
        },
        Principal::Admin => Me {
            role: "operator",
            user_id: None,
        },
    })
}

pub(crate) async fn demo_sign_in(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<DemoSignIn>,
) -> Result<Json<DemoToken>, ApiError> {
    if !state.demo_sign_in {
        return Err(ApiError::NotFound("route"));
    }
    let who = match (body.user_id, body.operator) {
        (None, true) => Principal::Admin,
        (Some(id), false) if id > 0 => Principal::User(id),
        _ => {
            return Err(ApiError::BadRequest {
                field: "user_id".to_owned(),
                message: "give a positive user_id, or operator: true".to_owned(),
            })
        }
    };
    Ok(Json(DemoToken {
        token: state.tokens.try_mint(who, DEMO_TOKEN_TTL)?,
    }))
}
