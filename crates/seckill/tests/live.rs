//! The live figures' streams (`docs/guarantees.md`, service 15): many
//! watchers share one read of the stores per tick, and the streams end when
//! the service stops.

use seckill::testing as support;

use std::time::Duration;

use seckill::auth::Tokens;
use seckill::service::Service;
use testkit::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "live-test-secret-00001";

async fn service(what: &str, redis: &RedisServer) -> (Service, std::path::PathBuf) {
    support::start_on_sqlite(&format!("live-{what}"), redis, SECRET).await
}

/// A watcher: the request sent, and its first event read.
async fn watcher(addr: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /api/live HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    while !seen.windows(7).any(|w| w == b"figures") {
        let n = stream.read(&mut buffer).await.unwrap();
        assert!(n > 0, "the stream ended before its first event");
        seen.extend_from_slice(&buffer[..n]);
    }
    assert!(seen.starts_with(b"HTTP/1.1 200"));
    stream
}

fn commands(redis: &RedisServer) -> u64 {
    redis
        .cli(&["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("INFO stats")
}

/// Redis commands over `window` with the watchers already open.
async fn commands_over(redis: &RedisServer, window: Duration) -> u64 {
    let before = commands(redis);
    tokio::time::sleep(window).await;
    commands(redis) - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_watchers_cost_the_stores_what_one_does() {
    let redis = RedisServer::start();
    let (service, dir) = service("share", &redis).await;
    let http = reqwest::Client::new();
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let base = format!("http://{}", service.addr());
    support::open_voucher(&http, &base, &tokens, "Watched", 10).await;

    // Time is the subject here: the same window with 1 and with 100
    // watchers, each long enough for several ticks on a slow machine.
    let window = Duration::from_secs(2);
    let one = watcher(service.addr()).await;
    let with_one = commands_over(&redis, window).await;
    let mut many = vec![one];
    for _ in 1..100 {
        many.push(watcher(service.addr()).await);
    }
    let with_hundred = commands_over(&redis, window).await;
    assert!(with_one > 0, "one watcher's figures are read from Redis");
    assert!(
        with_hundred <= 2 * with_one + 20,
        "Redis commands in {window:?}: {with_one} with one watcher, {with_hundred} with 100"
    );
    drop(many);
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Service 15: sales whose stock can no longer change (ended, and past
/// their last give-back) cost no Redis read per tick: twenty of them
/// beside an open one cost what the open one costs alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_sales_cost_no_read_per_tick() {
    let redis = RedisServer::start();
    let (service, dir) = service("ended", &redis).await;
    let http = reqwest::Client::new();
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let base = format!("http://{}", service.addr());
    support::open_voucher(&http, &base, &tokens, "Open", 10).await;
    let window = Duration::from_secs(2);
    let page = watcher(service.addr()).await;
    let open_only = commands_over(&redis, window).await;
    // Ended a day ago: well past the end plus the payment window.
    let day = 24 * 3_600_000;
    let now = support::now_ms();
    for n in 0..20 {
        let title = format!("Ended {n}");
        support::create_voucher(&http, &base, &tokens, &title, 5, now - 2 * day..now - day).await;
    }
    // The first tick that sees them reads each once; then they are final.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let with_ended = commands_over(&redis, window).await;
    println!("figure: Redis commands in {window:?}: {open_only} with one open sale, {with_ended} with 20 ended beside it");
    assert!(
        with_ended <= open_only + open_only / 2 + 10,
        "Redis commands in {window:?}: {open_only} with one open sale, {with_ended} with 20 ended sales beside it"
    );
    drop(page);
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_end_when_the_service_stops() {
    let redis = RedisServer::start();
    let (service, dir) = service("stop", &redis).await;
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(watcher(service.addr()).await);
    }
    // A graceful stop waits for responses in flight: the streams must end
    // for it to finish at all.
    tokio::time::timeout(Duration::from_secs(60), service.stop())
        .await
        .expect("the service stops with streams open")
        .unwrap();
    for mut stream in streams {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut rest));
        assert!(read.await.expect("the stream ends").is_ok());
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Room 11: a waiting room's line on the live figures costs Redis the
/// same with 10 people waiting and with 10,000, and with one page open
/// and with a thousand: a page works out its place from the line's
/// figures, read once per tick for everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rooms_line_costs_the_same_with_ten_or_ten_thousand_waiting() {
    let redis = RedisServer::start();
    let (service, dir) = service("room", &redis).await;
    let http = reqwest::Client::new();
    let tokens = Tokens::new(SECRET.as_bytes()).unwrap();
    let base = format!("http://{}", service.addr());
    let begin = support::now_ms() - 1_000;
    // One person a second: nearly everyone waits throughout.
    let voucher = support::create_voucher_from(
        &http,
        &base,
        &tokens,
        serde_json::json!({"title": "Queued", "stock": 100_000, "begin_ms": begin,
            "end_ms": begin + 3_600_000, "waiting_room": {"admit_per_s": 1}}),
    )
    .await;
    let conn = seckill::store::connect(&redis.url()).await.unwrap();
    let lines = seckill::store::RoomLines::new(seckill::store::Redis::new(conn, "seckill"));
    let join = |users: std::ops::Range<i64>| {
        let lines = &lines;
        futures_util::future::try_join_all(users.map(move |u| lines.join(voucher, u, 0, begin)))
    };
    join(0..10).await.unwrap();
    // Measured once the instance admits (it reads the open rooms each
    // second): the draw made, someone admitted.
    let admitting = testkit::eventually(Duration::from_secs(30), || async {
        let line = lines.lines(&[voucher]).await.unwrap()[0];
        line.drawn && line.admitted_through >= 1
    })
    .await;
    assert!(admitting, "the room never admitted");
    let window = Duration::from_secs(2);
    let page = watcher(service.addr()).await;
    let few = commands_over(&redis, window).await;
    join(10..10_000).await.unwrap();
    let crowd = commands_over(&redis, window).await;
    let mut pages = vec![page];
    for _ in 1..1_000 {
        pages.push(watcher(service.addr()).await);
    }
    let watched = commands_over(&redis, window).await;
    println!(
        "figure: Redis commands in {window:?} with a room: {few} with 10 waiting and one page, {crowd} with 10,000 waiting, {watched} with 10,000 waiting and 1,000 pages"
    );
    assert!(
        crowd <= 2 * few + 20 && watched <= 2 * few + 20,
        "Redis commands in {window:?}: {few}, {crowd}, {watched}"
    );
    drop(pages);
    service.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
