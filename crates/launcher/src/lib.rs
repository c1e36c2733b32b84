//! # launcher — private database servers as child processes
//!
//! Starts `redis-server` (alone, as a replica, as a Redis Cluster or a
//! Sentinel group), PostgreSQL and MariaDB as child processes of the caller,
//! each in a private temporary directory (its data, socket and log), on a
//! unix socket or a free TCP port of 127.0.0.1, and stops them when dropped.
//! `seckill-tools demo` and `seckill-tools chaos` run on them; the test suites too
//! (through `testkit`). A server can also be paused (`SIGSTOP`), resumed,
//! killed (`SIGKILL`) and restarted on the same address and data: the
//! faults a chaos run or a fault test needs. For the pages' tests it also
//! starts a private `chromedriver` ([`ChromeDriver`]).
//!
//! The `try_*` constructors return a [`LaunchError`]; the short ones
//! (`start`, `restart`) panic with the same message, for tests.
//!
//! ```no_run
//! # fn main() -> Result<(), launcher::LaunchError> {
//! let redis = launcher::RedisServer::try_start_with(launcher::ServerOptions::default())?;
//! println!("{}", redis.url()); // redis+unix:///tmp/hasp-redis-…/redis.sock
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod browser;
mod cluster;
mod error;
mod redis;
mod sentinel;
mod sql;
mod tls;

pub use browser::ChromeDriver;
pub use cluster::RedisCluster;
pub use error::LaunchError;
pub use redis::{free_tcp_port, RedisServer, ServerOptions, TlsOptions, Transport};
pub use sentinel::{Sentinel, SentinelGroup, SERVICE as SENTINEL_SERVICE};
pub use sql::{MariaDbServer, PostgresServer};
pub use tls::{JwtKey, JwtKeyKind, TestCa, Use as CertificateUse};
