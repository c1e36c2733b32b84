//! Every behaviour of `shared/spec/multi.md` for locks over several
//! independent Redis servers, against real redis-server processes each
//! test starts for itself. "multi N" names the line of that specification.

mod helpers;

mod cluster;
mod multi_lock;
mod red_lock;
mod sentinel;
