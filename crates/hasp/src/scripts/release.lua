-- Release one hold of a reentrant lock.
--
-- KEYS[1]  lock hash (see acquire.lua)
-- KEYS[2]  release channel
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds, re-armed when holds remain
-- ARGV[3]  message to publish (the releasing client's id, so that client can
--          ignore its own message: it wakes its local waiters directly)
-- ARGV[4]  holds to release (1, or more when two tasks sharing an owner
--          both reached Redis; the client releases them together)
--
-- Returns  -1          the lock is not held by this owner (nothing changed)
--          0           released; published only if a waiter flagged itself
--          n >= 1      holds remaining for this owner (lease re-armed)
local v = redis.call('hmget', KEYS[1], ARGV[1], ':w')
if not v[1] then
  return -1
end
local remaining = tonumber(v[1]) - tonumber(ARGV[4])
if remaining > 0 then
  redis.call('hset', KEYS[1], ARGV[1], remaining)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return remaining
end
redis.call('del', KEYS[1])
if v[2] then
  redis.call('publish', KEYS[2], ARGV[3])
end
return 0
