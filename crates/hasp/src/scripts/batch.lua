-- Acquire and release many locks in one call. The client batches the
-- operations its tasks have pending at the same moment; each operation is
-- applied in order and on its own, exactly as if it had been sent alone.
--
-- Per operation i (1-based):
-- KEYS[2i-1]   lock hash: field <owner> = hold count, field ':w' present
--              when some client waits on the release channel
-- KEYS[2i]     acquire: the fencing counter (string, no TTL, same slot)
--              release: the release channel
-- ARGV[1]      message a release publishes (the releasing client's id, so
--              that client ignores its own message: it wakes its local
--              waiters directly)
-- ARGV[4i-2]   'a' (acquire) or 'r' (release)
-- ARGV[4i-1]   owner id (never starts with ':', so it cannot clash with ':w')
-- ARGV[4i]     lease in milliseconds, always >= 1 (set on acquire; re-armed
--              on a release that leaves holds)
-- ARGV[4i+1]   acquire: '1' if the caller will wait for a release message
--              release: how many holds to give back (1, or more when tasks
--              sharing an owner both reached Redis)
--
-- Returns an array; element i is, for an acquire:
--   token >= 1   acquired. A free lock gets a fresh token (INCR of the
--                counter); a re-entry gets the current hold's token, which is
--                the counter's value: it only moves when a free lock is taken.
--   -ttl  (< 0)  held by another owner; ttl = remaining milliseconds
--   0            held by another owner and the key has no expiry
-- and for a release:
--   -1           not held by this owner (nothing changed)
--   0            released; published only if a waiter flagged itself
--   n >= 1       holds this owner still has (lease re-armed)
local results = {}
local message = ARGV[1]
for i = 1, #KEYS / 2 do
  local lock, aux = KEYS[2 * i - 1], KEYS[2 * i]
  local at = 4 * i - 2
  local owner, lease, extra = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  if ARGV[at] == 'a' then
    if redis.call('exists', lock) == 0 then
      local token = redis.call('incr', aux)
      redis.call('hset', lock, owner, 1)
      redis.call('pexpire', lock, lease)
      results[i] = token
    elseif redis.call('hexists', lock, owner) == 1 then
      redis.call('hincrby', lock, owner, 1)
      redis.call('pexpire', lock, lease)
      -- A counter deleted behind our back still yields a valid token.
      results[i] = tonumber(redis.call('get', aux)) or redis.call('incr', aux)
    else
      if extra == '1' then
        redis.call('hset', lock, ':w', 1)
      end
      local ttl = redis.call('pttl', lock)
      if ttl > 0 then results[i] = -ttl else results[i] = 0 end
    end
  else
    local held = redis.call('hmget', lock, owner, ':w')
    if not held[1] then
      results[i] = -1
    else
      local left = tonumber(held[1]) - tonumber(extra)
      if left > 0 then
        redis.call('hset', lock, owner, left)
        redis.call('pexpire', lock, lease)
        results[i] = left
      else
        redis.call('del', lock)
        if held[2] then
          redis.call('publish', aux, message)
        end
        results[i] = 0
      end
    end
  end
end
return results
