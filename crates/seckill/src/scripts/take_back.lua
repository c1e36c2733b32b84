-- Take back the unit of an order the database gave back (cancelled, or
-- expired unpaid), exactly once per order: the order's id joins the
-- voucher's set of returned orders, and only the call that adds it raises
-- the stock. If the voucher lets a buyer buy again (its hash's `rebuy` is
-- not '0'), the buyer is forgotten too, unless they already hold a newer
-- order of it.
--
-- KEYS[1]  voucher hash (stock, rebuy)
-- KEYS[2]  buyers set of the voucher
-- KEYS[3]  order-of hash of the voucher (user id -> order id)
-- KEYS[4]  returned set of the voucher (order ids)
-- ARGV[1]  user id
-- ARGV[2]  order id
--
-- Returns 1  taken back: stock + 1
--         0  this order's unit was taken back before (nothing done)
--         2  no sale state (Redis lost it, or never had it): nothing done;
--            a repair restores the sale from the database, unit included
if redis.call('exists', KEYS[1]) == 0 then
  return 2
end
if redis.call('sadd', KEYS[4], ARGV[2]) == 0 then
  return 0
end
redis.call('hincrby', KEYS[1], 'stock', 1)
if redis.call('hget', KEYS[1], 'rebuy') ~= '0' and redis.call('hget', KEYS[3], ARGV[1]) == ARGV[2] then
  redis.call('hdel', KEYS[3], ARGV[1])
  redis.call('srem', KEYS[2], ARGV[1])
end
return 1
