-- Acquire and release many locks in one call. The client batches the
-- operations its tasks have pending at the same moment; each operation is
-- applied in order and on its own, exactly as if it had been sent alone.
--
-- ARGV[1] is the message a release publishes: the releasing client's id, so
-- that client ignores its own message (it wakes its local waiters directly).
-- Then come the operations, each taking the next keys and arguments:
--
--   acquire   KEYS: lock, fence   ARGV: 'a' or 'w', owner, lease
--   release   KEYS: lock          ARGV: holds, owner
--   hand-off  KEYS: lock, fence   ARGV: 'h', owner, holds, heir, lease
--
-- lock    hash: field <owner> = hold count; field ':w' present while some
--         client waits on the release channel: that client's id, or '*'
--         once two clients did
-- fence   the fencing counter (string, no TTL, same slot)
-- 'w'     acquire, and flag the lock as waited on if another owner holds it
--         (the caller subscribed to the release channel)
-- owner   owner id (never starts with ':', so it cannot clash with ':w')
-- lease   milliseconds, always >= 1
-- holds   how many holds to give back, as digits (1, or more when tasks
--         sharing an owner both reached Redis); digits, unlike the letters,
--         mark a release
-- 'h'     release, and if that frees the lock take it at once for heir (a
--         waiting owner of the releasing client) with a fresh token, unless
--         another client flagged itself as waiting: then the lock is freed
--         and published for the other clients (the releasing client ignores
--         its own messages and holds its waiters back a little). Freeing
--         the lock clears the flag, so it names only clients that started
--         waiting since.
--
-- The release channel is not a key: it is <lock>:released (see keys.rs).
-- Every argument is a string, and strings are what the script passes on:
-- Redis formats a Lua number argument with printf's %.17g, a measurable
-- share of calls this small.
--
-- Returns an array with one element per operation; for an acquire:
--   token >= 1   acquired. A free lock gets a fresh token (INCR of the
--                counter); a re-entry gets the current hold's token, which is
--                the counter's value: it only moves when a free lock is taken.
--   -ttl  (< 0)  held by another owner; ttl = remaining milliseconds
--   0            held by another owner and the key has no expiry
-- for a release:
--   -1           not held by this owner (nothing changed)
--   0            released; published only if a waiter flagged itself
--   n >= 1       holds this owner still has (the lease is left as it is)
-- and for a hand-off:
--   -1           not held by this owner (nothing changed)
--   -2           released and published for another client that waits
--   0            holds this owner still has left: not handed over
--   token >= 1   released, and now held by heir with this token
local call = redis.call
local results = {}
local message = ARGV[1]
local key, arg = 1, 2
while arg <= #ARGV do
  local kind, owner, lock = ARGV[arg], ARGV[arg + 1], KEYS[key]
  local result
  if kind == 'a' or kind == 'w' then
    local fence, lease = KEYS[key + 1], ARGV[arg + 2]
    key, arg = key + 2, arg + 3
    if call('exists', lock) == 0 then
      result = call('incr', fence)
      call('hset', lock, owner, '1')
      call('pexpire', lock, lease)
    elseif call('hexists', lock, owner) == 1 then
      call('hincrby', lock, owner, '1')
      call('pexpire', lock, lease)
      -- A counter deleted behind our back still yields a valid token.
      result = tonumber(call('get', fence)) or call('incr', fence)
    else
      if kind == 'w' then
        local flag = call('hget', lock, ':w')
        if not flag then
          call('hset', lock, ':w', message)
        elseif flag ~= message and flag ~= '*' then
          call('hset', lock, ':w', '*')
        end
      end
      local ttl = call('pttl', lock)
      if ttl > 0 then result = -ttl else result = 0 end
    end
  elseif kind == 'h' then
    local fence, holds, heir, lease = KEYS[key + 1], ARGV[arg + 2], ARGV[arg + 3], ARGV[arg + 4]
    key, arg = key + 2, arg + 5
    local held = call('hmget', lock, owner, ':w')
    local count, flagged = held[1], held[2]
    if not count then
      result = -1
    elseif count ~= holds and tonumber(count) > tonumber(holds) then
      call('hset', lock, owner, tostring(tonumber(count) - tonumber(holds)))
      result = 0
    elseif flagged and flagged ~= message then
      call('del', lock)
      call('publish', lock .. ':released', message)
      result = -2
    else
      call('hdel', lock, owner)
      call('hset', lock, heir, '1')
      call('pexpire', lock, lease)
      result = call('incr', fence)
    end
  else
    key, arg = key + 1, arg + 2
    local held = call('hmget', lock, owner, ':w')
    local count = held[1]
    if not count then
      result = -1
    elseif count ~= kind and tonumber(count) > tonumber(kind) then
      -- Compared as strings first: a release usually gives back every hold.
      result = tonumber(count) - tonumber(kind)
      call('hset', lock, owner, tostring(result))
    else
      call('del', lock)
      if held[2] then
        call('publish', lock .. ':released', message)
      end
      result = 0
    end
  end
  results[#results + 1] = result
end
return results
