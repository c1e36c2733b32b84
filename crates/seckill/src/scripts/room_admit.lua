-- Admission: people from the head of the line, at the room's rate, as many
-- as the time since the last admission allows, and never more than there
-- are units left for: each admitted person not done yet has a unit to buy,
-- so the line sells in its order, however often each person looks. Every
-- instance calls it every tick: what is due is computed from the clock, so
-- calls from many instances admit no more than one would.
--
-- KEYS[1]  room hash: drawn, head (last ticket admitted), tail (last ticket
--          issued), last_ms (the last admission's time), carry (admissions
--          due but not whole yet, in thousandths)
-- KEYS[2]  active sorted set: ticket -> when its pass runs out (Unix ms)
-- KEYS[3]  the voucher's hash: its live stock
-- ARGV[1]  people per second
-- ARGV[2]  people admitted and not done at most (0: no cap)
-- ARGV[3]  '1' paused
-- ARGV[4]  how long an admitted person has to buy (ms)
--
-- Returns {admitted now, head, tail, active, 1}; {0, 0, 0, 0, 0} before the
-- draw.
local r = redis.call('hmget', KEYS[1], 'drawn', 'head', 'tail', 'last_ms', 'carry')
if r[1] ~= '1' then
  return {0, 0, 0, 0, 0}
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head, tail = tonumber(r[2]), tonumber(r[3])
redis.call('zremrangebyscore', KEYS[2], '-inf', now)
local active = redis.call('zcard', KEYS[2])
if ARGV[3] == '1' then
  redis.call('hset', KEYS[1], 'last_ms', now, 'carry', 0)
  return {0, head, tail, active, 1}
end
local rate = tonumber(ARGV[1])
-- Thousandths of a person: ms times people per second.
local credit = tonumber(r[5]) + math.max(0, now - tonumber(r[4])) * rate
-- At most a second's admissions are banked (no burst after a quiet spell).
credit = math.min(credit, rate * 1000)
local n = math.floor(credit / 1000)
n = math.min(n, tail - head)
local cap = tonumber(ARGV[2])
if cap > 0 then
  n = math.max(0, math.min(n, cap - active))
end
-- Units left for those admitted now: the stock less the admitted people
-- who have not bought yet (a buyer leaves the active set as they buy).
local units = tonumber(redis.call('hget', KEYS[3], 'stock') or '0') - active
n = math.max(0, math.min(n, units))
credit = credit - n * 1000
local deadline = now + tonumber(ARGV[4])
for ticket = head + 1, head + n do
  redis.call('zadd', KEYS[2], deadline, ticket)
end
head = head + n
if head == tail or (cap > 0 and active + n >= cap) or n >= units then
  -- Nobody waiting, the room full, or every unit spoken for: nothing is
  -- owed for the time.
  credit = 0
end
redis.call('hset', KEYS[1], 'head', head, 'last_ms', now, 'carry', credit)
return {n, head, tail, active + n, 1}
