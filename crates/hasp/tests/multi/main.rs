//! Every line of the "Several servers" section of `docs/guarantees.md`, for
//! locks over several independent Redis servers, against real redis-server
//! processes each test starts for itself. "multi N" names its line N.
//!
//! The tests run on a multi-threaded runtime: they inspect the servers with
//! `redis-cli` (a blocking process call) while holding locks, which on a
//! single-threaded runtime would stall the clients' renewals.

mod helpers;

mod cluster;
mod multi_lock;
mod red_lock;
mod sentinel;
