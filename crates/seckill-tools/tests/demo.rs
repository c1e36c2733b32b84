//! The `seckill-tools demo` command end to end (small sale), both purchase paths:
//! the real binary, a private redis-server, a SQLite file, real HTTP; the
//! buyer model after the sale (service 8 to 11) included.

use std::process::Command;

fn demo(mode: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_seckill-tools"))
        .args(["demo", "--mode", mode, "--stock", "40", "--users", "300"])
        .args(["--requests-per-user", "2", "--concurrency", "32"])
        .args(["--pay-within", "2s"])
        .output()
        .expect("run seckill-tools demo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_async_demo_sells_exactly_the_stock_and_verifies_every_invariant() {
    let (ok, report) = demo("async");
    assert!(ok, "{report}");
    assert!(report.contains("accepted 40,"), "{report}");
    assert!(
        report.contains("[ok] Redis and database agree (reconcile)"),
        "{report}"
    );
    assert!(
        report.contains(
            "[ok] every unit given back was sold again, and every unit ends paid (database)"
        ),
        "{report}"
    );
    assert!(!report.contains("FAILED"), "{report}");
}

#[test]
fn the_sync_demo_sells_exactly_the_stock_and_verifies_every_invariant() {
    let (ok, report) = demo("sync");
    assert!(ok, "{report}");
    assert!(report.contains("accepted 40,"), "{report}");
    assert!(!report.contains("FAILED"), "{report}");
}
