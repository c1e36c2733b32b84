-- Renew the leases of many locks in one call (the watchdog's batch), or
-- re-arm one lock's lease on a re-entry.
--
-- KEYS[i]    lock hash i
-- ARGV[1]    lease in milliseconds
-- ARGV[i+1]  owner id that must hold KEYS[i]
--
-- Returns  an array: element i is 1 if lock i was renewed, 0 if it is no
--          longer held by that owner (it was not touched: no key is revived)
local renewed = {}
for i = 1, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
