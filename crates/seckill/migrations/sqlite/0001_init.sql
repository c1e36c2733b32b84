-- Flash-sale vouchers and their orders (seed 002's tables, merged: a
-- voucher here is always a flash-sale voucher).
CREATE TABLE seckill_voucher (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    title       TEXT    NOT NULL,
    stock       BIGINT  NOT NULL CHECK (stock >= 0),
    begin_ms    BIGINT  NOT NULL,
    end_ms      BIGINT  NOT NULL,
    created_ms  BIGINT  NOT NULL,
    CHECK (end_ms > begin_ms)
);

-- The order id is the global id minted at purchase; re-delivery of the same
-- order hits the primary key, a second order of a user hits the unique pair.
CREATE TABLE voucher_order (
    id          BIGINT  PRIMARY KEY,
    user_id     BIGINT  NOT NULL,
    voucher_id  BIGINT  NOT NULL REFERENCES seckill_voucher (id),
    created_ms  BIGINT  NOT NULL,
    CONSTRAINT voucher_order_user_voucher UNIQUE (user_id, voucher_id)
);
