-- The fast path of a flash-sale purchase, atomically: sale window, stock,
-- one order per user; on success decrement the stock, record the buyer and
-- append the order to the voucher's order stream.
--
-- All keys share the voucher's hash tag, so the script runs on one Redis
-- Cluster slot.
-- KEYS[1]  voucher hash: stock, begin_ms, end_ms (epoch milliseconds),
--          room ('1': a waiting room stands in front of the sale)
-- KEYS[2]  buyers set of the voucher (user ids)
-- KEYS[3]  order stream of the voucher
-- KEYS[4]  order-of hash of the voucher (user id -> order id)
-- KEYS[5]  (optional, one server or a Sentinel master) the replication
--          history the sale state was verified for: given, an accepted
--          purchase answers it too, so that a replica confirmation can be
--          tied to the server and history that took the order
-- ARGV[1]  user id
-- ARGV[2]  order id
-- ARGV[3]  voucher id (written into the stream entry)
-- ARGV[4]  '1' if the buyer showed a valid waiting-room pass (the service
--          checked its signature, person, sale and time)
--
-- The sale window is judged by the Redis server's clock (TIME), the one
-- clock every service instance shares.
--
-- Called without arguments (to load it after a restart), it changes
-- nothing and returns -1.
--
-- Returns -1  no arguments: nothing done
--          0  accepted (stock decremented, buyer and their order id
--             recorded, order appended); with KEYS[5], {0, history} (the
--             history false if none is recorded)
--          1  the sale has not started
--          2  the sale has ended
--          3  sold out
--          4  this user already bought this voucher
--          5  unknown voucher
--          6  the sale has a waiting room and no valid pass came
if #ARGV == 0 then
  return -1
end
local v = redis.call('hmget', KEYS[1], 'stock', 'begin_ms', 'end_ms', 'room')
if not v[1] then
  return 5
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(v[2]) then
  return 1
end
if now >= tonumber(v[3]) then
  return 2
end
if v[4] == '1' and ARGV[4] ~= '1' then
  return 6
end
if tonumber(v[1]) <= 0 then
  -- A buyer asking again learns that, not that the sale sold out.
  if redis.call('sismember', KEYS[2], ARGV[1]) == 1 then
    return 4
  end
  return 3
end
if redis.call('sadd', KEYS[2], ARGV[1]) == 0 then
  return 4
end
redis.call('hincrby', KEYS[1], 'stock', -1)
redis.call('hset', KEYS[4], ARGV[1], ARGV[2])
redis.call('xadd', KEYS[3], '*', 'order', ARGV[2], 'user', ARGV[1], 'voucher', ARGV[3])
if KEYS[5] then
  return {0, redis.call('get', KEYS[5])}
end
return 0
