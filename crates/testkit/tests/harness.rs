//! The harness itself: what later tests rely on really works.

use std::process::Command;

use testkit::{start_servers, RedisCluster, RedisServer, ServerOptions, Transport};

#[test]
fn five_independent_servers_run_at_once_and_do_not_share_data() {
    let servers = start_servers(5);
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(s.cli(&["SET", "who", &i.to_string()]), "OK");
    }
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(s.cli(&["GET", "who"]), i.to_string());
    }
}

#[test]
fn a_server_can_be_paused_killed_and_restarted_on_the_same_address() {
    let mut server = RedisServer::start_tcp();
    let url = server.url();
    server.cli(&["SET", "k", "v"]);
    server.pause();
    server.resume();
    assert_eq!(server.cli(&["GET", "k"]), "v");
    server.restart();
    assert_eq!(server.url(), url);
    assert_eq!(
        server.cli(&["GET", "k"]),
        "",
        "no persistence: data is gone"
    );
}

#[test]
fn a_password_protected_server_refuses_anonymous_clients() {
    let server = RedisServer::start_with(ServerOptions {
        transport: Transport::Tcp,
        password: Some("s3cret".into()),
        ..ServerOptions::default()
    });
    assert_eq!(server.cli(&["PING"]), "PONG");
    let port = server.port().unwrap().to_string();
    let anonymous = Command::new("redis-cli")
        .args(["-p", &port, "PING"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&anonymous.stdout).contains("NOAUTH"));
}

#[test]
fn a_replica_follows_its_primary() {
    let primary = RedisServer::start_tcp();
    let replica = RedisServer::start_replica_of(&primary);
    primary.cli(&["SET", "k", "replicated"]);
    primary.cli(&["WAIT", "1", "2000"]);
    assert_eq!(replica.cli(&["GET", "k"]), "replicated");
}

#[test]
fn a_three_node_cluster_assigns_every_slot() {
    let cluster = RedisCluster::start(3);
    let info = cluster.nodes[0].cli(&["CLUSTER", "INFO"]);
    assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    assert_eq!(cluster.urls().len(), 3);
    // Keys sharing a hash tag live in one slot, whichever node serves it.
    let slot = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", "hasp:{order-1}"]);
    assert_eq!(
        slot,
        cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", "hasp:{order-1}:fence"])
    );
}

mod faults {
    //! Faults 1: the nemeses do what they say.

    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};

    use testkit::{Direction, FaultProxy, FencedRegister, Mode, RedisServer, ServerOptions};

    fn ping(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        stream.write_all(b"PING\r\n")?;
        let mut reply = [0u8; 16];
        let n = stream.read(&mut reply)?;
        Ok(reply[..n].to_vec())
    }

    fn connect(proxy: &FaultProxy) -> TcpStream {
        let port: u16 = proxy
            .url()
            .trim_start_matches("redis://127.0.0.1:")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        stream
    }

    /// Faults 1: the proxy passes, delays, holds and closes, per
    /// direction and per connection.
    #[test]
    fn the_proxy_passes_delays_holds_and_closes() {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(&server);
        let mut stream = connect(&proxy);
        assert_eq!(ping(&mut stream).unwrap(), b"+PONG\r\n");
        assert_eq!(proxy.connections().len(), 1);

        proxy.set(Direction::ToClient, Mode::Delay(Duration::from_millis(150)));
        let started = Instant::now();
        assert_eq!(ping(&mut stream).unwrap(), b"+PONG\r\n");
        assert!(started.elapsed() >= Duration::from_millis(150));

        proxy.set(Direction::ToClient, Mode::BlackHole);
        assert!(ping(&mut stream).is_err(), "the reply is held");
        proxy.set(Direction::Both, Mode::Pass);
        let mut held = [0u8; 16];
        let n = stream.read(&mut held).unwrap();
        assert_eq!(&held[..n], b"+PONG\r\n", "held bytes go on when passing");

        // Per connection: a second one is held while the first passes.
        let mut second = connect(&proxy);
        assert_eq!(ping(&mut second).unwrap(), b"+PONG\r\n");
        let ids = proxy.connections();
        proxy.set_connection(ids[1], Direction::ToServer, Mode::BlackHole);
        assert!(ping(&mut second).is_err());
        assert_eq!(ping(&mut stream).unwrap(), b"+PONG\r\n");

        proxy.close_all();
        let mut buf = [0u8; 16];
        assert!(matches!(stream.read(&mut buf), Ok(0) | Err(_)), "closed");
        assert!(proxy.connections().is_empty());
        let mut third = connect(&proxy);
        assert_eq!(ping(&mut third).unwrap(), b"+PONG\r\n", "new ones pass");
    }

    /// Faults 1: restarts keep data with AOF `always` and lose it
    /// without; DEBUG SLEEP blocks the server.
    #[test]
    fn restarts_keep_data_with_aof_and_lose_it_without_and_debug_sleep_blocks() {
        let mut durable = RedisServer::start_with(ServerOptions::default().with_aof("always"));
        let mut volatile = RedisServer::start();
        for server in [&durable, &volatile] {
            server.cli(&["SET", "k", "v"]);
        }
        durable.restart();
        volatile.restart();
        assert_eq!(durable.cli(&["GET", "k"]), "v");
        assert_eq!(volatile.cli(&["GET", "k"]), "");

        let started = Instant::now();
        volatile.debug_sleep(0.3);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    /// Faults 2 and 9: the fenced register takes only tokens that do not
    /// go back, equal ones only from the same holder.
    #[tokio::test]
    async fn the_fenced_register_rejects_stale_tokens() {
        let register = FencedRegister::start();
        assert!(register.write("r", "a", 5).await);
        assert!(register.write("r", "a", 5).await, "same holder, same token");
        assert!(
            !register.write("r", "b", 5).await,
            "another holder, same token"
        );
        assert!(!register.write("r", "b", 4).await);
        assert!(register.write("other", "b", 4).await, "another resource");
        assert!(register.write("r", "b", 1_763_900_000_000_001).await);
        assert!(!register.write("r", "a", 5).await);
    }
}

/// The chaos run's database fault: PostgreSQL killed (SIGKILL) or stopped,
/// then started again on its data.
#[test]
fn postgres_restarts_on_its_data_after_a_crash_and_a_stop() {
    let mut pg = testkit::PostgresServer::start();
    let psql = |pg: &testkit::PostgresServer, sql: &str| {
        let url = pg.url();
        let host = url.split("host=").nth(1).unwrap().to_owned();
        let out = Command::new("psql")
            .args([
                "-h", &host, "-U", "postgres", "-d", "test", "-tA", "-c", sql,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    psql(&pg, "CREATE TABLE t (n int); INSERT INTO t VALUES (7)");
    for crash in [true, false] {
        pg.stop(crash);
        assert_eq!(psql(&pg, "SELECT n FROM t"), "", "answered while stopped");
        pg.try_restart().unwrap();
        assert_eq!(psql(&pg, "SELECT n FROM t"), "7", "crash: {crash}");
    }
}
