//! The Redis side of the service: the only module that sends Redis
//! commands or knows the key layout (`keys`). The rest of the crate works
//! on the typed values these modules return.
//!
//! | module | what |
//! |---|---|
//! | `connect` | the connection: one server, a Sentinel service or a cluster; the lock client |
//! | `tls` | what the connections trust and present over TLS |
//! | `sentinel` | a connection that follows the master of a Sentinel service |
//! | `redis` | the connection and key prefix every view below takes |
//! | `keys` | the key layout |
//! | `fast_path` | the sale's terms, the atomic purchase, and a given-back order's unit taken back |
//! | `order_ids` | order id blocks from the day's counter |
//! | `replica_ack` | group-committed `WAIT` for replica confirmation |
//! | `order_stream` | the order streams as the pipeline consumes them |
//! | `order_lookup` | a buyer's order as Redis knows it |
//! | `reachability` | purchases refused at once while Redis is known to be unreachable |
//! | `sale_audit` | a sale's Redis side for `reconcile`, and its safe fixes |
//! | `verification` | whether a server's sale state was verified for the data it holds now |
//! | `waiting_room` | the waiting rooms' lines: joining, the draw, admission, a person's standing, the pass key |

mod connect;
mod fast_path;
mod keys;
mod order_ids;
mod order_lookup;
mod order_stream;
mod reachability;
mod redis;
mod replica_ack;
mod sale_audit;
mod sentinel;
mod tls;
mod verification;
mod waiting_room;

pub use self::redis::Redis;
pub use connect::{
    acl_rules, cluster_seeds, connect, connect_with, lock_client, RedisConn, CLUSTER_SCHEME,
    CLUSTER_TLS_SCHEME, CONNECTION_TIMEOUT, RESPONSE_TIMEOUT,
};
pub use fast_path::{FastPath, ReplicaAck, SaleHash, TakeBack, SOLD_OUT_MEMORY};
pub use keys::{dead_letter_stream, VoucherKeys};
pub use order_ids::OrderIdGenerator;
pub use order_lookup::order_in_redis;
pub use order_stream::{is_missing_group, Delivery, OrderStreams};
pub use reachability::PROBE_INTERVAL;
pub use sale_audit::{add_buyers, lower_stock, read_sale, RedisSale};
pub use sentinel::{sentinel_service, SENTINEL_SCHEME, SENTINEL_TLS_SCHEME};
pub use tls::RedisTls;
pub use verification::History;
pub use waiting_room::{Admitted, Draw, LineFigures, RoomLines, Standing};
