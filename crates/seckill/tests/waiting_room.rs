//! The waiting room (`docs/guarantees.md`, room 1-7; room 8 is in
//! `pages.rs`): the draw at the opening is uniform and the line after it
//! keeps arrival order, admission follows the rate and the cap, a purchase
//! in a sale with a room needs its buyer's own valid pass, and the line
//! outlives instances and Redis restarts with its data. Against a real
//! redis-server and the service.

use seckill::testing as support;

use std::time::Duration;

use reqwest::StatusCode;
use seckill::auth::{Principal, Tokens};
use seckill::domain::waiting_room::{Pass, PassKey, Place, RoomSettings};
use seckill::store::{connect, Draw, Redis, RoomLines};
use serde_json::{json, Value};
use statrs::distribution::{ChiSquared, ContinuousCDF};
use testkit::{RedisServer, ServerOptions};

const SECRET: &str = "waiting-room-test-secret";

/// A p-value under which an order is taken for not uniform: one in a
/// million, so that a fair draw fails the test once in a million runs
/// while any bias the draw could have (none, the arrival order reversed,
/// one place favoured) lands far below it with these sample sizes.
const NOT_UNIFORM: f64 = 1e-6;

async fn lines(redis: &RedisServer) -> RoomLines {
    let conn = connect(&redis.url()).await.unwrap();
    RoomLines::new(Redis::new(conn, "room-test"))
}

/// Puts `units` of voucher `voucher` on sale as far as admission looks
/// (the stock in its hash).
fn on_sale(redis: &RedisServer, voucher: i64, units: i64) {
    let key = seckill::store::VoucherKeys::new("room-test", voucher).voucher;
    redis.cli(&["HSET", &key, "stock", &units.to_string()]);
}

/// Waits until Redis' clock (the one the line is judged by) passes
/// `at_ms`: time is the subject here.
async fn until(at_ms: i64) {
    let wait = at_ms + 50 - support::now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

/// The p-value of a chi-square statistic over cells that all expect
/// `expected`, with `df` degrees of freedom.
fn p_value(observed: &[u64], expected: f64, df: f64) -> f64 {
    let statistic: f64 = observed
        .iter()
        .map(|&o| (o as f64 - expected).powi(2) / expected)
        .sum();
    1.0 - ChiSquared::new(df).unwrap().cdf(statistic)
}

/// Room 1: everyone who joins before the opening gets a place drawn
/// uniformly at random: over 600 draws of 8 people, how often each person
/// drew each place passes a chi-square test (8 × 8 cells, 49 degrees of
/// freedom); and over one draw of 10,000 people, where they arrived (in
/// tenths) does not tell where they were drawn (10 × 10 cells, 81).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_draw_at_the_opening_is_uniform() {
    let redis = RedisServer::start();
    let lines = lines(&redis).await;
    const DRAWS: i64 = 600;
    const PEOPLE: i64 = 8;
    // Everyone joins before the start: the joins are told the sale starts
    // in an hour, and the draws are made as if it had started (the draw
    // takes the start it is for), so no join can come late however slow
    // the machine. The small rooms, then a crowd of 10,000 in the order of
    // their ids.
    const CROWD: i64 = 10_000;
    let later = support::now_ms() + 3_600_000;
    let joins = (0..DRAWS)
        .flat_map(|room| (0..PEOPLE).map(move |user| (room, user)))
        .chain((0..CROWD).map(|user| (DRAWS, user)));
    let places: Vec<Place> = futures_util::future::try_join_all(
        joins.map(|(room, user)| lines.join(room, user, 0, later)),
    )
    .await
    .unwrap();
    assert!(places.iter().all(|p| *p == Place::AwaitingDraw));
    let begin = support::now_ms() - 1_000;
    let mut places = vec![0u64; (PEOPLE * PEOPLE) as usize];
    for room in 0..DRAWS {
        assert!(matches!(
            lines.draw(room, begin).await.unwrap(),
            Draw::Drawn(8)
        ));
        for user in 0..PEOPLE {
            let Place::Ticket(t) = lines.standing(room, user).await.unwrap().place else {
                panic!("person {user} of room {room} has no ticket");
            };
            places[(user * PEOPLE + t as i64 - 1) as usize] += 1;
        }
    }
    let small = p_value(&places, (DRAWS / PEOPLE) as f64, 49.0);
    assert!(lines.draw(DRAWS, begin).await.unwrap() == Draw::Drawn(CROWD as usize));
    let mut cells = vec![0u64; 100];
    for user in 0..CROWD {
        let Place::Ticket(t) = lines.standing(DRAWS, user).await.unwrap().place else {
            panic!("person {user} has no ticket");
        };
        cells[(user * 10 / CROWD * 10 + (t as i64 - 1) * 10 / CROWD) as usize] += 1;
    }
    let crowd = p_value(&cells, (CROWD / 100) as f64, 81.0);
    println!("draw uniformity: p = {small:.3} (600 draws of 8), p = {crowd:.3} (one of 10,000)");
    assert!(
        small > NOT_UNIFORM,
        "places by person: {places:?}, p = {small}"
    );
    assert!(
        crowd > NOT_UNIFORM,
        "arrival tenth × place tenth: {cells:?}, p = {crowd}"
    );
}

/// Room 2: after the opening people queue in arrival order exactly (those
/// who came between the start and the draw too), each joins once (a second
/// join, from another tab, answers the same place), and joining before the
/// room opens records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_opening_the_line_keeps_arrival_order() {
    let redis = RedisServer::start();
    let lines = lines(&redis).await;
    let begin = support::now_ms() + 1_000;
    assert_eq!(
        lines.join(1, 99, begin - 10, begin).await.unwrap(),
        Place::NotOpen {
            opens_ms: begin - 10
        }
    );
    assert_eq!(lines.standing(1, 99).await.unwrap().place, Place::Outside);
    for early in 1..=3 {
        lines.join(1, early, 0, begin).await.unwrap();
    }
    until(begin).await;
    // Past the start, before the draw: behind the drawn, in order.
    for late in [10, 11] {
        assert_eq!(
            lines.join(1, late, 0, begin).await.unwrap(),
            Place::AwaitingDraw
        );
    }
    assert_eq!(lines.draw(1, begin).await.unwrap(), Draw::Drawn(3));
    assert_eq!(lines.draw(1, begin).await.unwrap(), Draw::Already);
    for (user, ticket) in [(20, 6), (21, 7), (22, 8)] {
        assert_eq!(
            lines.join(1, user, 0, begin).await.unwrap(),
            Place::Ticket(ticket)
        );
    }
    // Another tab of the same person: the same place.
    assert_eq!(lines.join(1, 20, 0, begin).await.unwrap(), Place::Ticket(6));
    let lines = &lines;
    let ticket = |user| async move { lines.standing(1, user).await.unwrap().place };
    assert_eq!(ticket(10).await, Place::Ticket(4));
    assert_eq!(ticket(11).await, Place::Ticket(5));
    let mut early: Vec<Place> = Vec::new();
    for user in 1..=3 {
        early.push(ticket(user).await);
    }
    early.sort_by_key(|p| match p {
        Place::Ticket(t) => *t,
        _ => u64::MAX,
    });
    assert_eq!(
        early,
        [Place::Ticket(1), Place::Ticket(2), Place::Ticket(3)]
    );
    assert_eq!(lines.standing(1, 22).await.unwrap().line.waiting(), 8);
}

/// Room 3: admission follows the set rate (within 10% over 3 s, called by
/// two "instances" at once every 50 ms), never admits more people than
/// there are units left for, and a cap holds admission until a place
/// frees; a paused room admits nobody, and an admitted person whose time
/// runs out is no longer admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_follows_the_rate_and_the_cap() {
    let redis = RedisServer::start();
    let lines = lines(&redis).await;
    let begin = support::now_ms();
    for voucher in 1..=5 {
        on_sale(&redis, voucher, 1_000);
    }
    lines.draw(1, begin).await.unwrap();
    for user in 0..1_000 {
        lines.join(1, user, 0, begin).await.unwrap();
    }
    let room = RoomSettings::new(40).unwrap();
    let started = std::time::Instant::now();
    lines.admit(1, &room).await.unwrap();
    let mut last = None;
    let mut last_call = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(3) {
        // The rate is judged up to the last admission asked for.
        last_call = started.elapsed();
        let (a, b) = tokio::join!(lines.admit(1, &room), lines.admit(1, &room));
        last = Some(a.unwrap().admitted_through.max(b.unwrap().admitted_through));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = last_call.as_secs_f64();
    let admitted = last.unwrap() as f64;
    let expected = 40.0 * elapsed;
    println!("admitted {admitted} in {elapsed:.2} s at 40/s (expected {expected:.0})");
    // The first admission may find up to a second's credit banked since
    // the draw (40 people) on top of the rate.
    assert!(
        admitted >= 0.9 * expected && admitted <= 1.1 * expected + 40.0,
        "admitted {admitted}, expected {expected:.0}"
    );

    // A cap of 5: five admitted at once, then nobody until one is done.
    lines.draw(2, begin).await.unwrap();
    for user in 0..20 {
        lines.join(2, user, 0, begin).await.unwrap();
    }
    let capped = RoomSettings::new(1_000)
        .unwrap()
        .with_max_active(5)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(lines.admit(2, &capped).await.unwrap().admitted_through, 5);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(lines.admit(2, &capped).await.unwrap().admitted_through, 5);
    lines.leave(2, 3).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = lines.admit(2, &capped).await.unwrap();
    assert_eq!((after.admitted_through, after.active), (6, 5));

    // Paused: nobody, however long.
    lines.draw(3, begin).await.unwrap();
    lines.join(3, 1, 0, begin).await.unwrap();
    let paused = RoomSettings::new(1_000).unwrap().with_paused(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(lines.admit(3, &paused).await.unwrap().now, 0);
    let resumed = paused.with_paused(false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(lines.admit(3, &resumed).await.unwrap().now, 1);

    // An admission whose time runs out (a short life, below what a shop
    // may set, to keep the test short) leaves the room.
    lines.draw(4, begin).await.unwrap();
    lines.join(4, 1, 0, begin).await.unwrap();
    let brief = RoomSettings {
        pass_ttl_ms: 200,
        ..RoomSettings::new(1_000).unwrap()
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    lines.admit(4, &brief).await.unwrap();
    assert!(lines.standing(4, 1).await.unwrap().pass_until_ms.is_some());
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let later = lines.admit(4, &brief).await.unwrap();
    assert_eq!(later.active, 0);
    assert_eq!(lines.standing(4, 1).await.unwrap().pass_until_ms, None);

    // Three units left: three admitted, however fast the rate; one buys
    // (the stock falls as they leave): still nobody more; the others' time
    // runs out (3 s here): two more.
    let three_s = RoomSettings {
        pass_ttl_ms: 3_000,
        ..RoomSettings::new(1_000).unwrap()
    };
    on_sale(&redis, 5, 3);
    lines.draw(5, begin).await.unwrap();
    for user in 0..10 {
        lines.join(5, user, 0, begin).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(lines.admit(5, &three_s).await.unwrap().admitted_through, 3);
    on_sale(&redis, 5, 2);
    lines.leave(5, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(lines.admit(5, &three_s).await.unwrap().admitted_through, 3);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert_eq!(lines.admit(5, &three_s).await.unwrap().admitted_through, 5);
}

struct Shop {
    _redis: RedisServer,
    service: seckill::service::Service,
    base: String,
    http: reqwest::Client,
    tokens: Tokens,
    dir: std::path::PathBuf,
}

impl Shop {
    async fn start(what: &str) -> Self {
        Self::on(RedisServer::start(), what).await
    }

    /// A service on `redis` and a fresh SQLite file.
    async fn on(redis: RedisServer, what: &str) -> Self {
        let (service, dir) = support::start_on_sqlite(what, &redis, SECRET).await;
        Self {
            base: format!("http://{}", service.addr()),
            service,
            _redis: redis,
            http: reqwest::Client::new(),
            tokens: Tokens::new(SECRET.as_bytes()).unwrap(),
            dir,
        }
    }

    fn user(&self, user: i64) -> String {
        self.tokens
            .mint(Principal::User(user), Duration::from_secs(600))
    }

    fn admin(&self) -> String {
        self.tokens.mint(Principal::Admin, Duration::from_secs(600))
    }

    async fn room(&self, voucher: i64, user: i64, join: bool) -> (StatusCode, Value) {
        let url = format!("{}/api/vouchers/{voucher}/room", self.base);
        let request = if join {
            self.http.post(url)
        } else {
            self.http.get(url)
        };
        let answer = request.bearer_auth(self.user(user)).send().await.unwrap();
        (answer.status(), answer.json().await.unwrap())
    }

    async fn buy(&self, voucher: i64, user: i64, pass: Option<&str>) -> (StatusCode, Value) {
        let mut request = self
            .http
            .post(format!("{}/api/vouchers/{voucher}/seckill", self.base))
            .bearer_auth(self.user(user));
        if let Some(pass) = pass {
            request = request.header("Room-Pass", pass);
        }
        let answer = request.send().await.unwrap();
        (answer.status(), answer.json().await.unwrap())
    }

    /// `user`'s pass once admitted (polled: admission is another task).
    async fn pass(&self, voucher: i64, user: i64) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (_, body) = self.room(voucher, user, false).await;
            if let Some(pass) = body["pass"].as_str() {
                assert_eq!(body["state"], "admitted", "{body}");
                return pass.to_owned();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never admitted: {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The instance stopped and another started on the same stores.
    async fn replace_instance(&mut self) {
        let database = format!("sqlite://{}/shop.db", self.dir.display());
        let next = seckill::service::Service::start(support::settings(
            self._redis.url(),
            database,
            SECRET,
        ))
        .await
        .unwrap();
        let old = std::mem::replace(&mut self.service, next);
        old.stop().await.unwrap();
        self.base = format!("http://{}", self.service.addr());
    }

    /// A sale with a room admitting `rate` people a second, starting in
    /// 1.5 s, and `people` who joined before it; its id.
    async fn sale_with_room(&self, rate: u32, people: std::ops::RangeInclusive<i64>) -> (i64, i64) {
        let begin = support::now_ms() + 1_500;
        let body = json!({"title": "a hot sale", "stock": 10, "begin_ms": begin,
            "end_ms": begin + 3_600_000,
            "waiting_room": {"admit_per_s": rate, "opens_before_ms": 60_000}});
        let voucher =
            support::create_voucher_from(&self.http, &self.base, &self.tokens, body).await;
        for user in people {
            self.room(voucher, user, true).await;
        }
        (voucher, begin)
    }

    /// Each of `people`'s ticket (asked again while Redis is coming back:
    /// 503).
    async fn tickets(&self, voucher: i64, people: std::ops::RangeInclusive<i64>) -> Vec<Value> {
        let mut tickets = Vec::new();
        for user in people {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let body = loop {
                let (status, body) = self.room(voucher, user, false).await;
                if status == StatusCode::OK {
                    break body;
                }
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
                assert!(std::time::Instant::now() < deadline, "{body}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            tickets.push(body["ticket"].clone());
        }
        tickets
    }

    async fn stop(self) {
        self.service.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(self.dir);
    }
}

/// Room 6: the line is Redis', not an instance's: an instance stopped
/// and another started finds every place as it was, and so does Redis
/// restarted with its data (the append-only file), passes included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_instance_or_redis_with_its_data_keeps_every_place() {
    let redis = RedisServer::start_with(ServerOptions::default().with_aof("always"));
    let mut shop = Shop::on(redis, "room-restarts").await;
    // One person a second: most of the line is still waiting throughout.
    let (voucher, begin) = shop.sale_with_room(1, 1..=6).await;
    until(begin).await;
    let before = loop {
        let tickets = shop.tickets(voucher, 1..=6).await;
        if tickets.iter().all(Value::is_u64) {
            break tickets;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    shop.replace_instance().await;
    assert_eq!(shop.tickets(voucher, 1..=6).await, before);
    let first = before.iter().position(|t| t == 1).unwrap() as i64 + 1;
    let pass = shop.pass(voucher, first).await;
    shop._redis.restart();
    assert_eq!(shop.tickets(voucher, 1..=6).await, before);
    // Purchases wait for the sale state's check after the restart (503).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (status, body) = loop {
        let (status, body) = shop.buy(voucher, first, Some(&pass)).await;
        if status != StatusCode::SERVICE_UNAVAILABLE || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, StatusCode::OK, "{body}");
    shop.stop().await;
}

/// Room 7: Redis down is a 503 in the room's routes too; Redis restarted
/// without its data loses the line, and with it
/// the key passes were signed with: a pass issued before is refused
/// (`pass_invalid`), and the sale, restored from the database, still
/// needs a pass; people join again and buy with new passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_lost_its_data_no_earlier_pass_buys() {
    let mut shop = Shop::start("room-data-loss").await;
    let (voucher, begin) = shop.sale_with_room(1_000, 1..=2).await;
    until(begin).await;
    let pass = shop.pass(voucher, 1).await;
    // Redis down: the room's routes answer 503, as every route does.
    shop._redis.kill();
    for join in [true, false] {
        let (status, body) = shop.room(voucher, 1, join).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
            "{body}"
        );
    }
    shop._redis.restart(); // no persistence: every key is gone
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = shop.buy(voucher, 1, None).await;
        if status == StatusCode::FORBIDDEN {
            assert_eq!(body["code"], "pass_required", "{body}");
            break;
        }
        // Restoring the sale from the database first (503).
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(std::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = shop.buy(voucher, 1, Some(&pass)).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("pass_invalid")),
        "{body}"
    );
    let (_, body) = shop.room(voucher, 1, false).await;
    assert_eq!(body["state"], "outside", "{body}");
    shop.room(voucher, 1, true).await;
    let fresh = shop.pass(voucher, 1).await;
    let (status, body) = shop.buy(voucher, 1, Some(&fresh)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    shop.stop().await;
}

/// Room 4 and 5: in a sale with a room, a purchase without a pass, with a
/// forged one, an expired one, another person's or another sale's is a 403
/// naming why and buys nothing; the person's own pass buys once, and then
/// they are done in the room. Joining is per person, a 404 where the sale
/// has no room; the shop sets, pauses and removes the room by the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_behind_a_room_needs_its_buyers_own_valid_pass() {
    let shop = Shop::start("room-api").await;
    let now = support::now_ms();
    let begin = now + 1_500;
    let room = json!({"admit_per_s": 1000, "opens_before_ms": 60_000, "pass_ttl_ms": 60_000});
    let create = |title: &str| {
        json!({"title": title, "stock": 10, "begin_ms": begin, "end_ms": begin + 3_600_000,
               "waiting_room": room})
    };
    let voucher = support::create_voucher_from(
        &shop.http,
        &shop.base,
        &shop.tokens,
        create("behind a room"),
    )
    .await;
    let other =
        support::create_voucher_from(&shop.http, &shop.base, &shop.tokens, create("another")).await;
    let plain = support::open_voucher(&shop.http, &shop.base, &shop.tokens, "no room", 10).await;

    let (status, body) = shop.room(plain, 1, true).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = shop.room(voucher, 1, true).await;
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::OK, Some("awaiting_draw")),
        "{body}"
    );
    for user in [2, 3] {
        shop.room(voucher, user, true).await;
    }
    shop.room(other, 1, true).await;
    // The page shows the room on the live figures.
    let sale: Value = shop
        .http
        .get(format!("{}/api/vouchers/{voucher}", shop.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sale["waiting_room"]["admit_per_s"], 1000, "{sale}");

    until(begin).await;
    let (status, body) = shop.buy(voucher, 1, None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("pass_required")),
        "{body}"
    );
    let mine = shop.pass(voucher, 1).await;
    let theirs = shop.pass(voucher, 2).await;
    let elsewhere = shop.pass(other, 1).await;
    // The deployment's own key signs a pass that ran out.
    let conn = connect(&shop._redis.url()).await.unwrap();
    let key = RoomLines::new(Redis::new(conn, "seckill"))
        .pass_key()
        .await
        .unwrap();
    let expired = key.sign(&Pass {
        voucher,
        user: 1,
        ticket: 1,
        expires_ms: support::now_ms() - 1,
    });
    let forged = PassKey::new(b"not the deployment's key")
        .unwrap()
        .sign(&Pass {
            voucher,
            user: 1,
            ticket: 1,
            expires_ms: support::now_ms() + 60_000,
        });
    for (pass, code) in [
        (forged.as_str(), "pass_invalid"),
        ("garbage", "pass_invalid"),
        (expired.as_str(), "pass_expired"),
        (theirs.as_str(), "pass_not_yours"),
        (elsewhere.as_str(), "pass_other_sale"),
    ] {
        let (status, body) = shop.buy(voucher, 1, Some(pass)).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::FORBIDDEN, Some(code)),
            "{body}"
        );
    }
    let (status, body) = shop.buy(voucher, 1, Some(&mine)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = shop.buy(voucher, 1, Some(&mine)).await;
    assert_eq!(body["code"], "already_bought", "{status} {body}");
    let (_, body) = shop.room(voucher, 1, false).await;
    assert_eq!(body["state"], "done", "{body}");
    assert!(body["pass"].is_null(), "{body}");

    // The shop pauses the room: a new joiner waits, and is not admitted.
    let put = |settings: Value| {
        shop.http
            .put(format!("{}/api/vouchers/{voucher}/room", shop.base))
            .bearer_auth(shop.admin())
            .json(&settings)
            .send()
    };
    let answer = put(json!({"admit_per_s": 1000, "paused": true}))
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let answer = put(json!({"admit_per_s": 0})).await.unwrap();
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    let refused: Value = answer.json().await.unwrap();
    assert_eq!(refused["field"], "admit_per_s", "{refused}");
    tokio::time::sleep(seckill::waiting_room::ROOMS_REFRESH * 2).await;
    let (_, body) = shop.room(voucher, 4, true).await;
    assert_eq!(body["state"], "waiting", "{body}");
    assert_eq!(body["paused"], true, "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, body) = shop.room(voucher, 4, false).await;
    assert_eq!(
        body["state"], "waiting",
        "a paused room admitted someone: {body}"
    );
    // Removed: the sale sells without a pass.
    let removed = shop
        .http
        .delete(format!("{}/api/vouchers/{voucher}/room", shop.base))
        .bearer_auth(shop.admin())
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), StatusCode::NO_CONTENT);
    let (status, body) = shop.buy(voucher, 4, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    shop.stop().await;
}
