-- Locks: a reentrant lock per name, with fencing tokens.
--
--   op  KEYS          ARGV
--   a   lock          a, lease, hold                acquire
--   w   lock          w, lease, hold                acquire; if held by another
--                                                   owner, flag this client as
--                                                   waiting for it
--   r   lock          r, owner, nonce               release one hold
--   R   lock          R, owner, holds, nonce        release holds
--   h   lock, fence   h, owner, holds, nonce, heir, lease
--                                                   release; if that frees the
--                                                   lock, hand it to heir
--   e   lock          e, owner, lease, token        extend the lease ('0': only
--                                                   check that owner holds it)
--                                                   of owner's hold of fencing
--                                                   token (a renewal that comes
--                                                   after its hold was released
--                                                   and the lock taken again by
--                                                   owner touches nothing)
--   u   lock          u, owner, nonce               undo: if operation nonce gave
--                                                   owner a hold that is still
--                                                   the last change, release it
--   s   lock          s, owner, holds, nonce        release, unless release nonce
--                                                   was applied already
--   f   lock          f                             free the lock, whoever holds it
--
-- lock    a string, '<count> <nonce> <flag> <owner> <token>', with the
--         lease as its expiry: the holder's hold count; the nonce of the
--         last operation that changed it; the id of the client whose tasks
--         wait, '*' once two clients did (since the lock was last free),
--         '-' while none did; the holder's id (it may hold spaces); and the
--         hold's fencing token, last (a plain lock's is 1). A string rather
--         than a hash: an acquisition of a free lock is one SET NX PX GET,
--         where a hash took EXISTS, HSET and PEXPIRE. The token is in the
--         value, not only in the counter, so that a re-entry and a renewal
--         read it from the key they touch anyway, and a renewal of a hold
--         nobody re-entered or waits for can be one conditional SET of the
--         whole value (Valkey 9).
-- fence   the fencing counter: a string in the lock's slot, the last token
--         issued for the name; it lives 100 ms from the moment it was
--         seeded with the server's clock (see "Tokens"), so a name nobody
--         takes leaves no key, and no acquisition re-arms its expiry.
-- owner   owner id
-- hold    the value a free lock takes, but its token: '1 <nonce> - <owner>'
--         (see "lock"). An acquisition sends it whole rather than owner and
--         nonce apart, and no fence key (it is the lock's key and ':fence',
--         keys.rs, in the same slot): at one operation per call each
--         argument costs Redis ~1,600 instructions before the function
--         runs, and taking a free lock appends the token to an argument as
--         it came instead of building the value from its fields
--         (benches/README.md). The other paths take the owner and nonce
--         out of it.
-- lease   milliseconds, >= 1 (the client never sends more than Redis takes)
-- holds   how many holds to give back (1, or more when tasks sharing an owner
--         both reached Redis). A release of one hold, nearly every release,
--         is 'r' and does not send it (1,700 fewer instructions per
--         lock/unlock pair at one operation per call, 200 at 25).
-- nonce   unique per operation. When the reply to a call is lost, the client
--         cannot know what the call did; it sends 'u' for each acquisition
--         and hand-off of that call and 's' for each release before anything
--         else, and the nonce makes either a no-op if it has nothing to undo
--         or redo. So an error from the client means "not held", and a lost
--         reply never leaves a hold that nobody tracks.
-- 'h'     the heir is a waiting owner of the releasing client; the lock goes
--         to it with a fresh token in the same call, unless another client
--         flagged itself as waiting: then the lock is freed and published for
--         the other clients (the releasing client holds its own waiters back
--         a little). Freeing a lock deletes its key, flag included, so the
--         flag names only clients that started waiting since.
--
-- The release channel is not a key: it is <lock>:released (see keys.rs).
--
-- Tokens. A fresh token is last + 1 (one INCR); when the counter is
-- missing it is seeded with the server's TIME in microseconds and lives
-- 100 ms. So the counter, while it exists, was seeded at most 100 ms ago
-- and has been raised by one per token since; a token never exceeds its
-- issue time in microseconds (a name cannot be taken more than once a
-- microsecond: every acquisition costs the server more than that), and
-- tokens for a name never repeat or go back: not after the counter
-- expired or Redis lost it (a restart without persistence: the next token
-- is the time now), nor after a failover to a replica that missed the last
-- increments, if the failover took 100 ms or more (Sentinel and Cluster
-- take seconds: the replica's copy of the counter has expired by then) —
-- provided the server's clock is not stepped back. The clock is read only
-- to seed the counter: at most once per 100 ms per name taken often, and
-- an acquisition of a free lock is otherwise one INCR and one SET.
--
-- Each operation answers an integer:
--   a, w  token >= 1   acquired: a free lock gets a fresh token; a hold of
--                      the owner (through another client) is re-entered and
--                      keeps its token (the value's)
--         -ttl (< 0)   held by another owner for ttl more milliseconds (-1
--                      in its last millisecond)
--         0            held by another owner and the key has no expiry
--   r, s  -1           not held by this owner (nothing changed)
--         0            freed (published if a waiter flagged itself)
--         n >= 1       holds this owner still has (the lease is left as is)
--   h     -1           not held by this owner (nothing changed)
--         0            holds this owner still has left: not handed over
--         -2           freed and published for another client that waits
--         token >= 1   freed, and now held by heir with this fresh token
--   e     1 renewed (or held), 0 not held by owner (nothing changed)
--   u     as r
--   f     1 a lock was freed, 0 there was none

-- A fresh token for the lock (or fair lock) whose counter is `fence`
-- (see "Tokens" above), as a number and as digits (Lua would write a
-- number this large with an exponent). Taken before the lock is known to
-- be free, so a try that finds it held used one up: harmless, tokens only
-- need to grow.
local function fresh_token(fence)
  local token = call('incr', fence)
  if token == 1 then
    token = clock_us()
    call('set', fence, string.format('%d', token), 'PX', 100)
  end
  return token, string.format('%d', token)
end

-- A fresh token for a read-write lock's counter, which lives as long as
-- the lock (rw_lock.lua sets its expiry): last + 1, raised to the server's
-- TIME in microseconds when the counter is missing and to that time's
-- 100 ms floor when it is behind it (a replica that missed the last
-- increments), with the same bounds as above.
local function next_token(fence)
  local now = clock_us()
  local token = call('incr', fence)
  local least = token == 1 and now or now - now % 100000
  if token < least then
    token = least
    call('set', fence, string.format('%d', token))
  end
  return token
end

-- A lock's value (see "lock" above).
local function hold_value(count, nonce, flag, owner, token)
  return count .. ' ' .. nonce .. ' ' .. flag .. ' ' .. owner .. ' ' .. token
end

-- The fields of a lock's value: count (a string), nonce, flag, owner,
-- token (a string); an error for a string hasp did not write.
local function parse_hold(lock, value)
  local count, nonce, flag, owner, token = string.match(value, '^(%d+) (%S+) (%S+) (.*) (%d+)$')
  if not count then
    error('hasp: ' .. lock .. ' holds a value that is not a lock')
  end
  return count, nonce, flag, owner, token
end

-- The fields of a lock's value, or nothing if the lock is free.
local function read_hold(lock)
  local value = call('get', lock)
  if value then
    return parse_hold(lock, value)
  end
end

local function free(lock, message, flag)
  call('del', lock)
  if flag ~= '-' then
    released(lock, message)
  end
end

-- Takes the lock for hold's owner, or flags the caller as waiting. A
-- plain lock (`fenced` false, plain_lock.lua) has no counter: its holds'
-- token is 1.
local function acquire(lock, hold, lease, flag_waiting, fenced)
  local token, digits = 1, '1'
  if fenced then
    token, digits = fresh_token(lock .. ':fence')
  end
  local held = call('set', lock, hold .. ' ' .. digits, 'NX', 'PX', lease, 'GET')
  if not held then
    return token
  end
  local nonce, owner = string.match(hold, '^%d+ (%S+) %S+ (.*)$')
  local count, last, flag, holder, kept = parse_hold(lock, held)
  if holder == owner then
    call('set', lock, hold_value(tonumber(count) + 1, nonce, flag, owner, kept), 'PX', lease)
    return tonumber(kept)
  end
  if flag_waiting and flag ~= client and flag ~= '*' then
    flag = flag == '-' and client or '*'
    call('set', lock, hold_value(count, last, flag, holder, kept), 'KEEPTTL')
  end
  local ttl = call('pttl', lock)
  if ttl > 0 then
    return -ttl
  elseif ttl == 0 then
    return -1 -- expiring now: ask again at once, not after a default
  end
  return 0
end

-- Gives back holds of a lock whose fields (read_hold's: count, nonce,
-- flag, holder, token; nothing for a free lock) the caller read; returns
-- -1 (owner does not hold it), the holds left, or 0 and the waiting flag
-- when none are left (the key is left for the caller to delete).
local function give_back_held(lock, owner, holds, nonce, count, _, flag, holder, token)
  if not count or holder ~= owner then
    return -1
  end
  -- Compared as strings first: a release usually gives back every hold.
  if count ~= holds and tonumber(count) > tonumber(holds) then
    local left = tonumber(count) - tonumber(holds)
    call('set', lock, hold_value(left, nonce, flag, owner, token), 'KEEPTTL')
    return left
  end
  return 0, flag
end

-- As give_back_held, freeing the lock when no hold is left.
local function release_held(lock, owner, holds, nonce, ...)
  local result, flagged = give_back_held(lock, owner, holds, nonce, ...)
  if result == 0 then
    free(lock, client, flagged)
  end
  return result
end

local function give_back(lock, owner, holds, nonce)
  return give_back_held(lock, owner, holds, nonce, read_hold(lock))
end

local function release(lock, owner, holds, nonce)
  return release_held(lock, owner, holds, nonce, read_hold(lock))
end

-- (fence: nil for a plain lock, whose heir's token is 1)
local function hand_off(lock, fence, owner, holds, nonce, heir, lease)
  local result, flagged = give_back(lock, owner, holds, nonce)
  if result == -1 then
    return -1
  elseif result ~= 0 then
    return 0
  end
  if flagged ~= '-' and flagged ~= client then
    free(lock, client, flagged)
    return -2
  end
  local token, digits = 1, '1'
  if fence then
    token, digits = fresh_token(fence)
  end
  call('set', lock, hold_value('1', nonce, flagged, heir, digits), 'PX', lease)
  return token
end

local function extend(lock, owner, lease, token)
  local _, _, _, holder, held = read_hold(lock)
  if holder ~= owner or held ~= token then
    return 0
  end
  if lease ~= '0' then
    call('pexpire', lock, lease)
  end
  return 1
end

local function undo(lock, owner, nonce)
  local count, last, flag, holder, token = read_hold(lock)
  if last ~= nonce then
    return -1
  end
  return release_held(lock, owner, '1', nonce, count, last, flag, holder, token)
end

local function settle(lock, owner, holds, nonce)
  local count, last, flag, holder, token = read_hold(lock)
  if last == nonce then
    return -1
  end
  return release_held(lock, owner, holds, nonce, count, last, flag, holder, token)
end

local function force(lock)
  if call('exists', lock) == 0 then
    return 0
  end
  free(lock, '*', '*')
  return 1
end

ops.a = { 1, 3, function(k, a)
  return acquire(K[k], ARGV[a + 2], ARGV[a + 1], false, true)
end }
ops.w = { 1, 3, function(k, a)
  return acquire(K[k], ARGV[a + 2], ARGV[a + 1], true, true)
end }
ops.r = { 1, 3, function(k, a)
  return release(K[k], ARGV[a + 1], '1', ARGV[a + 2])
end }
ops.R = { 1, 4, function(k, a)
  return release(K[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.h = { 2, 6, function(k, a)
  return hand_off(K[k], K[k + 1], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
end }
ops.e = { 1, 4, function(k, a)
  return extend(K[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.u = { 1, 3, function(k, a)
  return undo(K[k], ARGV[a + 1], ARGV[a + 2])
end }
ops.s = { 1, 4, function(k, a)
  return settle(K[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.f = { 1, 1, function(k)
  return force(K[k])
end }
