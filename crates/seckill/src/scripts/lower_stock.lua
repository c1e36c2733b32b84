-- Lower a voucher's Redis stock to what the database allows, only if it
-- still holds the value the reconciliation saw (nobody bought meanwhile).
--
-- KEYS[1]  voucher hash (field stock)
-- ARGV[1]  the stock the reconciliation read
-- ARGV[2]  the stock to set (clamped at 0)
--
-- Returns  1 if lowered, 0 if the stock had changed (nothing done)
if tonumber(redis.call('hget', KEYS[1], 'stock')) == tonumber(ARGV[1]) then
  redis.call('hset', KEYS[1], 'stock', math.max(tonumber(ARGV[2]), 0))
  return 1
end
return 0
