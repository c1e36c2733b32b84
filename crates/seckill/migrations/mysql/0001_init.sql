-- Flash-sale vouchers and their orders (seed 002's tables, merged: a
-- voucher here is always a flash-sale voucher). MariaDB 10.5+ (RETURNING).
CREATE TABLE seckill_voucher (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    title       VARCHAR(200) NOT NULL,
    stock       BIGINT       NOT NULL CHECK (stock >= 0),
    begin_ms    BIGINT       NOT NULL,
    end_ms      BIGINT       NOT NULL,
    created_ms  BIGINT       NOT NULL,
    CHECK (end_ms > begin_ms)
) ENGINE = InnoDB;

-- The order id is the global id minted at purchase; re-delivery of the same
-- order hits the primary key, a second order of a user hits the unique pair.
CREATE TABLE voucher_order (
    id          BIGINT NOT NULL PRIMARY KEY,
    user_id     BIGINT NOT NULL,
    voucher_id  BIGINT NOT NULL,
    created_ms  BIGINT NOT NULL,
    CONSTRAINT voucher_order_user_voucher UNIQUE (user_id, voucher_id),
    CONSTRAINT voucher_order_voucher FOREIGN KEY (voucher_id) REFERENCES seckill_voucher (id)
) ENGINE = InnoDB;
