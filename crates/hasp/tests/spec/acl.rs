//! Least privilege (`docs/guarantees.md`, lock 37): a client logged in as a
//! user with only [`hasp::acl_rules`] locks, waits and renews (the lock
//! and family suites run as such a user on the TLS pass too); a user
//! missing a rule gets an error naming the refusal at once, never a retry
//! or a hang.

use std::time::{Duration, Instant};

use hasp::{Client, Settings};
use testkit::{RedisServer, ServerOptions};

use crate::helpers::on_cluster;

/// A server with user `app` (password `pw`) holding `rules`.
fn server_with_user(rules: &str) -> RedisServer {
    let mut args: Vec<String> = ["--user", "app", "on", ">pw"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    args.extend(rules.split(' ').map(str::to_owned));
    RedisServer::start_with(ServerOptions {
        extra_args: args,
        ..ServerOptions::default()
    })
}

/// The server's URL, logged in as `app`.
fn as_app(server: &RedisServer) -> String {
    let url = server.url();
    match url.strip_prefix("redis+unix://") {
        Some(path) => format!("redis+unix://{path}?user=app&pass=pw"),
        None => url.replacen("redis://", "redis://app:pw@", 1),
    }
}

/// Lock 37: the documented rules are enough for locks (fenced and
/// plain), waiting and renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_rules_are_enough() {
    if on_cluster() {
        return;
    }
    let server = server_with_user(&hasp::acl_rules("hasp"));
    let settings = Settings::default().set_watchdog_timeout(Duration::from_millis(300));
    let a = Client::open_with(&as_app(&server), settings.clone())
        .await
        .unwrap();
    let b = Client::open_with(&as_app(&server), settings).await.unwrap();
    let held = a.lock("acl").unwrap().lock().await.unwrap();
    let waiter = {
        let lock = b.lock("acl").unwrap();
        tokio::spawn(async move { lock.lock_within(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await; // renewed meanwhile
    assert!(!held.is_lost());
    held.unlock().await.unwrap();
    waiter.await.unwrap().unwrap().unlock().await.unwrap();
    let plain = a.plain_lock("acl").unwrap().lock().await.unwrap();
    plain.unlock().await.unwrap();
}

/// Lock 37: a user without the rights to load the function (`FUNCTION
/// LOAD`), or to call it (`FCALL`), gets an error naming the refusal
/// (`NOPERM`) at once: from `Client::open`, or from the first lock
/// operation that needs the function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_is_an_error_at_once_naming_the_refusal() {
    if on_cluster() {
        return;
    }
    let without = |rule: &str| hasp::acl_rules("hasp").replace(&format!(" {rule}"), "");
    let server = server_with_user(&without("+function|load"));
    let started = Instant::now();
    let opened = Client::open(&as_app(&server)).await;
    let error = opened.expect_err("opened without the right to load the function");
    println!(
        "figure: no FUNCTION LOAD: {error} after {:?}",
        started.elapsed()
    );
    assert!(
        error.to_string().to_lowercase().contains("noperm"),
        "{error}"
    );
    assert!(!error.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(2));

    let server = server_with_user(&without("+fcall"));
    let client = Client::open(&as_app(&server)).await.unwrap();
    let started = Instant::now();
    // Many at once: the batch goes through the function.
    let tries = (0..20).map(|i| {
        let lock = client.fair_lock(&format!("f{i}")).unwrap();
        async move { lock.lock_within(Duration::from_secs(5)).await }
    });
    for outcome in futures_util::future::join_all(tries).await {
        let error = outcome.expect_err("locked without the right to call the function");
        assert!(
            error.to_string().to_lowercase().contains("noperm"),
            "{error}"
        );
    }
    println!(
        "figure: no FCALL: 20 refusals after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}
