-- A fenced lock's acquisition when the lock is free, as a script of its
-- own: KEYS[1] the lock, ARGV[1] the hold ('1 <nonce> - <owner>'), ARGV[2]
-- the lease in ms. Answers the fresh token (>= 1), or 0 when the lock is
-- held (nothing changed but a token used up): the client then sends the
-- batch function's acquisition, which re-enters, flags a waiter or says
-- how long the lock stays held.
--
-- The free path of lock.lua's `acquire` and `fresh_token`, kept apart from
-- the function library on purpose: a script runs in the server's scripting
-- state, not the functions', whose garbage collector steps through every
-- function of hasp's library; and it carries no dispatch, no per-operation
-- `pcall` and no reply array (benches/README.md). The counter lives 100 ms
-- from its seeding with the server's clock ("Tokens" in lock.lua).
local fence = KEYS[1] .. ':fence'
local token = redis.call('incr', fence)
if token == 1 then
  local now = redis.call('time')
  token = now[1] * 1000000 + now[2]
  redis.call('set', fence, string.format('%d', token), 'PX', 100)
end
if redis.call('set', KEYS[1], ARGV[1] .. ' ' .. string.format('%d', token), 'NX', 'PX', ARGV[2]) then
  return token
end
return 0
