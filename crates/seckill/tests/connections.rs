//! Connection-level limits. Idle and slowloris connections are
//! closed within the header timeout while purchases on other connections go
//! on; a body that does not arrive in time is a 408; past the connection cap
//! a new connection gets a 503 at once.

use seckill::testing as support;

use std::time::{Duration, Instant};

use seckill::auth::{Principal, Tokens};
use seckill::http::ConnectionLimits;
use seckill::service::Service;
use seckill::settings::Settings;
use testkit::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "connections-secret-0001";

async fn service(
    what: &str,
    limits: ConnectionLimits,
) -> (RedisServer, Service, std::path::PathBuf) {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("seckill-conn-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let database = format!("sqlite://{}/shop.db", dir.display());
    let service = Service::start(Settings {
        connections: limits,
        ..support::settings(redis.url(), database, SECRET)
    })
    .await
    .unwrap();
    (redis, service, dir)
}

/// Reads until the server closes (`true`), or `limit` passes (`false`).
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {} // an answer (such as a 408) before the close
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slowloris_connections_are_closed_while_purchases_go_on() {
    // Both ends of 2,200 connections live in this process.
    let limit = testkit::raise_open_files_limit(8_192);
    assert!(
        limit >= 5_000,
        "open-files limit {limit}: this test needs 5,000"
    );
    let header_timeout = Duration::from_secs(1);
    let (_redis, service, dir) = service(
        "slow",
        ConnectionLimits {
            header_timeout,
            // Every connection here comes from 127.0.0.1.
            max_per_address: 10_000,
            ..ConnectionLimits::default()
        },
    )
    .await;
    let addr = service.addr();
    let base = format!("http://{addr}");
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let http = reqwest::Client::new();
    let voucher = support::open_voucher(&http, &base, &tokens, "Slow sale", 1_000).await;

    let opened = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..2_000 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("POST /api/vouchers/{voucher}/seckill HTTP/1.1\r\n").as_bytes())
            .await
            .unwrap();
        slow.push(s);
    }
    // The slowloris keep trickling header lines; purchases go on meanwhile
    // on connections of their own.
    let trickle = tokio::spawn(async move {
        for _ in 0..10 {
            for s in slow.iter_mut() {
                let _ = s.write_all(b"X-Slow: 1\r\n").await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        slow
    });
    let mut worst = Duration::ZERO;
    for user in 1..=50 {
        let started = Instant::now();
        let r = support::purchase(&http, &base, &tokens, voucher, user).await;
        assert!(r.status().is_success(), "{}", r.status());
        worst = worst.max(started.elapsed());
    }
    let mut slow = trickle.await.unwrap();

    // Everything is closed within the timeout (plus slack for a loaded
    // machine), counted from when the connections were opened.
    let limit = header_timeout + Duration::from_secs(3);
    for s in idle.iter_mut().chain(slow.iter_mut()) {
        let left = limit.saturating_sub(opened.elapsed());
        assert!(
            closed_within(s, left).await,
            "a connection outlived {limit:?}"
        );
    }
    eprintln!(
        "2,200 idle/slow connections closed within {:?}; slowest purchase {worst:?}",
        opened.elapsed()
    );
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_is_a_408() {
    let (_redis, service, dir) = service(
        "body",
        ConnectionLimits {
            body_timeout: Duration::from_millis(500),
            ..ConnectionLimits::default()
        },
    )
    .await;
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let mut s = TcpStream::connect(service.addr()).await.unwrap();
    let admin = tokens.mint(Principal::Admin, Duration::from_secs(60));
    s.write_all(
        format!(
            "POST /api/vouchers HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {admin}\r\n\
             content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"title\":"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer within 5 s");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Opens a connection and sends `GET path` on it; returns it once the
/// answer's status line says 200 (the rest is left unread).
async fn answered_connection(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    s
}

/// A connection with a live event stream open on it: a request in flight
/// for as long as the connection is open (a busy connection).
async fn busy_connection(addr: std::net::SocketAddr) -> TcpStream {
    answered_connection(addr, "/api/live").await
}

/// A connection the server has accepted and answered once, idle after.
async fn idle_connection(addr: std::net::SocketAddr) -> TcpStream {
    answered_connection(addr, "/healthz").await
}

/// `docs/guarantees.md`, service 6: at the cap with every connection in
/// use, a new connection gets a 503 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_with_every_connection_busy_a_connection_gets_a_503_at_once() {
    let (_redis, service, dir) = service(
        "cap",
        ConnectionLimits {
            max_connections: 20,
            header_timeout: Duration::from_secs(1),
            ..ConnectionLimits::default()
        },
    )
    .await;
    let addr = service.addr();
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(busy_connection(addr).await);
    }
    let started = Instant::now();
    let mut extra = TcpStream::connect(addr).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), extra.read_to_end(&mut answer))
        .await
        .expect("the extra connection was not refused at once")
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        text.contains("overloaded") && text.contains("retry-after: 1"),
        "{text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    // Once the streams close, there is room again.
    drop(held);
    let http = reqwest::Client::new();
    let back = testkit::eventually(Duration::from_secs(5), || async {
        http.get(format!("http://{addr}/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    })
    .await;
    assert!(back);
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// `docs/guarantees.md`, service 6: at the cap, a new connection is served
/// and the connection idle longest is closed to make room; busy ones are
/// never closed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_longest_idle_connection_makes_room() {
    let (_redis, service, dir) = service(
        "room",
        ConnectionLimits {
            max_connections: 10,
            ..ConnectionLimits::default()
        },
    )
    .await;
    let addr = service.addr();
    let mut busy = Vec::new();
    for _ in 0..5 {
        busy.push(busy_connection(addr).await);
    }
    let mut idle = Vec::new();
    for _ in 0..5 {
        idle.push(idle_connection(addr).await);
    }
    let mut newer = Vec::new();
    for (round, oldest) in idle.iter_mut().enumerate() {
        // A new connection is served (and left open, idle: the cap stays
        // full), and the oldest idle one is closed.
        newer.push(idle_connection(addr).await);
        assert!(
            closed_within(oldest, Duration::from_secs(5)).await,
            "round {round}: the longest idle connection was not closed"
        );
    }
    // The connections opened since are idle too, and the next to go.
    let _ = idle_connection(addr).await;
    assert!(closed_within(&mut newer[0], Duration::from_secs(5)).await);
    for s in busy.iter_mut() {
        assert!(
            !closed_within(s, Duration::from_millis(100)).await,
            "a busy connection was closed"
        );
    }
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// `docs/guarantees.md`, service 6: twelve addresses keeping their whole
/// per-address share of idle connections open, reopening each one the
/// server closes, fill the cap; connections from another address are
/// still served (idle connections make room for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_addresses_reopening_idle_connections_cannot_keep_others_out() {
    const ADDRESSES: u8 = 12;
    const SHARE: usize = 10;
    let (_redis, service, dir) = service(
        "flood",
        ConnectionLimits {
            max_connections: ADDRESSES as usize * SHARE,
            max_per_address: SHARE,
            ..ConnectionLimits::default()
        },
    )
    .await;
    let addr = service.addr();
    let connect_from = move |ip: std::net::IpAddr| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(std::net::SocketAddr::new(ip, 0)).unwrap();
        socket.connect(addr).await
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Each flooding connection: open, hold idle until the server closes
    // it, open again.
    let flood: Vec<_> = (1..=ADDRESSES)
        .flat_map(|a| (0..SHARE).map(move |_| a))
        .map(|a| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let ip = std::net::IpAddr::from([127, 0, 1, a]);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = connect_from(ip).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = closed_within(&mut s, Duration::from_millis(500)).await;
                }
            })
        })
        .collect();
    // Let the flood fill the cap.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut served = 0;
    let mut refused = Vec::new();
    for _ in 0..50 {
        let Ok(mut s) = connect_from("127.0.0.200".parse().unwrap()).await else {
            continue;
        };
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut answer)).await;
        if answer.starts_with("HTTP/1.1 200") {
            served += 1;
        } else {
            refused.push(answer.lines().next().unwrap_or_default().to_owned());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flood {
        f.await.unwrap();
    }
    println!("figure: flood of 12 addresses x {SHARE}: {served} of 50 probes served");
    assert_eq!(served, 50, "probes refused: {refused:?}");
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// One client address cannot take the whole connection cap: past its share
/// its new connections get the 503 at once, while another address is
/// served; its share comes back as its connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_fill_the_connection_cap() {
    let (_redis, service, dir) = service(
        "per-address",
        ConnectionLimits {
            max_connections: 100,
            max_per_address: 20,
            ..ConnectionLimits::default()
        },
    )
    .await;
    let addr = service.addr();
    let hog: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let other: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let connect_from = |ip: std::net::IpAddr| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(std::net::SocketAddr::new(ip, 0)).unwrap();
        socket.connect(addr).await.unwrap()
    };
    // Idle connections the server has accepted: each answers a request.
    let mut held = Vec::new();
    for _ in 0..20 {
        let mut s = connect_from(hog).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"HTTP/1.1 200");
        held.push(s);
    }
    let answer_to = |ip| async move {
        let mut s = connect_from(ip).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer).await;
        answer
    };
    let refused = answer_to(hog).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("\"code\":\"overloaded\""), "{refused}");
    let served = answer_to(other).await;
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    drop(held);
    let back = testkit::eventually(Duration::from_secs(10), || async {
        answer_to(hog).await.starts_with("HTTP/1.1 200")
    })
    .await;
    assert!(back, "the address's share never came back");
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// A request with both `Content-Length` and `Transfer-Encoding` (how
/// requests are smuggled past a proxy that reads the other header) is a
/// 400 naming the header, and its connection is closed: whatever was
/// smuggled behind it is never served. In either order of the headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_beside_transfer_encoding_is_a_400_and_closes() {
    let (_redis, service, dir) = service("smuggle", ConnectionLimits::default()).await;
    let heads = [
        "content-length: 4\r\ntransfer-encoding: chunked\r\n",
        "transfer-encoding: chunked\r\ncontent-length: 4\r\n",
    ];
    for head in heads {
        let mut s = TcpStream::connect(service.addr()).await.unwrap();
        let request = format!(
            "POST /api/vouchers HTTP/1.1\r\nhost: x\r\n{head}\r\n0\r\n\r\n\
             GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
        );
        s.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer))
            .await
            .expect("the connection was not closed")
            .unwrap();
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 400"), "{head:?}: {text}");
        assert!(
            text.contains("\"field\":\"transfer-encoding\""),
            "{head:?}: {text}"
        );
        assert_eq!(
            text.matches("HTTP/1.1").count(),
            1,
            "{head:?}: the smuggled request was answered: {text}"
        );
    }
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
