//! Every behaviour of `shared/spec/lock.md`, against real redis-server
//! processes that each test starts for itself. Section numbers refer to that
//! specification.

mod helpers;

mod acquire_release;
mod connect;
mod fencing;
mod input;
mod waiting;
mod watchdog;
