//! The setup step of a run: the vouchers the tools publish.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::{json, Value};

use seckill::auth::{Principal, Tokens};

/// What the vouchers the tools publish cost, in fen: 19.90 CNY (worth
/// 50.00 at the shop).
pub const PRICE_MINOR: i64 = 1990;

/// Their currency.
pub const CURRENCY: &str = "CNY";

/// The setup step: a voucher on sale from now for a day; its buyers have
/// `pay_within` to pay (`None`: the service's default window).
pub async fn create_voucher(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    stock: i64,
    pay_within: Option<Duration>,
) -> anyhow::Result<i64> {
    let opened = SystemTime::now() - Duration::from_secs(1);
    let title = format!("bench {}", opened.duration_since(UNIX_EPOCH)?.as_millis());
    create_voucher_at(http, base, tokens, &title, stock, opened, pay_within).await
}

/// As [`create_voucher`], titled `title`, opening at `begin` (for a day).
///
/// # Errors
/// If the service refuses or cannot be reached.
pub async fn create_voucher_at(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    title: &str,
    stock: i64,
    begin: SystemTime,
    pay_within: Option<Duration>,
) -> anyhow::Result<i64> {
    let begin_ms = begin.duration_since(UNIX_EPOCH)?.as_millis() as u64;
    let mut body = json!({
        "title": title, "stock": stock,
        "begin_ms": begin_ms, "end_ms": begin_ms + 24 * 3_600_000,
        "shop": {"id": 1, "name": "Hotpot House"}, "subtitle": "Dinner for two, any weekday",
        "price_minor": PRICE_MINOR, "face_value_minor": 5000, "currency": CURRENCY
    });
    if let Some(window) = pay_within {
        body["pay_within_ms"] = json!(window.as_millis() as u64);
    }
    create_voucher_from(http, base, tokens, &body).await
}

/// Creates the voucher `body` describes (`POST /api/vouchers`, as an
/// operator); its id.
///
/// # Errors
/// If the service refuses or cannot be reached.
pub async fn create_voucher_from(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    body: &Value,
) -> anyhow::Result<i64> {
    let response = http
        .post(format!("{base}/api/vouchers"))
        .bearer_auth(tokens.mint(Principal::Admin, Duration::from_secs(600)))
        .json(body)
        .send()
        .await
        .context("creating the voucher")?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    anyhow::ensure!(
        status.is_success(),
        "creating the voucher: HTTP {status}: {body} (is --token-secret the service's?)"
    );
    body["id"].as_i64().context("the voucher answer has no id")
}
