//! # seckill — a flash-sale service on Redis and `hasp`
//!
//! This crate grows into the service of the project README. What stands so
//! far are its two cores, usable on their own:
//!
//! * [`OrderId`] and [`store::OrderIdGenerator`]: globally unique order ids
//!   (sign bit, 31 bits of seconds since 2024-01-01, 32 bits of a per-day
//!   Redis sequence), allocated in blocks so an order costs no extra round
//!   trip.
//! * [`store::FastPath`]: the atomic Redis purchase — sale window, stock and
//!   one order per user checked, stock decremented, buyer recorded and the
//!   order appended to the voucher's stream, all in one script call.

#![warn(missing_docs)]

pub mod auth;
pub mod db;
pub mod domain;
mod error;
pub mod http;
pub mod metrics;
pub mod pipeline;
pub mod reconcile;
pub mod service;
pub mod status;
pub mod store;
pub mod sync_path;

pub use domain::order_id::OrderId;
pub use error::{Error, Result};
