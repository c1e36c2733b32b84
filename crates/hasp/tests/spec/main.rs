//! Every line of the "Lock" section of `docs/guarantees.md`, against real
//! redis-server processes that each test starts for itself, cited as
//! "lock N".
//!
//! With `HASP_SPEC_DEPLOYMENT=cluster` the same tests run on a private
//! 3-master Redis Cluster each (multi 21); faults meant for "the server"
//! hit the master of the lock's slot. With `HASP_SPEC_DEPLOYMENT=tls` they
//! run on one server that speaks TLS only (lock 35). `scripts/test.sh`
//! runs all three.

use hasp_testkit as helpers;

mod acl;
mod acquire_release;
mod adaptive;
mod connect;
mod fencing;
mod input;
mod plain_lock;
mod tls;
mod waiting;
mod watchdog;
