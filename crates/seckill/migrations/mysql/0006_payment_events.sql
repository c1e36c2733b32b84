-- A payment provider's callbacks, each recorded once by its event id (a
-- provider delivers an event again until it is acknowledged, and may
-- deliver it twice): what it said and what the service did with it.
--
-- outcome  paid, declined, refunded, refund_declined, voided (the order
--          could not be paid: expired, cancelled, or paid by another
--          charge), amount_mismatch (refused: not the order's amount,
--          voided), unknown_order, duplicate
CREATE TABLE payment_event (
    id           VARCHAR(100) PRIMARY KEY,
    kind         VARCHAR(32)  NOT NULL,
    reference    VARCHAR(200) NOT NULL,
    order_id     BIGINT       NOT NULL,
    amount_minor BIGINT       NOT NULL,
    currency     VARCHAR(3)   NOT NULL,
    outcome      VARCHAR(32)  NOT NULL,
    received_ms  BIGINT       NOT NULL
) ENGINE = InnoDB;
CREATE INDEX payment_event_order ON payment_event (order_id);
