//! The synchronizer family beyond the basic lock: every line of the
//! "Family" section of `docs/guarantees.md` (cited as "family N") and of
//! its "Family in detail" section (cited as "family detail N"), against real redis-server processes that each test starts for
//! itself.
//!
//! With `HASP_SPEC_DEPLOYMENT=cluster` the same tests run on a private
//! 3-master Redis Cluster each (`scripts/test.sh` runs both).

use hasp_testkit as helpers;

mod child;
mod fair_lock;
mod idle_keys;
mod latch;
mod rw_lock;
mod semaphore;
