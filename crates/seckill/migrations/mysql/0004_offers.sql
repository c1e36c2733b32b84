-- A voucher as a shop sells it: its shop, sub-title and rules, its price and
-- face value in whole minor units of an ISO 4217 currency, and whether a
-- refunded unit goes back on sale; an order's amount, copied from its
-- voucher's price when the order is stored.
--
-- What rows stored before become: vouchers are free (price and face value
-- 0) in 'XXX', ISO 4217's code for "no currency involved", of no named shop,
-- with an empty sub-title and rules; their orders' amount is 0 'XXX'.
-- The texts' lengths are their limits in characters (utf8mb4, as titles).
ALTER TABLE seckill_voucher
    ADD COLUMN shop_id BIGINT CHECK (shop_id IS NULL OR shop_id > 0),
    ADD COLUMN shop_name VARCHAR(100),
    ADD COLUMN subtitle VARCHAR(200) NOT NULL DEFAULT '',
    ADD COLUMN rules VARCHAR(2000) NOT NULL DEFAULT '',
    ADD COLUMN price_minor BIGINT NOT NULL DEFAULT 0 CHECK (price_minor >= 0),
    ADD COLUMN face_value_minor BIGINT NOT NULL DEFAULT 0 CHECK (face_value_minor >= 0),
    ADD COLUMN currency VARCHAR(3) NOT NULL DEFAULT 'XXX',
    ADD COLUMN refund_restock VARCHAR(10) NOT NULL DEFAULT 'while_open'
        CHECK (refund_restock IN ('while_open', 'never'));
ALTER TABLE voucher_order
    ADD COLUMN amount_minor BIGINT NOT NULL DEFAULT 0 CHECK (amount_minor >= 0),
    ADD COLUMN currency VARCHAR(3) NOT NULL DEFAULT 'XXX';
