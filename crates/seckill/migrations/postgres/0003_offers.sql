-- A voucher as a shop sells it: its shop, sub-title and rules, its price and
-- face value in whole minor units of an ISO 4217 currency, and whether a
-- refunded unit goes back on sale; an order's amount, copied from its
-- voucher's price when the order is stored.
--
-- What rows stored before become: vouchers are free (price and face value
-- 0) in 'XXX', ISO 4217's code for "no currency involved", of no named shop,
-- with an empty sub-title and rules; their orders' amount is 0 'XXX'.
ALTER TABLE seckill_voucher
    ADD COLUMN shop_id BIGINT CHECK (shop_id IS NULL OR shop_id > 0),
    ADD COLUMN shop_name TEXT,
    ADD COLUMN subtitle TEXT NOT NULL DEFAULT '',
    ADD COLUMN rules TEXT NOT NULL DEFAULT '',
    ADD COLUMN price_minor BIGINT NOT NULL DEFAULT 0 CHECK (price_minor >= 0),
    ADD COLUMN face_value_minor BIGINT NOT NULL DEFAULT 0 CHECK (face_value_minor >= 0),
    ADD COLUMN currency TEXT NOT NULL DEFAULT 'XXX' CHECK (length(currency) = 3),
    ADD COLUMN refund_restock TEXT NOT NULL DEFAULT 'while_open'
        CHECK (refund_restock IN ('while_open', 'never'));
ALTER TABLE voucher_order
    ADD COLUMN amount_minor BIGINT NOT NULL DEFAULT 0 CHECK (amount_minor >= 0),
    ADD COLUMN currency TEXT NOT NULL DEFAULT 'XXX' CHECK (length(currency) = 3);
