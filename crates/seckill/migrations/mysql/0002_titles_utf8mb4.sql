-- Titles in full Unicode: the server's default character set may be latin1
-- or the 3-byte utf8mb3, which refuse CJK text or emoji (found by a title
-- the other databases stored). utf8mb4 holds every character the title
-- rule accepts, as PostgreSQL and SQLite do.
ALTER TABLE seckill_voucher CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
