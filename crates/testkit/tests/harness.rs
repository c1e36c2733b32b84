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
