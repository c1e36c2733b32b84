//! Faults 1–3: the harness the scenarios stand on (the proxy's modes
//! and the register are tested in testkit's own `harness` tests).

use std::time::Duration;

use testkit::{Direction, FaultProxy, History, Mode, RedisServer};

use crate::bounded;
use crate::child::ChildProcess;

fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Faults 1 and 3: a scenario's proxy, server and client process are
/// gone when it ends, whatever state the faults left them in (paused,
/// black-holed).
#[tokio::test]
async fn a_scenario_leaves_no_process_behind() {
    bounded(Duration::from_secs(15), async {
        let history = History::default();
        let (server_pid, child_pid, dir) = {
            let server = RedisServer::start();
            let proxy = FaultProxy::start(&server);
            let mut child = ChildProcess::spawn(
                "hold",
                &[
                    ("HASP_CHILD_URL", proxy.url()),
                    ("HASP_CHILD_LOCK", "left".into()),
                ],
                &history,
            );
            child.line("HELD", Duration::from_secs(5)).await;
            proxy.set(Direction::Both, Mode::BlackHole);
            child.pause();
            server.pause();
            let url = server.url();
            let dir = url
                .trim_start_matches("redis+unix://")
                .trim_end_matches("/redis.sock")
                .to_owned();
            (server.pid().unwrap(), child.pid(), dir)
        };
        for pid in [server_pid, child_pid] {
            let gone =
                testkit::eventually(
                    Duration::from_secs(3),
                    || async move { !process_exists(pid) },
                )
                .await;
            assert!(gone, "process {pid} is still there");
        }
        assert!(!std::path::Path::new(&dir).exists(), "{dir} is still there");
    })
    .await;
}

/// Faults 2: the history and its checker, on one scenario's events:
/// holders that hand over in turn show no overlap and no duplicate token.
#[tokio::test]
async fn histories_of_holders_taking_turns_check_clean() {
    use testkit::{now_us, Event};
    bounded(Duration::from_secs(10), async {
        let ctx = crate::helpers::Ctx::new();
        let client = ctx.client().await;
        let history = History::default();
        let tasks: Vec<_> = (0..4)
            .map(|t| {
                let (lock, history) = (client.lock("turns").unwrap(), history.clone());
                tokio::spawn(async move {
                    for _ in 0..10 {
                        let guard = lock.lock().await.unwrap();
                        let holder = format!("t{t}");
                        history.push(Event::Acquired {
                            holder: holder.clone(),
                            token: guard.fencing_token(),
                            at: now_us(),
                        });
                        history.push(Event::Released {
                            holder,
                            at: now_us(),
                        });
                        guard.unlock().await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let report = history.check();
        assert_eq!(report.holds, 40);
        assert_eq!(report.overlaps, 0);
        assert_eq!(report.duplicate_tokens, 0);
    })
    .await;
}
