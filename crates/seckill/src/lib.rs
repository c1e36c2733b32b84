//! # seckill — a flash-sale service on Redis and `hasp`
//!
//! The library behind the `seckill` binary (`serve`, `demo`, `bench`, `lab`,
//! `reconcile`, ...). Its parts, each usable on its own:
//!
//! * [`service::Service`]: the whole service — HTTP API and order pipeline
//!   — started from [`settings::Settings`] and stopped gracefully.
//! * [`settings`]: the one settings type, its defaults, and the layers
//!   (defaults < file < environment < flags) it is resolved from.
//! * [`sale::Sales`]: purchases, live stock and order status for the API,
//!   whichever path decides (the one place that tells them apart).
//! * [`http`]: the axum router (vouchers, purchases, orders, health,
//!   metrics, OpenAPI), bearer tokens from [`auth`], rate limits.
//! * [`store::FastPath`]: the atomic Redis purchase — sale window, stock and
//!   one order per user checked, stock decremented, buyer recorded and the
//!   order appended to the voucher's stream, all in one script call.
//! * [`pipeline::OrderPipeline`]: the durable path from that stream into the
//!   database (consumer group, takeover of dead consumers, dead letters).
//! * [`sync_path::SyncPath`]: the alternative locked path — a per-user
//!   `hasp` lock around a checked database transaction.
//! * [`db::Database`]: SQLite, PostgreSQL or MariaDB through sqlx.
//! * [`OrderId`] and [`store::OrderIdGenerator`]: globally unique order ids
//!   (sign bit, 31 bits of seconds since 2024-01-01, 32 bits of a per-day
//!   Redis sequence), allocated in blocks so an order costs no extra round
//!   trip.
//! * [`order_life::OrderLife`]: an order's life after the purchase —
//!   payment through a [`payments::Payments`] provider, cancellation,
//!   expiry at the payment deadline — and the given-back unit on sale again
//!   in both stores, exactly once.
//! * [`reconcile`]: Redis and the database compared, safe repairs applied.
//! * [`repair::SaleRepair`]: the service repairing itself when Redis lost
//!   or rolled back a sale's state (restart without data, old snapshot).
//! * [`waiting_room::WaitingRooms`]: a waiting room in front of a hot sale
//!   — a fair place in line for every person, admission at the shop's
//!   rate, and signed passes to buy with.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> anyhow::Result<()> {
//! use seckill::service::Service;
//! use seckill::settings::Settings;
//!
//! // A private redis-server for the example; any Redis URL works.
//! let redis = testkit::RedisServer::start();
//! let dir = std::env::temp_dir().join(format!("seckill-doc-{}", std::process::id()));
//! let database = format!("sqlite://{}/shop.db", dir.display());
//!
//! let service = Service::start(Settings {
//!     listen: "127.0.0.1:0".parse()?, // any free port; the default is 8080
//!     ..Settings::new(redis.url(), database, "a-secret-of-at-least-16-bytes")
//! })
//! .await?;
//! let health = reqwest::get(format!("http://{}/healthz", service.addr())).await?;
//! assert!(health.status().is_success());
//! service.stop().await?; // finishes requests, drains the order pipeline
//! # let _ = std::fs::remove_dir_all(dir);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

pub mod auth;
pub mod db;
pub mod domain;
mod error;
pub mod http;
pub mod limits;
pub mod live;
pub mod metrics;
pub mod order_life;
pub mod payments;
pub mod pipeline;
pub mod reconcile;
pub mod repair;
pub mod sale;
pub mod service;
pub mod settings;
pub mod store;
pub mod sync_path;
#[cfg(feature = "testing")]
pub mod testing;
pub mod waiting_room;
mod worker;

pub use domain::order_id::OrderId;
pub use error::{Error, Result};
