//! Faults 8 and 9: fencing tokens never go back, and a fenced
//! resource rejects a stale holder.

use std::time::Duration;

use hasp::Client;
use testkit::{FaultProxy, FencedRegister, RedisServer};

use crate::bounded;
use crate::helpers::*;

async fn take_and_release(lock: &hasp::Lock, times: usize) -> Vec<u64> {
    let mut tokens = Vec::new();
    for _ in 0..times {
        let guard = lock.lock().await.unwrap();
        tokens.push(guard.fencing_token());
        guard.unlock().await.unwrap();
    }
    tokens
}

/// Faults 8 (and 12): a lock taken and released three times, then held;
/// Redis restarted without persistence; the next token for the name is
/// greater than all four (it was 1 before: tokens 1–4 were issued twice).
#[tokio::test]
async fn tokens_never_go_back_when_redis_loses_its_data() {
    bounded(Duration::from_secs(10), async {
        let mut ctx = Ctx::new();
        let first = ctx.client().await;
        let lock = first.lock("fenced").unwrap();
        let mut earlier = take_and_release(&lock, 3).await;
        let held = lock.lock().await.unwrap();
        earlier.push(held.fencing_token());
        assert!(earlier.windows(2).all(|w| w[0] < w[1]), "{earlier:?}");
        ctx.server_mut().restart();
        let second = ctx.client().await;
        let again = second.lock("fenced").unwrap().lock().await.unwrap();
        let max = *earlier.iter().max().unwrap();
        println!(
            "figure: tokens before the restart {earlier:?}, after {}",
            again.fencing_token()
        );
        assert!(
            again.fencing_token() > max,
            "{} after {earlier:?}",
            again.fencing_token()
        );
        again.unlock().await.unwrap();
    })
    .await;
}

/// Faults 8: after a failover to a replica that missed the last
/// increments of the counter, tokens still do not go back (the failover
/// taking 100 ms or more, as `lock.lua` documents).
#[tokio::test]
async fn tokens_never_go_back_after_a_failover_to_a_lagging_replica() {
    bounded(Duration::from_secs(20), async {
        let mut master = RedisServer::start_tcp();
        let replica = RedisServer::start_replica_of(&master);
        let proxy = FaultProxy::start(&master);
        let client = Client::open(&proxy.url()).await.unwrap();
        let lock = client.lock("failover").unwrap();
        let mut issued = take_and_release(&lock, 2).await;
        let fence = format!("{}:fence", lock_key("failover"));
        let replicated = testkit::eventually(Duration::from_secs(5), || {
            let (m, r) = (master.cli(&["GET", &fence]), replica.cli(&["GET", &fence]));
            async move { m == r }
        })
        .await;
        assert!(replicated);
        // The replica stops following; the master goes on alone.
        replica.pause();
        issued.extend(take_and_release(&lock, 2).await);
        master.kill();
        // The documented assumption: a failover takes 100 ms or more
        // (Sentinel and Cluster take seconds).
        tokio::time::sleep(Duration::from_millis(100)).await;
        replica.resume();
        replica.cli(&["REPLICAOF", "NO", "ONE"]);
        proxy.set_upstream(&replica);
        proxy.close_all();
        assert!(
            lockable_within(&lock, Duration::from_secs(5)).await,
            "the client never reached the promoted replica"
        );
        let next = lock.lock().await.unwrap();
        let max = *issued.iter().max().unwrap();
        assert!(
            next.fencing_token() > max,
            "{} after {issued:?}",
            next.fencing_token()
        );
        next.unlock().await.unwrap();
    })
    .await;
}

/// Faults 9 (and 11): a holder frozen past its lease resumes and
/// writes with its old token; the register, which has seen the next
/// holder's token, rejects it.
#[tokio::test]
async fn a_fenced_register_rejects_the_write_of_a_holder_that_was_frozen() {
    use crate::child::ChildProcess;
    use testkit::{now_us, Event, History};
    bounded(Duration::from_secs(20), async {
        let ctx = Ctx::new();
        let register = FencedRegister::start();
        let history = History::default();
        let mut child = ChildProcess::spawn(
            "careless",
            &[
                ("HASP_CHILD_URL", ctx.server().url()),
                ("HASP_CHILD_LOCK", "frozen".into()),
                ("HASP_CHILD_WATCHDOG_MS", "600".into()),
                ("HASP_CHILD_REGISTER", register.url()),
            ],
            &history,
        );
        let held: u64 = child.line("HELD", Duration::from_secs(5)).await[5..]
            .parse()
            .unwrap();
        child.pause(); // inside its 300 ms sleep, before its write
        let paused = std::time::Instant::now();
        let other = ctx.client().await.lock("frozen").unwrap();
        let guard = other.lock_within(Duration::from_secs(5)).await.unwrap();
        let took_over = paused.elapsed();
        println!("figure: holder frozen (watchdog 600 ms): taken over after {took_over:?}");
        assert!(
            took_over <= Duration::from_millis(600 + 400),
            "{took_over:?}"
        );
        assert!(guard.fencing_token() > held);
        history.push(Event::Acquired {
            holder: "parent".into(),
            token: guard.fencing_token(),
            at: now_us(),
        });
        let accepted = register
            .write("frozen", "parent", guard.fencing_token())
            .await;
        history.push(Event::Wrote {
            holder: "parent".into(),
            token: guard.fencing_token(),
            accepted,
            at: now_us(),
        });
        assert!(accepted);
        child.resume();
        let done = child.line("DONE", Duration::from_secs(5)).await;
        assert_eq!(done, "DONE lost=true", "the resumed holder learns the loss");
        guard.unlock().await.unwrap();
        let report = history.check();
        assert_eq!(report.writes_rejected, 1, "{report:?}");
        assert_eq!(report.stale_writes_accepted, 0, "{report:?}");
        assert_eq!(report.duplicate_tokens, 0, "{report:?}");
        assert_eq!(report.overlaps, 0, "belief ends before expiry: {report:?}");
    })
    .await;
}
