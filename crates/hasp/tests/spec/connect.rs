//! Client construction from Redis URLs: TCP, unix socket, password, db.

use std::time::Duration;

use hasp::{Client, Error};
use testkit::{RedisServer, ServerOptions, Transport};

use crate::helpers::lockable_within;

async fn lock_and_release(client: &Client) {
    let guard = client.lock("connect").unwrap().lock().await.unwrap();
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn tcp_and_unix_socket_urls_both_work() {
    let tcp = RedisServer::start_tcp();
    assert!(tcp.url().starts_with("redis://127.0.0.1:"));
    lock_and_release(&Client::open(&tcp.url()).await.unwrap()).await;
    let unix = RedisServer::start();
    assert!(unix.url().starts_with("redis+unix://"));
    lock_and_release(&Client::open(&unix.url()).await.unwrap()).await;
}

#[tokio::test]
async fn a_password_is_used_and_a_wrong_one_is_a_redis_error() {
    let server = RedisServer::start_with(ServerOptions {
        transport: Transport::Tcp,
        password: Some("s3cret".into()),
        ..ServerOptions::default()
    });
    lock_and_release(&Client::open(&server.url()).await.unwrap()).await;
    let port = server.port().unwrap();
    let wrong = Client::open(&format!("redis://:nope@127.0.0.1:{port}/")).await;
    assert!(matches!(wrong, Err(Error::Redis(_))), "{wrong:?}");
    let none = Client::open(&format!("redis://127.0.0.1:{port}/")).await;
    assert!(matches!(none, Err(Error::Redis(_))), "{none:?}");
}

#[tokio::test]
async fn the_db_in_the_url_holds_the_keys() {
    let server = RedisServer::start_tcp();
    let port = server.port().unwrap();
    let client = Client::open(&format!("redis://127.0.0.1:{port}/3"))
        .await
        .unwrap();
    let guard = client.lock("in-db-3").unwrap().lock().await.unwrap();
    assert_eq!(server.cli(&["-n", "3", "EXISTS", "hasp:{in-db-3}"]), "1");
    assert_eq!(server.cli(&["-n", "0", "EXISTS", "hasp:{in-db-3}"]), "0");
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn nothing_listening_is_a_redis_error_at_open() {
    let mut server = RedisServer::start_tcp();
    let url = server.url();
    server.kill();
    assert!(matches!(Client::open(&url).await, Err(Error::Redis(_))));
}

#[tokio::test]
async fn connections_the_server_closes_are_made_again() {
    let server = RedisServer::start_tcp();
    let client = Client::open(&server.url()).await.unwrap();
    lock_and_release(&client).await;
    // Every client connection of the library (commands, lock batches,
    // pub/sub) is closed by the server.
    let killed: u64 = server
        .cli(&["CLIENT", "KILL", "TYPE", "normal"])
        .parse()
        .unwrap();
    assert!(killed >= 2, "{killed} connections closed");
    let lock = client.lock("after-kill").unwrap();
    assert!(
        lockable_within(&lock, Duration::from_secs(5)).await,
        "the client did not reconnect"
    );
    lock_and_release(&client).await;
}
