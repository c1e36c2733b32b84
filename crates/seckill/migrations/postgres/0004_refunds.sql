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
ALTER TABLE voucher_order
    DROP CONSTRAINT voucher_order_state_check,
    ADD CONSTRAINT voucher_order_state_check CHECK (state IN ('reserved', 'paid',
        'cancelled', 'expired', 'used', 'refunding', 'refunded')),
    ADD COLUMN pay_reference VARCHAR(200),
    ADD COLUMN redeem_code VARCHAR(16) UNIQUE,
    ADD COLUMN used_ms BIGINT,
    ADD COLUMN refund_key VARCHAR(64),
    ADD COLUMN refunded_ms BIGINT,
    ADD COLUMN returned_ms BIGINT;
UPDATE voucher_order SET returned_ms = closed_ms WHERE state IN ('cancelled', 'expired');
