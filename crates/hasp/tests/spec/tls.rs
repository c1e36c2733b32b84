//! TLS (`docs/guarantees.md`, lock 35 and 36): a client of a `rediss://`
//! server locks, waits, renews and fences over TLS on every connection,
//! presents a client certificate where the server asks for one, verifies
//! a server by the name the settings give where its address is not on its
//! certificate, and a
//! connection that cannot be made safely fails at once with its cause.

use std::time::{Duration, Instant};

use hasp::{Client, Error, Settings, Tls};
use testkit::{RedisServer, ServerOptions, TestCa, Transport};

use crate::helpers::on_cluster;

/// A private CA in a directory of its own, removed when dropped.
struct Ca {
    ca: TestCa,
    dir: std::path::PathBuf,
}

impl Ca {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hasp-tls-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self {
            ca: TestCa::create(&dir).expect("a test CA"),
            dir,
        }
    }

    /// A TLS server with this CA's server certificate.
    fn server(&self, client_certs: bool) -> RedisServer {
        Self::serving(self.ca.server_options(client_certs))
    }

    /// A server that speaks TLS only, as `tls` says.
    fn serving(tls: testkit::TlsOptions) -> RedisServer {
        RedisServer::start_with(ServerOptions {
            transport: Transport::Tcp,
            tls: Some(tls),
            ..ServerOptions::default()
        })
    }

    fn trust(&self) -> Tls {
        Tls::new().with_ca_file(self.ca.ca_file()).unwrap()
    }
}

impl Drop for Ca {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn settings(tls: Tls) -> Settings {
    Settings::default()
        .set_tls(tls)
        .set_connection_timeout(Duration::from_secs(2))
}

/// Lock 35: over TLS (batching lanes, pub/sub and queries alike), a lock
/// and a plain lock are taken and released, a waiter is woken by the
/// release, a hold outlives its watchdog timeout by renewals, and tokens
/// rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_locks_wait_renew_and_fence_as_on_plain_tcp() {
    if on_cluster() {
        return; // one server's TLS; the cluster pass runs the rest
    }
    let ca = Ca::new("tour");
    let server = ca.server(false);
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    let settings = settings(ca.trust()).set_watchdog_timeout(Duration::from_millis(300));
    let a = Client::open_with(&server.url(), settings.clone())
        .await
        .unwrap();
    let b = Client::open_with(&server.url(), settings).await.unwrap();

    let first = a.lock("tls:a").unwrap().lock().await.unwrap();
    let waiter = {
        let lock = b.lock("tls:a").unwrap();
        tokio::spawn(async move { lock.lock_within(Duration::from_secs(10)).await })
    };
    // Held past three watchdog timeouts: renewed, not lost.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(!first.is_lost(), "the hold was not renewed over TLS");
    let token = first.fencing_token();
    first.unlock().await.unwrap();
    let second = waiter.await.unwrap().expect("the waiter got the lock");
    assert!(second.fencing_token() > token);
    second.unlock().await.unwrap();

    let plain = a.plain_lock("tls:plain").unwrap();
    let guard = plain.lock().await.unwrap();
    assert!(plain.try_lock().await.unwrap().is_none() || plain.is_held_by_me().await.unwrap());
    guard.unlock().await.unwrap();
    assert!(!plain.is_locked().await.unwrap());
}

/// Lock 35: a server that asks for client certificates (`tls-auth-clients
/// yes`) takes a client that presents one of its CA, and refuses one that
/// presents none, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_where_the_server_asks() {
    if on_cluster() {
        return;
    }
    let ca = Ca::new("mutual");
    let server = ca.server(true);
    let identity = ca
        .trust()
        .with_identity_files(ca.ca.client_cert_file(), ca.ca.client_key_file())
        .unwrap();
    let client = Client::open_with(&server.url(), settings(identity))
        .await
        .unwrap();
    client
        .lock("mutual")
        .unwrap()
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();

    let started = Instant::now();
    let refused = Client::open_with(&server.url(), settings(ca.trust())).await;
    let error = refused.expect_err("no client certificate, and yet connected");
    println!(
        "figure: no client certificate: {error} after {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Lock 35: a server whose certificate names neither its address nor
/// `localhost` (only `redis.named.test`) is verified by the server name the
/// settings give, on every connection: locks, a waiter woken by a release
/// (pub/sub), queries, and hasp's `Connection` for an application's own
/// commands. Without that name, or with another, the connection is
/// refused; a cluster client refuses the setting before connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_is_verified_by_the_name_the_settings_give() {
    if on_cluster() {
        return;
    }
    let ca = Ca::new("named");
    let server = Ca::serving(
        ca.ca
            .issue_server_options("named", &["redis.named.test"], false)
            .unwrap(),
    );
    let named = ca.trust().with_server_name("redis.named.test").unwrap();
    let a = Client::open_with(&server.url(), settings(named.clone()))
        .await
        .unwrap();
    let b = Client::open_with(&server.url(), settings(named.clone()))
        .await
        .unwrap();
    let held = a.lock("named").unwrap().lock().await.unwrap();
    let waiter = {
        let lock = b.lock("named").unwrap();
        tokio::spawn(async move { lock.lock_within(Duration::from_secs(10)).await })
    };
    assert!(b.lock("named").unwrap().is_locked().await.unwrap());
    held.unlock().await.unwrap();
    let woken = waiter.await.unwrap().expect("the waiter got the lock");
    woken.unlock().await.unwrap();

    let mut own = hasp::Connection::open(&server.url(), Some(&named))
        .await
        .unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut own).await.unwrap();
    assert_eq!(pong, "PONG");

    for (what, tls) in [
        ("no server name", ca.trust()),
        (
            "another server name",
            ca.trust().with_server_name("redis.other.test").unwrap(),
        ),
    ] {
        let (error, _) = failure(&server.url(), settings(tls)).await;
        assert!(error.contains("not valid for name"), "{what}: {error}");
    }
    match Client::open_cluster(&[&server.url()], settings(named)).await {
        Err(Error::InvalidArgument { argument, .. }) => assert_eq!(argument, "server_name"),
        other => panic!("a cluster client took a server name: {other:?}"),
    }
}

/// How opening `url` with `settings` fails: the error's text and how long
/// it took (it must fail; a hang is cut at 10 s).
async fn failure(url: &str, settings: Settings) -> (String, Duration) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), Client::open_with(url, settings))
        .await
        .expect("opening hung");
    let took = started.elapsed();
    let error = match outcome {
        Ok(_) => panic!("{url}: connected where it must not"),
        Err(e) => e,
    };
    assert!(
        matches!(error, Error::Redis(_) | Error::InvalidArgument { .. }),
        "{error:?}"
    );
    (error.to_string(), took)
}

/// Lock 36: each way a TLS connection cannot be made is an error naming
/// its cause, never a hang and never retried behind the caller's back: a
/// plain client at a TLS port, a certificate of another CA, one for
/// another host, and one that expired, each well within the connection
/// timeout (2 s here); a TLS client at a plain port, at the timeout (such
/// a server never answers a TLS hello: silence is all there is to go by).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_cannot_be_made_safely_fails_at_once_naming_why() {
    if on_cluster() {
        return;
    }
    let ca = Ca::new("failures");
    let tls = ca.server(false);
    let port = tls.port().unwrap();
    let plain = RedisServer::start_tcp();
    let other = ca.ca.another().unwrap();
    let wrong_ca = Ca::serving(other.server_options(false));
    let wrong_host = Ca::serving(
        ca.ca
            .issue_server_options("elsewhere", &["db.elsewhere.test"], false)
            .unwrap(),
    );
    let expired = Ca::serving(
        ca.ca
            .issue_server_options("expired", &["127.0.0.1"], true)
            .unwrap(),
    );
    let timeout = Duration::from_secs(2);
    let at_once = timeout;
    let at_the_timeout = timeout + Duration::from_secs(1);
    let cases = [
        (
            "plain client, TLS port",
            format!("redis://127.0.0.1:{port}/"),
            vec!["TLS", "rediss"],
            at_once,
        ),
        (
            "TLS client, plain port",
            plain.url().replace("redis://", "rediss://"),
            vec!["TLS", "handshake"],
            at_the_timeout,
        ),
        (
            "certificate of another CA",
            wrong_ca.url(),
            vec!["UnknownIssuer"],
            at_once,
        ),
        (
            "certificate for another host",
            wrong_host.url(),
            vec!["not valid for name"],
            at_once,
        ),
        (
            "expired certificate",
            expired.url(),
            vec!["xpired"],
            at_once,
        ),
    ];
    for (what, url, causes, within) in cases {
        let (error, took) = failure(&url, settings(ca.trust())).await;
        println!("figure: {what}: {error} after {took:?}");
        assert!(
            causes.iter().all(|c| error.contains(c)),
            "{what}: {error:?} does not name {causes:?}"
        );
        assert!(took < within, "{what}: after {took:?}");
    }
}

/// Faults over TLS (lock 35; faults 5, 12 and 14): after the server
/// restarts without its data the holder learns of the loss at the
/// reconnect and a new token is greater; a holder cut off (a proxy that
/// passes the encrypted bytes, then holds them) learns of the loss at its
/// belief end, before the key can expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_restart_and_a_partition_are_learnt_as_on_plain_tcp() {
    if on_cluster() {
        return;
    }
    let ca = Ca::new("faults");
    let mut server = ca.server(false);
    let client = Client::open_with(&server.url(), settings(ca.trust()))
        .await
        .unwrap();
    let held = client.lock("tls:restart").unwrap().lock().await.unwrap();
    server.restart();
    let restarted = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("the holder never learnt of the loss");
    println!(
        "figure: TLS, restart: holder told {:?} after",
        restarted.elapsed()
    );
    let again = client.lock("tls:restart").unwrap().lock().await.unwrap();
    assert!(again.fencing_token() > held.fencing_token());
    again.unlock().await.unwrap();

    let proxy = testkit::FaultProxy::start(&server);
    assert!(proxy.url().starts_with("rediss://"), "{}", proxy.url());
    let lease = Duration::from_millis(800);
    let cut_off = Client::open_with(
        &proxy.url(),
        settings(ca.trust()).set_response_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let guard = cut_off
        .lock("tls:partition")
        .unwrap()
        .with_lease(lease)
        .unwrap()
        .lock()
        .await
        .unwrap();
    let until = guard.valid_until();
    let cut = Instant::now();
    proxy.set(testkit::Direction::Both, testkit::Mode::BlackHole);
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the cut-off holder never learnt of the loss");
    println!(
        "figure: TLS, partition: holder told {:?} after the cut, lease {lease:?}",
        cut.elapsed()
    );
    assert!(guard.is_lost());
    assert!(Instant::now() >= until, "told before its belief end");
}
