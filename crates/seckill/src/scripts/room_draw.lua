-- The draw at a sale's start: the people who joined before it get tickets
-- 1..n in the order given (a uniformly random order the service drew), those
-- who joined since queue behind them in arrival order, and from then on a
-- joiner takes the next ticket. Once per room.
--
-- KEYS[1]  room hash, KEYS[2] early set, KEYS[3] late list, KEYS[4] ticket
--          hash (see room_join.lua)
-- ARGV[1]  the sale's start (Unix ms)
-- ARGV[2..] every member of the early set, shuffled
--
-- Returns  1 drawn now
--          0 drawn already
--         -1 too soon: the sale has not started (the early set may grow)
--         -2 the early set is not the one given: read it again
if redis.call('hget', KEYS[1], 'drawn') == '1' then
  return 0
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(ARGV[1]) then
  return -1
end
local n = #ARGV - 1
if redis.call('scard', KEYS[2]) ~= n then
  return -2
end
for i = 1, n do
  if redis.call('sismember', KEYS[2], ARGV[i + 1]) == 0 then
    return -2
  end
  redis.call('hset', KEYS[4], ARGV[i + 1], i)
end
for _, user in ipairs(redis.call('lrange', KEYS[3], 0, -1)) do
  n = n + 1
  redis.call('hset', KEYS[4], user, n)
end
redis.call('hset', KEYS[1], 'drawn', 1, 'tail', n, 'head', 0, 'last_ms', now, 'carry', 0)
redis.call('del', KEYS[2], KEYS[3])
return 1
