//! The `seckill-tools demo` command end to end (small sale), both purchase paths:
//! the real binary, a private redis-server, a SQLite file, real HTTP; the
//! buyer model after the sale (service 8 to 11) included.

use std::process::Command;

fn demo(mode: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_seckill-tools"))
        .args(["demo", "--mode", mode, "--stock", "40", "--users", "300"])
        .args(["--requests-per-user", "2", "--concurrency", "32"])
        // Payments are confirmed by the simulator's callbacks, up to 0.35 s
        // after they are asked: a window a slow machine still pays within.
        .args(["--pay-within", "3s"])
        .output()
        .expect("run seckill-tools demo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The stock sold in full, and no more than the stock and the units given
/// back: an order whose 3 s window passes while the load still runs (a slow
/// machine) gives its unit back, and the unit may sell again during the load.
fn sold_the_stock(report: &str) {
    let accepted: u64 = report
        .split("accepted ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no accepted count in {report}"));
    assert!(accepted >= 40, "{report}");
    assert!(
        report.contains("[ok] no oversell: accepted <= stock + orders given back"),
        "{report}"
    );
}

#[test]
fn the_async_demo_sells_exactly_the_stock_and_verifies_every_invariant() {
    let (ok, report) = demo("async");
    assert!(ok, "{report}");
    sold_the_stock(&report);
    assert!(
        report.contains("[ok] Redis and database agree (reconcile)"),
        "{report}"
    );
    assert!(
        report.contains(
            "[ok] every unit given back was sold again, and every unit ends paid or used (database)"
        ),
        "{report}"
    );
    // Shop 9: the provider's own ledger against the database.
    for money in [
        "[ok] money: every order kept its amount if paid or used, nothing otherwise (0 not)",
        "[ok] money adds up (CNY): the provider kept what the paid and used orders cost",
        "[ok] no forged callback taken",
    ] {
        assert!(report.contains(money), "{money}: {report}");
    }
    assert!(!report.contains("FAILED"), "{report}");
}

#[test]
fn the_sync_demo_sells_exactly_the_stock_and_verifies_every_invariant() {
    let (ok, report) = demo("sync");
    assert!(ok, "{report}");
    sold_the_stock(&report);
    assert!(!report.contains("FAILED"), "{report}");
}
