-- After the payment: an order is redeemed at its shop (used) or refunded to
-- its buyer (refunding while the provider refunds, then refunded).
--
-- pay_reference  the provider's reference of the charge the order kept
--                (what a refund names)
-- redeem_code    the one-time code the buyer shows at the shop (set when
--                the order is paid; unique)
-- used_ms        when the shop redeemed it
-- refund_key     the client's idempotency key of the refund
-- refunded_ms    when the refund completed
-- returned_ms    when the order's unit went back on sale in the database
--                (cancelled, expired, or refunded while the voucher takes
--                refunded units back); NULL while it holds its unit
--
-- Rows stored before: cancelled and expired orders gave their unit back
-- when they closed; paid orders have no redemption code (they cannot be
-- redeemed by code) and no charge reference (their amount is 0: a refund
-- asks no provider).
--
-- SQLite cannot change a CHECK constraint: the orders' table is made anew.
CREATE TABLE voucher_order_v4 (
    id             BIGINT  PRIMARY KEY,
    user_id        BIGINT  NOT NULL,
    voucher_id     BIGINT  NOT NULL REFERENCES seckill_voucher (id),
    created_ms     BIGINT  NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('reserved', 'paid', 'cancelled',
                       'expired', 'used', 'refunding', 'refunded')),
    pay_by_ms      BIGINT  NOT NULL,
    due_ms         BIGINT,
    claim_user_id  BIGINT  CHECK (claim_user_id IS NULL OR claim_user_id = user_id),
    paid_ms        BIGINT,
    closed_ms      BIGINT,
    pay_key        TEXT,
    amount_minor   BIGINT  NOT NULL DEFAULT 0 CHECK (amount_minor >= 0),
    currency       TEXT    NOT NULL DEFAULT 'XXX' CHECK (length(currency) = 3),
    pay_reference  TEXT,
    redeem_code    TEXT    UNIQUE,
    used_ms        BIGINT,
    refund_key     TEXT,
    refunded_ms    BIGINT,
    returned_ms    BIGINT,
    CONSTRAINT voucher_order_claim UNIQUE (voucher_id, claim_user_id)
);
INSERT INTO voucher_order_v4
    (id, user_id, voucher_id, created_ms, state, pay_by_ms, due_ms, claim_user_id, paid_ms,
     closed_ms, pay_key, amount_minor, currency, returned_ms)
SELECT id, user_id, voucher_id, created_ms, state, pay_by_ms, due_ms, claim_user_id, paid_ms,
       closed_ms, pay_key, amount_minor, currency,
       CASE WHEN state IN ('cancelled', 'expired') THEN closed_ms END
FROM voucher_order;
DROP TABLE voucher_order;
ALTER TABLE voucher_order_v4 RENAME TO voucher_order;
CREATE INDEX voucher_order_user ON voucher_order (user_id, voucher_id);
CREATE INDEX voucher_order_due ON voucher_order (due_ms);
