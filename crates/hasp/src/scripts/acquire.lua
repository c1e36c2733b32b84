-- Acquire (or re-enter) a reentrant lock.
--
-- KEYS[1]  lock hash: field <owner> = hold count, field ':t' = fencing token,
--          field ':w' present when some client waits on the release channel
-- KEYS[2]  fencing counter (a plain string, no TTL, same hash slot)
-- ARGV[1]  owner id (never starts with ':', so it cannot clash with ':t'/':w')
-- ARGV[2]  lease in milliseconds (always >= 1: the client never sends less)
-- ARGV[3]  '1' if the caller will wait for a release message, else '0'
--
-- Returns  token >= 1   acquired; a fresh token for a free lock, the token of
--                       the current hold for a re-entry by the same owner
--          -ttl  (< 0)  held by another owner; ttl = remaining milliseconds
--          0            held by another owner and the key has no expiry
if redis.call('exists', KEYS[1]) == 0 then
  local token = redis.call('incr', KEYS[2])
  redis.call('hset', KEYS[1], ARGV[1], 1, ':t', token)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return token
end
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[1], 1)
  redis.call('pexpire', KEYS[1], ARGV[2])
  return tonumber(redis.call('hget', KEYS[1], ':t'))
end
if ARGV[3] == '1' then
  redis.call('hset', KEYS[1], ':w', 1)
end
local ttl = redis.call('pttl', KEYS[1])
if ttl > 0 then
  return -ttl
end
return 0
