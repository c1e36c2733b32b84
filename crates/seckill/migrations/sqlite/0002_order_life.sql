-- An order's life after the purchase: reserved until paid, or given back
-- (cancelled by the buyer, expired at its payment deadline).
--
-- A voucher's payment window and whether a buyer whose order was given back
-- may buy again.
ALTER TABLE seckill_voucher ADD COLUMN pay_within_ms BIGINT NOT NULL DEFAULT 900000
    CHECK (pay_within_ms > 0);
ALTER TABLE seckill_voucher ADD COLUMN rebuy_after_cancel BIGINT NOT NULL DEFAULT 1
    CHECK (rebuy_after_cancel IN (0, 1));

-- SQLite cannot drop a constraint: the orders' table is made anew.
--
-- state          reserved, paid, cancelled or expired; only a reserved
--                order changes, by one conditional UPDATE
-- pay_by_ms      the payment deadline (Unix ms)
-- due_ms         when the expiry sweep must look at the row: the deadline
--                of a reserved order; the moment of a give-back until Redis
--                has the unit back; NULL once nothing is left to do
-- claim_user_id  the buyer while the order holds their one order of the
--                voucher (unique per voucher); NULL once given back, if the
--                voucher lets them buy again
-- pay_key        the client's idempotency key of the payment
-- Orders stored before payments existed were complete sales: paid.
CREATE TABLE voucher_order_life (
    id             BIGINT  PRIMARY KEY,
    user_id        BIGINT  NOT NULL,
    voucher_id     BIGINT  NOT NULL REFERENCES seckill_voucher (id),
    created_ms     BIGINT  NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('reserved', 'paid', 'cancelled', 'expired')),
    pay_by_ms      BIGINT  NOT NULL,
    due_ms         BIGINT,
    claim_user_id  BIGINT  CHECK (claim_user_id IS NULL OR claim_user_id = user_id),
    paid_ms        BIGINT,
    closed_ms      BIGINT,
    pay_key        TEXT,
    CONSTRAINT voucher_order_claim UNIQUE (voucher_id, claim_user_id)
);
INSERT INTO voucher_order_life
    (id, user_id, voucher_id, created_ms, state, pay_by_ms, claim_user_id, paid_ms)
SELECT id, user_id, voucher_id, created_ms, 'paid', created_ms, user_id, created_ms
FROM voucher_order;
DROP TABLE voucher_order;
ALTER TABLE voucher_order_life RENAME TO voucher_order;
CREATE INDEX voucher_order_user ON voucher_order (user_id, voucher_id);
CREATE INDEX voucher_order_due ON voucher_order (due_ms);
