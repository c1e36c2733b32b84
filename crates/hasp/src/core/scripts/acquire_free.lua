-- Fenced locks' acquisitions when the locks are free, as a script of its
-- own: KEYS the locks, ARGV a hold ('1 <nonce> - <owner>') and a lease in
-- ms per lock, in the locks' order. Answers, per lock, the fresh token
-- (>= 1), or 0 when the lock is held (nothing changed but a token used
-- up): the client then sends that lock's acquisition through the batch
-- function, which re-enters, flags a waiter or says how long the lock
-- stays held. One lock: the number; several: an array of them.
--
-- The free path of lock.lua's `acquire` and `fresh_token`, kept apart from
-- the function library on purpose: a script runs in the server's scripting
-- state, not the functions', whose garbage collector steps through every
-- function of hasp's library; and it carries no dispatch, no per-operation
-- `pcall` and no reply array for one lock (benches/README.md). A call's
-- fenced acquisitions share one run of it, so Redis' cost per command and
-- per script run is paid once for them all. The counter lives 100 ms from
-- its seeding with the server's clock ("Tokens" in lock.lua).
local function acquire(lock, hold, lease)
  local fence = lock .. ':fence'
  local token = redis.call('incr', fence)
  if token == 1 then
    local now = redis.call('time')
    token = now[1] * 1000000 + now[2]
    redis.call('set', fence, string.format('%d', token), 'PX', 100)
  end
  if redis.call('set', lock, hold .. ' ' .. string.format('%d', token), 'NX', 'PX', lease) then
    return token
  end
  return 0
end

if #KEYS == 1 then
  return acquire(KEYS[1], ARGV[1], ARGV[2])
end
local tokens = {}
for i, lock in ipairs(KEYS) do
  tokens[i] = acquire(lock, ARGV[2 * i - 1], ARGV[2 * i])
end
return tokens
