//! `seckill-tools chaos` end to end: a private deployment (two
//! instances, Redis with AOF, PostgreSQL) under load while an instance is
//! killed, Redis and PostgreSQL are restarted and Redis is paused, and
//! while buyers pay, cancel and let orders expire; nothing may be lost,
//! duplicated, oversold or taken back twice, and no 5xx but 503 answered;
//! then a waiting room through the same faults.
//! Once on plain connections, once with Redis and PostgreSQL over TLS.

use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_loses_duplicates_and_oversells_nothing() {
    short_chaos_run(&[]).await;
}

/// The same with Redis and PostgreSQL speaking TLS only: the instances'
/// connections, broken by every restart, are made again over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_over_tls_loses_duplicates_and_oversells_nothing() {
    short_chaos_run(&["--tls"]).await;
}

/// A 24 s chaos run (`extra` added to its options), then its report's
/// figures checked phase by phase.
async fn short_chaos_run(extra: &[&str]) {
    let out = std::env::temp_dir().join(format!(
        "seckill-chaos-test-{}{}",
        std::process::id(),
        extra.concat()
    ));
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckill-tools"))
        .args(["chaos", "--duration", "24s", "--rate", "200", "--out"])
        .arg(&out)
        .args(extra)
        .output()
        .await
        .unwrap();
    let log = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{log}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("chaos-report.json")).unwrap()).unwrap();
    // The run's own log says what each phase saw (the after-sale's
    // rounds, what was unexpected), which the report's figures do not.
    assert_eq!(report["clean"], true, "{report}\n{log}");
    let phases = report["phases"].as_array().unwrap();
    let faults: Vec<&str> = phases
        .iter()
        .map(|p| p["fault"].as_str().unwrap())
        .collect();
    assert_eq!(
        faults,
        [
            "none",
            "kill-instance",
            "restart-redis",
            "restart-database",
            "pause-redis",
            "order-life"
        ]
    );
    for phase in phases {
        for must_be_zero in [
            "lost",
            "duplicated",
            "oversold",
            "other_5xx",
            "returned_twice",
        ] {
            assert_eq!(phase[must_be_zero], 0, "{must_be_zero} in {phase}");
        }
        let (accepted, stored, unknown_stored) = (
            phase["accepted"].as_u64().unwrap(),
            phase["stored"].as_u64().unwrap(),
            phase["unknown_stored"].as_u64().unwrap(),
        );
        assert!(accepted > 0, "{phase}");
        assert_eq!(stored, accepted + unknown_stored, "{phase}");
    }
    // The killed instance really was gone for a while.
    assert!(phases[1]["not_sent"].as_u64().unwrap() > 0, "{}", phases[1]);
    // Service 10 under faults: orders were given back while an instance
    // died and Redis and the database restarted, each unit once.
    assert!(
        phases[5]["given_back"].as_u64().unwrap() > 0,
        "{}",
        phases[5]
    );
    // Room 12: the waiting room through an instance killed and Redis
    // restarted: no place lost, no purchase without a pass, and the line
    // sold with passes.
    let room = &report["waiting_room"];
    println!("waiting room: {room}");
    assert_eq!(room["ticketed"], 200, "{room}");
    assert_eq!(room["lost_places"], 0, "{room}");
    assert_eq!(room["passless_accepted"], 0, "{room}");
    assert!(room["passless_sent"].as_u64().unwrap() >= 200, "{room}");
    assert!(room["bought"].as_u64().unwrap() > 0, "{room}");
    let _ = std::fs::remove_dir_all(out);
}
