//! Redis state of the sale: keys, order ids, the fast path.

mod connect;
mod fast_path;
mod keys;
mod order_ids;
mod replica_ack;

pub use connect::{
    cluster_seeds, connect, lock_client, RedisConn, CLUSTER_SCHEME, CONNECTION_TIMEOUT,
    RESPONSE_TIMEOUT,
};
pub use fast_path::{FastPath, ReplicaAck, SOLD_OUT_MEMORY};
pub(crate) use keys::failed_of_stream;
pub use keys::{dead_letter_stream, VoucherKeys};
pub use order_ids::OrderIdGenerator;
