//! Helpers shared by the integration tests that drive a live service over
//! HTTP.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use seckill::auth::{Principal, Tokens};
use serde_json::{json, Value};

/// Creates a voucher with `stock` units, on sale from a second ago for an
/// hour, through `base`'s API with an admin token; returns its id.
pub async fn open_voucher(
    http: &reqwest::Client,
    base: &str,
    tokens: &Tokens,
    title: &str,
    stock: i64,
) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let voucher: Value = http
        .post(format!("{base}/api/vouchers"))
        .bearer_auth(tokens.mint(Principal::Admin, Duration::from_secs(600)))
        .json(&json!({"title": title, "stock": stock, "begin_ms": now - 1000, "end_ms": now + 3_600_000}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    voucher["id"].as_i64().unwrap()
}
