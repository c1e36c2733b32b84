//! Values of the flash-sale domain, free of I/O.

pub mod money;
pub mod order;
pub mod order_id;
pub mod purchase;
pub mod voucher;
pub mod waiting_room;

/// The local wall clock in Unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
