//! Redis key layout of the sale.
//!
//! | key | type | content |
//! |---|---|---|
//! | `P:{v<id>}:voucher` | hash | `stock`, `begin_ms`, `end_ms`, `rebuy` (`0`: a buyer whose order was given back may not buy again) |
//! | `P:{v<id>}:buyers` | set | user ids that bought the voucher |
//! | `P:{v<id>}:orders` | stream | accepted orders: `order`, `user`, `voucher` |
//! | `P:{v<id>}:order-of` | hash | user id → order id, written with the purchase (order status in one lookup) |
//! | `P:{v<id>}:failed` | hash | user id → order id of orders the pipeline dead-lettered |
//! | `P:{v<id>}:returned` | set | order ids whose unit came back (cancelled or expired): each is taken back once |
//! | `P:{v<id>}:room` | hash | the waiting room's line: `drawn`, `head` (last ticket admitted), `tail` (last ticket issued), `last_ms`, `carry` |
//! | `P:{v<id>}:room-early` | set | who joined the room before the sale's start, until the draw |
//! | `P:{v<id>}:room-late` | list | who joined after the start but before the draw, in arrival order |
//! | `P:{v<id>}:room-ticket` | hash | user id → ticket (`0` while awaiting the draw) |
//! | `P:{v<id>}:room-active` | sorted set | admitted tickets → when their pass runs out (Unix ms) |
//! | `P:room-pass-key` | string | the key waiting-room passes are signed with (32 random bytes) |
//! | `P:order-seq:YYYYMMDD` | string | the day's order sequence counter |
//! | `P:orders:dead` | stream | dead-lettered orders, with `stream`, `entry`, `reason` |
//! | `P:orders:consumers` | sorted set | the pipeline's consumers → when each last said it is alive (Unix ms) |
//! | `P:replica-ack` | string | a counter written before each group `WAIT` (`--replica-ack`) |
//! | `P:verified-history` | string | the replication history (`master_replid`) the sale state was last verified for (`verification`) |
//!
//! `{v<id>}` is the hash tag: one purchase touches one Redis Cluster slot.

/// The keys of one voucher's sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoucherKeys {
    /// Sale terms and live stock.
    pub voucher: String,
    /// Buyers (one order per user).
    pub buyers: String,
    /// Accepted orders awaiting the database.
    pub orders: String,
    /// Each buyer's order id (user → order).
    pub order_of: String,
    /// Buyers whose order the pipeline gave up on (user → order).
    pub failed: String,
    /// Orders whose unit was taken back.
    pub returned: String,
    /// The waiting room's line.
    pub room: String,
    /// Who joined the room before the sale's start.
    pub room_early: String,
    /// Who joined after the start, before the draw.
    pub room_late: String,
    /// Each person's ticket.
    pub room_ticket: String,
    /// Admitted tickets and when their passes run out.
    pub room_active: String,
}

/// The last part of each key a purchase touches, in the purchase script's
/// order (`KEYS[1]` to `KEYS[4]`).
const PURCHASE: [&str; 4] = ["voucher", "buyers", "orders", "order-of"];

/// The keys a purchase of voucher `id` touches, in the purchase script's
/// order: its voucher hash, buyers, order stream and order-of hash. Four
/// strings, where [`VoucherKeys::new`] makes eleven: a purchase is the
/// service's hottest call.
pub(crate) fn purchase_keys(prefix: &str, id: i64) -> [String; 4] {
    PURCHASE.map(|part| format!("{prefix}:{{v{id}}}:{part}"))
}

impl VoucherKeys {
    /// Keys of voucher `id` under `prefix`.
    pub fn new(prefix: &str, id: i64) -> Self {
        let tag = format!("{prefix}:{{v{id}}}");
        let [voucher, buyers, orders, order_of] = PURCHASE.map(|part| format!("{tag}:{part}"));
        Self {
            voucher,
            buyers,
            orders,
            order_of,
            failed: format!("{tag}:failed"),
            returned: format!("{tag}:returned"),
            room: format!("{tag}:room"),
            room_early: format!("{tag}:room-early"),
            room_late: format!("{tag}:room-late"),
            room_ticket: format!("{tag}:room-ticket"),
            room_active: format!("{tag}:room-active"),
        }
    }
}

/// The per-day order sequence counter.
pub(crate) fn order_sequence(prefix: &str, yyyymmdd: &str) -> String {
    format!("{prefix}:order-seq:{yyyymmdd}")
}

/// The dead-letter stream of all vouchers.
pub fn dead_letter_stream(prefix: &str) -> String {
    format!("{prefix}:orders:dead")
}

/// Every pipeline consumer's last sign of life.
pub(crate) fn consumers(prefix: &str) -> String {
    format!("{prefix}:orders:consumers")
}

/// The marker written before each group `WAIT` of replica confirmation.
pub(crate) fn replica_ack_marker(prefix: &str) -> String {
    format!("{prefix}:replica-ack")
}

/// The replication history the sale state was last verified for.
pub(crate) fn verified_history(prefix: &str) -> String {
    format!("{prefix}:verified-history")
}

/// The key waiting-room passes are signed with.
pub(crate) fn room_pass_key(prefix: &str) -> String {
    format!("{prefix}:room-pass-key")
}
