-- Take the next block of a day's order sequence, never below the day's
-- time floor, so that a counter Redis lost (restart without its data, a
-- failover to a replica that had not seen the last increments) starts
-- again above every number handed out before the loss.
--
-- The floor is the time elapsed in the day by the server's clock, in
-- seconds, times FLOOR_STEP: the counter is kept at or above it, so numbers issued at
-- time t are below floor(t) + what a burst took beyond it. Ids never repeat
-- after a loss while the day's ids average at most FLOOR_STEP per second
-- (2^32 / 86,400 = 49,710: the whole 32-bit sequence of a day).
--
-- KEYS[1]  the day's counter
-- ARGV[1]  block size
-- ARGV[2]  the day's first second, Unix time
-- ARGV[3]  counter TTL, seconds
--
-- Returns  the last number of the block taken
local FLOOR_STEP = 49710
local block = tonumber(ARGV[1])
local t = redis.call('time')
local elapsed = tonumber(t[1]) - tonumber(ARGV[2])
local micros = tonumber(t[2])
if elapsed < 0 then elapsed, micros = 0, 0 end
if elapsed > 86399 then elapsed, micros = 86399, 999999 end
-- To the microsecond, so the floor moves within a second too.
local floor = elapsed * FLOOR_STEP + math.floor(micros * FLOOR_STEP / 1000000)
local last = redis.call('incrby', KEYS[1], block)
if last - block < floor then
  last = floor + block
  redis.call('set', KEYS[1], last)
end
redis.call('expire', KEYS[1], tonumber(ARGV[3]))
return last
