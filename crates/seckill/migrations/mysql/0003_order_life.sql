-- An order's life after the purchase: reserved until paid, or given back
-- (cancelled by the buyer, expired at its payment deadline).
--
-- A voucher's payment window and whether a buyer whose order was given back
-- may buy again.
ALTER TABLE seckill_voucher
    ADD COLUMN pay_within_ms BIGINT NOT NULL DEFAULT 900000 CHECK (pay_within_ms > 0),
    ADD COLUMN rebuy_after_cancel BIGINT NOT NULL DEFAULT 1 CHECK (rebuy_after_cancel IN (0, 1));

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
ALTER TABLE voucher_order
    ADD COLUMN state VARCHAR(16) NOT NULL DEFAULT 'paid'
        CHECK (state IN ('reserved', 'paid', 'cancelled', 'expired')),
    ADD COLUMN pay_by_ms BIGINT NULL,
    ADD COLUMN due_ms BIGINT NULL,
    ADD COLUMN claim_user_id BIGINT NULL,
    ADD COLUMN paid_ms BIGINT NULL,
    ADD COLUMN closed_ms BIGINT NULL,
    ADD COLUMN pay_key VARCHAR(64) NULL;
UPDATE voucher_order SET pay_by_ms = created_ms, claim_user_id = user_id, paid_ms = created_ms;
ALTER TABLE voucher_order
    ALTER COLUMN state DROP DEFAULT,
    MODIFY pay_by_ms BIGINT NOT NULL,
    ADD CONSTRAINT voucher_order_claim UNIQUE (voucher_id, claim_user_id),
    ADD CONSTRAINT voucher_order_claimant CHECK (claim_user_id IS NULL OR claim_user_id = user_id),
    ADD INDEX voucher_order_user (user_id, voucher_id),
    ADD INDEX voucher_order_due (due_ms);
ALTER TABLE voucher_order DROP INDEX voucher_order_user_voucher;
