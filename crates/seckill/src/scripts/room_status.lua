-- Where a person stands in a sale's waiting room, in one call.
--
-- KEYS[1]  room hash, KEYS[2] early set, KEYS[3] late list, KEYS[4] ticket
--          hash (see room_join.lua), KEYS[5] active sorted set (see
--          room_admit.lua), KEYS[6] the voucher's hash (its live stock)
-- ARGV[1]  user id
--
-- Returns {ticket, head, tail, awaiting draw, deadline, drawn, stock}: ticket -1
-- not in line, 0 awaiting the draw; deadline the Unix ms their pass runs
-- out, -1 if not admitted or no longer (bought, or the time ran out);
-- drawn 1 once the draw was made; stock the units left (-1 if the sale is
-- not in Redis).
local ticket = tonumber(redis.call('hget', KEYS[4], ARGV[1]) or '-1')
local r = redis.call('hmget', KEYS[1], 'head', 'tail', 'drawn')
local awaiting = redis.call('scard', KEYS[2]) + redis.call('llen', KEYS[3])
local deadline = -1
if ticket > 0 then
  local score = redis.call('zscore', KEYS[5], ticket)
  if score then
    deadline = tonumber(score)
  end
end
return {ticket, tonumber(r[1] or '0'), tonumber(r[2] or '0'), awaiting, deadline,
  tonumber(r[3] or '0'), tonumber(redis.call('hget', KEYS[6], 'stock') or '-1')}
