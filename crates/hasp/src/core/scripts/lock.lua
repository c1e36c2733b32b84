-- Locks: a reentrant lock per name, with fencing tokens.
--
--   op  KEYS          ARGV
--   a   lock, fence   a, owner, lease, nonce        acquire
--   w   lock, fence   w, owner, lease, nonce        acquire; if held by another
--                                                   owner, flag this client as
--                                                   waiting for it
--   r   lock          r, owner, holds, nonce        release holds
--   h   lock, fence   h, owner, holds, nonce, heir, lease
--                                                   release; if that frees the
--                                                   lock, hand it to heir
--   e   lock          e, owner, lease               extend the lease ('0': only
--                                                   check that owner holds it)
--   u   lock          u, owner, nonce               undo: if operation nonce gave
--                                                   owner a hold that is still
--                                                   the last change, release it
--   s   lock          s, owner, holds, nonce        release, unless release nonce
--                                                   was applied already
--   f   lock          f                             free the lock, whoever holds it
--
-- lock    hash: field <owner> = hold count; ':w' = the id of the client whose
--         tasks wait, '*' once two clients did (since the lock was last free);
--         ':o' = the nonce of the last operation that changed a hold count
-- fence   the fencing counter: a string without TTL in the lock's slot, the
--         last token issued for the name (the holder's, while it is held)
-- owner   owner id (never starts with ':', so it cannot clash with a field)
-- lease   milliseconds, >= 1 (the client never sends more than Redis takes)
-- holds   how many holds to give back (1, or more when tasks sharing an owner
--         both reached Redis)
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
--         a little). Freeing a lock deletes its hash, flag included, so the
--         flag names only clients that started waiting since.
--
-- The release channel is not a key: it is <lock>:released (see keys.rs).
--
-- Tokens. A fresh token is last + 1, raised to the server's TIME in
-- microseconds when the counter is missing and to that time's 100 ms floor
-- when the counter is behind it. So a token never exceeds its issue time in
-- microseconds (while a name is taken at most once a microsecond), and
-- tokens for a name never repeat or go back: not after Redis lost the
-- counter (restart without persistence: the next token is the time now),
-- nor after a failover to a replica that missed the last increments, if
-- the failover took 100 ms or more (Sentinel and Cluster take seconds) —
-- provided the server's clock is not stepped back.
--
-- Each operation answers an integer:
--   a, w  token >= 1   acquired: a free lock gets a fresh token; a hold of
--                      the owner (through another client) is re-entered and
--                      keeps its token, the counter's value
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

-- Fresh tokens (see "Tokens" above). The common case is one
-- INCR: the counter is written again only when it is missing (its data was
-- lost: seeded with the exact microseconds) or behind the clock's 100 ms
-- floor (a replica that missed the last increments: at most once per 100
-- ms per name).
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

local function free(lock, message, flagged)
  call('del', lock)
  if flagged then
    call('publish', lock .. ':released', message)
  end
end

local function acquire(lock, fence, owner, lease, nonce, flag)
  if call('exists', lock) == 0 then
    local token = next_token(fence)
    call('hset', lock, owner, '1', ':o', nonce)
    call('pexpire', lock, lease)
    return token
  end
  if call('hexists', lock, owner) == 1 then
    -- A counter deleted behind our back still yields a valid token.
    local token = tonumber(call('get', fence)) or next_token(fence)
    call('hincrby', lock, owner, '1')
    call('hset', lock, ':o', nonce)
    call('pexpire', lock, lease)
    return token
  end
  if flag then
    local flagged = call('hget', lock, ':w')
    if not flagged then
      call('hset', lock, ':w', client)
    elseif flagged ~= client and flagged ~= '*' then
      call('hset', lock, ':w', '*')
    end
  end
  local ttl = call('pttl', lock)
  if ttl > 0 then
    return -ttl
  elseif ttl == 0 then
    return -1 -- expiring now: ask again at once, not after a default
  end
  return 0
end

-- Gives back holds; returns -1, 0 (freed) or the holds left, and the
-- waiting flag when the lock was freed.
local function give_back(lock, owner, holds, nonce)
  local held = call('hmget', lock, owner, ':w')
  local count = held[1]
  if not count then
    return -1
  end
  -- Compared as strings first: a release usually gives back every hold.
  if count ~= holds and tonumber(count) > tonumber(holds) then
    local left = tonumber(count) - tonumber(holds)
    call('hset', lock, owner, tostring(left), ':o', nonce)
    return left
  end
  return 0, held[2] or false
end

local function release(lock, owner, holds, nonce)
  local result, flagged = give_back(lock, owner, holds, nonce)
  if result == 0 then
    free(lock, client, flagged)
  end
  return result
end

local function hand_off(lock, fence, owner, holds, nonce, heir, lease)
  local result, flagged = give_back(lock, owner, holds, nonce)
  if result == -1 then
    return -1
  elseif result ~= 0 then
    return 0
  end
  if flagged and flagged ~= client then
    free(lock, client, true)
    return -2
  end
  local token = next_token(fence)
  call('hdel', lock, owner)
  call('hset', lock, heir, '1', ':o', nonce)
  call('pexpire', lock, lease)
  return token
end

local function extend(lock, owner, lease)
  if call('hexists', lock, owner) == 0 then
    return 0
  end
  if lease ~= '0' then
    call('pexpire', lock, lease)
  end
  return 1
end

local function undo(lock, owner, nonce)
  local held = call('hmget', lock, owner, ':o')
  if held[1] and held[2] == nonce then
    return release(lock, owner, '1', nonce)
  end
  return -1
end

local function settle(lock, owner, holds, nonce)
  if call('hget', lock, ':o') == nonce then
    return -1
  end
  return release(lock, owner, holds, nonce)
end

local function force(lock)
  if call('exists', lock) == 0 then
    return 0
  end
  free(lock, '*', true)
  return 1
end
