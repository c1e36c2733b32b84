-- A sale's waiting room: its settings live with the voucher's other terms.
-- room_admit_per_s is NULL for a sale without a room (every voucher stored
-- before rooms existed, and every one created without); with a room, the
-- others are set too: a cap on people admitted and not done (NULL: none),
-- how long before the sale people may join, how long an admitted person
-- has to buy, and whether admission is paused (1) or running (0). The line
-- itself is Redis' (see the service's README, "Waiting room").
ALTER TABLE seckill_voucher
    ADD COLUMN room_admit_per_s BIGINT CHECK (room_admit_per_s IS NULL OR room_admit_per_s > 0),
    ADD COLUMN room_max_active BIGINT CHECK (room_max_active IS NULL OR room_max_active > 0),
    ADD COLUMN room_opens_before_ms BIGINT NOT NULL DEFAULT 0 CHECK (room_opens_before_ms >= 0),
    ADD COLUMN room_pass_ttl_ms BIGINT NOT NULL DEFAULT 0 CHECK (room_pass_ttl_ms >= 0),
    ADD COLUMN room_paused BIGINT NOT NULL DEFAULT 0 CHECK (room_paused IN (0, 1));
