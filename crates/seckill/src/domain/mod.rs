//! Values of the flash-sale domain, free of I/O.

pub mod order_id;
pub mod voucher;
