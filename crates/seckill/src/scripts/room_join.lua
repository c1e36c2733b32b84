-- A person joins a sale's waiting room, in O(1): once per person (tabs and
-- devices share the place), before the opening into the draw, after it at
-- the end of the line.
--
-- All keys share the voucher's hash tag (one Redis Cluster slot).
-- KEYS[1]  room hash: drawn ('1' once the draw is done), head, tail, ...
-- KEYS[2]  early set: who joined before the sale's start (drawn at it)
-- KEYS[3]  late list: who joined after the start but before the draw, in
--          arrival order (queued behind the drawn)
-- KEYS[4]  ticket hash: user -> ticket ('0' while awaiting the draw)
-- ARGV[1]  user id
-- ARGV[2]  when joining opens (Unix ms)
-- ARGV[3]  the sale's start: the draw (Unix ms)
--
-- Judged by the Redis server's clock, the one every instance shares.
--
-- Returns {0, opens_ms}    not open yet
--         {1, n}           awaiting the draw, with n people in it
--         {2, ticket}      in line with this ticket
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(ARGV[2]) then
  return {0, tonumber(ARGV[2])}
end
local ticket = redis.call('hget', KEYS[4], ARGV[1])
if not ticket then
  if redis.call('hget', KEYS[1], 'drawn') == '1' then
    ticket = redis.call('hincrby', KEYS[1], 'tail', 1)
    redis.call('hset', KEYS[4], ARGV[1], ticket)
    return {2, ticket}
  end
  redis.call('hset', KEYS[4], ARGV[1], 0)
  if now < tonumber(ARGV[3]) then
    redis.call('sadd', KEYS[2], ARGV[1])
  else
    redis.call('rpush', KEYS[3], ARGV[1])
  end
  ticket = '0'
end
if ticket == '0' then
  return {1, redis.call('scard', KEYS[2]) + redis.call('llen', KEYS[3])}
end
return {2, tonumber(ticket)}
