-- A line of waiters kept in Redis, for the kinds that serve waiters of
-- every client in order of arrival (fair lock, semaphore).
--
-- queue   zset: '<k>|<waiter>' -> order of arrival (k: what the waiter
--         wants, 1 for a lock)
-- due     zset: the same members -> the end of the waiter's place, server
--         milliseconds. A waiter refreshes its place each time it asks; one
--         that stops asking (its process died) is removed once its place
--         ends, at most 100 per call, so a line of dead waiters never holds
--         Redis for long and is gone within a few calls
-- waiter  an id unique per wait ('<client id>/<nonce>'), without ',' or '|'
--
-- Waking. A kind publishes '>' and the ids of the waiters it serves next,
-- comma-separated, on its channel; each client wakes exactly those of its
-- own waiters.

-- Sets key (and also_key) to expire when the last deadline in the zset
-- at_key ends.
local function expire_at_last(at_key, key, also_key)
  local last = call('zrange', at_key, -1, -1, 'WITHSCORES')
  if last[2] then
    call('pexpireat', key, last[2])
    if also_key then
      call('pexpireat', also_key, last[2])
    end
  end
end

-- Removes waiters whose place has ended (at most 100); true if any.
local function purge_waiters(queue, due, now)
  local dead = call('zrangebyscore', due, '-inf', now, 'LIMIT', 0, 100)
  if #dead > 0 then
    call('zrem', due, unpack(dead))
    call('zrem', queue, unpack(dead))
  end
  return #dead > 0
end

local function wanted(member)
  return tonumber(string.match(member, '^(%d+)|'))
end

local function waiter_of(member)
  return string.sub(member, string.find(member, '|', 1, true) + 1)
end

-- Queues member if it is not queued, and (re)sets the end of its place.
local function join_line(queue, due, member, now, ttl)
  if not call('zscore', queue, member) then
    local last = call('zrange', queue, -1, -1, 'WITHSCORES')
    call('zadd', queue, (tonumber(last[2]) or 0) + 1, member)
  end
  call('zadd', due, now + ttl, member)
  expire_at_last(due, due, queue)
end

-- Removes member; returns the rank it had, or nil if it was not queued.
local function leave_line(queue, due, member)
  local rank = call('zrank', queue, member)
  if rank then
    call('zrem', queue, member)
    call('zrem', due, member)
  end
  return rank
end

-- Milliseconds until the place of the head of the line ends, if the head
-- is not member (nil: no such head). A waiter behind a head asks again by
-- then: if the head's process died, it is purged then, and the next moves
-- up without a message.
local function head_due_in(queue, due, member, now)
  local head = call('zrange', queue, 0, 0)[1]
  if not head or head == member then
    return nil
  end
  return math.max((tonumber(call('zscore', due, head)) or now) - now, 1)
end

-- The sooner of two hints (either may be nil).
local function sooner(a, b)
  if a and b then
    return math.min(a, b)
  end
  return a or b
end
