//! The synchronizer family beyond the basic lock: every line of
//! `shared/spec/family.md` (and of the research notes' finer lines, cited as
//! "research N"), against real redis-server processes that each test starts
//! for itself. Line numbers refer to that specification.
//!
//! With `HASP_SPEC_DEPLOYMENT=cluster` the same tests run on a private
//! 3-master Redis Cluster each (`scripts/test.sh` runs both).

#[path = "../spec/helpers.rs"]
#[allow(dead_code)]
mod helpers;

mod child;
mod fair_lock;
mod idle_keys;
mod latch;
mod rw_lock;
mod semaphore;
