//! `seckill-tools lab` shows each strategy's bug on every run, and the cures
//! hold; the same for giving a unit back.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_broken_strategies_fail_every_time_and_the_cures_never_oversell() {
    let out = Command::new(env!("CARGO_BIN_EXE_seckill-tools"))
        .args(["lab", "--json", "--stock", "10", "--buyers", "40"])
        .output()
        .expect("run seckill-tools lab");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let rows: Vec<Value> = serde_json::from_str(&text).expect("JSON rows");
    assert_eq!(rows.len(), 10);
    let n = |row: usize, field: &str| rows[row][field].as_i64().unwrap();
    // 1, 4, 5 oversell; 2 oversells across two instances; 3 stalls.
    for row in [0, 1, 3, 4] {
        assert!(
            n(row, "oversold") > 0,
            "{} did not oversell: {}",
            rows[row]["strategy"],
            rows[row]
        );
    }
    assert!(
        n(2, "stuck") > 0 && n(2, "undersold") > 0,
        "SETNX without expiry did not stall: {}",
        rows[2]
    );
    // 6, 7 and 8 (the database table lock) sell exactly the stock.
    for row in [5, 6, 7] {
        assert_eq!(
            (n(row, "accepted"), n(row, "oversold"), n(row, "undersold")),
            (10, 0, 0),
            "{}",
            rows[row]
        );
        assert_eq!(n(row, "errors"), 0, "{}", rows[row]);
    }
    // Giving units back (service 10): the naive return, applied by both the
    // cancellation and the sweep, sells each unit twice; the service's
    // sells it once.
    assert_eq!(
        (n(8, "accepted"), n(8, "oversold")),
        (20, 10),
        "{}",
        rows[8]
    );
    assert_eq!(
        (n(9, "accepted"), n(9, "oversold"), n(9, "undersold")),
        (10, 0, 0),
        "{}",
        rows[9]
    );
}
