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
local call = redis.call
local results = {}
local message = ARGV[1]
for i = 1, #KEYS / 2 do
  local lock, aux = KEYS[2 * i - 1], KEYS[2 * i]
  local at = 4 * i - 2
  local owner, lease, extra = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  if ARGV[at] == 'a' then
    if call('exists', lock) == 0 then
      local token = call('incr', aux)
      -- Strings, not Lua numbers: Redis formats a number argument with
      -- printf's %.17g, a measurable share of a call this small.
      call('hset', lock, owner, '1')
      call('pexpire', lock, lease)
      results[i] = token
    elseif call('hexists', lock, owner) == 1 then
      call('hincrby', lock, owner, '1')
      call('pexpire', lock, lease)
      -- A counter deleted behind our back still yields a valid token.
      results[i] = tonumber(call('get', aux)) or call('incr', aux)
    else
      if extra == '1' then
        call('hset', lock, ':w', '1')
      end
      local ttl = call('pttl', lock)
      if ttl > 0 then results[i] = -ttl else results[i] = 0 end
    end
  else
    local held = call('hmget', lock, owner, ':w')
    local count = held[1]
    if not count then
      results[i] = -1
    elseif count ~= extra and tonumber(count) > tonumber(extra) then
      -- Compared as strings first: the usual release gives back every hold.
      local left = tonumber(count) - tonumber(extra)
      call('hset', lock, owner, tostring(left))
      call('pexpire', lock, lease)
      results[i] = left
    else
      call('del', lock)
      if held[2] then
        call('publish', aux, message)
      end
      results[i] = 0
    end
  end
end
return results
