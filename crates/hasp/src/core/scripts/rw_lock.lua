-- Read-write locks: many readers or one writer, each hold with a lease of
-- its own, a line of waiters (line.lua) that gives waiting writers
-- preference over new readers, and fencing tokens for writes.
--
--   op  KEYS                              ARGV
--   ya  rw, fence, leases, queue, due     ya, side, owner, lease, nonce, waiter,
--                                         wttl, prefer
--                                         acquire side ('r' read, 'w' write);
--                                         waiter '' for a try, which never
--                                         queues; prefer '1': a reader ignores
--                                         waiting writers (reader preference)
--   yr  rw, fence, leases, queue, due     yr, side, owner, holds, nonce
--                                         release holds of side
--   ye  rw, fence, leases, queue, due     ye, side, owner, lease
--                                         extend ('0': only check)
--   yu  rw, fence, leases, queue, due     yu, side, owner, holds, nonce
--                                         undo
--   ys  rw, fence, leases, queue, due     ys, side, owner, holds, nonce
--                                         settle
--   yq  rw, fence, leases, queue, due     yq, member                 leave line
--
-- rw      hash: 'w:<owner>' = write holds, 'r:<owner>' = read holds;
--         ':writer' = the owner holding the write lock; ':rc' = owners
--         holding reads; ':n:<side>:<owner>' = nonce of the last operation
--         that changed that count (lock.lua's "nonce")
-- leases  zset: '<side>:<owner>' -> end of that hold's lease (server ms).
--         Ended holds are given back by every operation (100 at most per
--         call). rw, leases and fence expire together when the last lease
--         ends
-- fence   the fencing counter (lock.lua's "fence"); so a read of a lock
--         whose last lease has ended gets 0 for "no write remembered"
-- queue, due  the line (line.lua); members 'W|<waiter>' (a writer),
--         'R|<waiter>' (a reader), 'P|<waiter>' (a reader that prefers
--         readers)
--
-- Rules. A writer enters when nobody holds the lock and nobody waits ahead
-- of it. A reader enters when no writer holds it and no writer waits ahead
-- of it (a preferring reader: when no writer holds it). The owner that
-- holds the write lock may also read; a reader that re-reads enters at once
-- (the client does both without a call, unless its hold is gone). A reader
-- asking to write fails with UPGRADE: it would wait for itself.
--
-- Each operation answers an integer:
--   ya  w: token >= 1 acquired (re-entry keeps its token); r: 1 + the token
--       of the last write (0 if none) when acquired; both: -t not acquired,
--       ask again in t ms; 0 not acquired, no hint
--   yr, ys  -1 not held, 0 that side's holds are gone, n holds left
--   yu  as yr
--   ye  1 held (and re-armed), 0 not held
--   yq  1 left the line, 0 was not in it

local function rw_expire(rw, fence, leases)
  local last = call('zrange', leases, -1, -1, 'WITHSCORES')
  if last[2] then
    call('pexpireat', leases, last[2])
    call('pexpireat', rw, last[2])
    call('pexpireat', fence, last[2])
  end
end

local function rw_forget(rw, leases, field)
  call('hdel', rw, field, ':n:' .. field)
  call('zrem', leases, field)
  if string.sub(field, 1, 1) == 'w' then
    call('hdel', rw, ':writer')
  else
    call('hincrby', rw, ':rc', -1)
  end
  if call('exists', leases) == 0 then
    call('del', rw)
  end
end

-- Wakes the waiters at the head of the line that can enter now.
local function rw_wake(rw, queue)
  local members = call('zrange', queue, 0, 99)
  if #members == 0 then
    return
  end
  local writer = call('hget', rw, ':writer')
  local readers = tonumber(call('hget', rw, ':rc')) or 0
  local writer_ahead = writer and true or false
  local ids = {}
  for i, m in ipairs(members) do
    local kind = string.sub(m, 1, 1)
    if kind == 'W' then
      if i == 1 and not writer and readers == 0 then
        ids[#ids + 1] = waiter_of(m)
      end
      writer_ahead = true
    elseif kind == 'P' then
      if not writer then
        ids[#ids + 1] = waiter_of(m)
      end
    elseif not writer_ahead then
      ids[#ids + 1] = waiter_of(m)
    end
  end
  if #ids > 0 then
    released(rw, '>' .. table.concat(ids, ','))
  end
end

-- Gives back holds whose lease ended and removes ended places; wakes the
-- line if anything changed.
local function rw_tidy(rw, leases, queue, due, now)
  local ended = call('zrangebyscore', leases, '-inf', now, 'LIMIT', 0, 100)
  for _, field in ipairs(ended) do
    rw_forget(rw, leases, field)
  end
  if purge_waiters(queue, due, now) or #ended > 0 then
    rw_wake(rw, queue)
  end
end

-- Whether a writer waits in line ahead of member (anywhere, if member is
-- not queued); true when more than 100 are ahead.
local function writer_ahead_of(queue, member)
  local rank = member and call('zrank', queue, member)
  local last = rank and rank - 1 or 99
  if not rank and call('zcard', queue) > 100 then
    return true
  end
  if rank and rank > 100 then
    return true
  end
  if last < 0 then
    return false
  end
  for _, m in ipairs(call('zrange', queue, 0, last)) do
    if string.sub(m, 1, 1) == 'W' then
      return true
    end
  end
  return false
end

local function rw_hold(rw, fence, leases, field, lease, nonce, now)
  local count = call('hincrby', rw, field, 1)
  call('hset', rw, ':n:' .. field, nonce)
  call('zadd', leases, now + lease, field)
  rw_expire(rw, fence, leases)
  return count
end

local function rw_acquire(rw, fence, leases, queue, due, side, owner, lease, nonce, waiter, wttl,
                          prefer)
  local now = clock_ms()
  rw_tidy(rw, leases, queue, due, now)
  local writer = call('hget', rw, ':writer')
  local field = side .. ':' .. owner
  local member
  if waiter ~= '' then
    local kind = side == 'w' and 'W' or (prefer == '1' and 'P' or 'R')
    member = kind .. '|' .. waiter
  end
  if side == 'w' then
    if writer == owner then
      -- A counter deleted behind our back still yields a valid token.
      local token = tonumber(call('get', fence)) or next_token(fence)
      rw_hold(rw, fence, leases, field, lease, nonce, now)
      return token
    end
    if call('hexists', rw, 'r:' .. owner) == 1 then
      error('UPGRADE: a read hold cannot be upgraded to write')
    end
    local readers = tonumber(call('hget', rw, ':rc')) or 0
    if not writer and readers == 0 then
      local rank = member and call('zrank', queue, member)
      if rank == 0 or call('zcard', queue) == 0 then
        local token = next_token(fence)
        rw_hold(rw, fence, leases, field, lease, nonce, now)
        call('hset', rw, ':writer', owner)
        if rank then
          leave_line(queue, due, member)
        end
        return token
      end
    end
  else
    local entered = call('hexists', rw, field) == 1 or writer == owner
    if not entered and not writer then
      entered = prefer == '1' or not writer_ahead_of(queue, member)
    end
    if entered then
      if rw_hold(rw, fence, leases, field, lease, nonce, now) == 1 then
        call('hincrby', rw, ':rc', 1)
      end
      if member and leave_line(queue, due, member) then
        rw_wake(rw, queue) -- readers behind it may enter too
      end
      return 1 + (tonumber(call('get', fence)) or 0)
    end
  end
  if member then
    join_line(queue, due, member, now, wttl)
  end
  -- Ask again when the first hold ends, or the place of the head.
  local first = call('zrange', leases, 0, 0, 'WITHSCORES')
  local ends = first[2] and math.max(tonumber(first[2]) - now, 1) or nil
  local wait = sooner(ends, head_due_in(queue, due, member, now))
  return wait and -wait or 0
end

local function rw_release(rw, leases, queue, due, side, owner, holds, nonce)
  rw_tidy(rw, leases, queue, due, clock_ms())
  local field = side .. ':' .. owner
  local count = tonumber(call('hget', rw, field))
  if not count then
    return -1
  end
  if count > tonumber(holds) then
    local left = count - tonumber(holds)
    call('hset', rw, field, left, ':n:' .. field, nonce)
    return left
  end
  rw_forget(rw, leases, field)
  rw_wake(rw, queue)
  return 0
end

local function rw_extend(rw, fence, leases, side, owner, lease)
  local now = clock_ms()
  local field = side .. ':' .. owner
  local ends = tonumber(call('zscore', leases, field))
  if not ends or ends <= now then
    return 0
  end
  if lease ~= '0' then
    call('zadd', leases, now + lease, field)
    rw_expire(rw, fence, leases)
  end
  return 1
end

ops.ya = { 5, 8, function(k, a)
  return rw_acquire(K[k], K[k + 1], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6], ARGV[a + 7])
end }
ops.yr = { 5, 5, function(k, a)
  return rw_release(K[k], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4])
end }
ops.ye = { 5, 4, function(k, a)
  return rw_extend(K[k], K[k + 1], K[k + 2], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.yu = { 5, 5, function(k, a)
  local field = ARGV[a + 1] .. ':' .. ARGV[a + 2]
  if call('hget', K[k], ':n:' .. field) ~= ARGV[a + 4] then
    return -1
  end
  return rw_release(K[k], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4])
end }
ops.ys = { 5, 5, function(k, a)
  local field = ARGV[a + 1] .. ':' .. ARGV[a + 2]
  if call('hget', K[k], ':n:' .. field) == ARGV[a + 4] then
    return -1
  end
  return rw_release(K[k], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3],
    ARGV[a + 4])
end }
ops.yq = { 5, 2, function(k, a)
  local rank = leave_line(K[k + 3], K[k + 4], ARGV[a + 1])
  if not rank then
    return 0
  end
  if rank == 0 then
    rw_wake(K[k], K[k + 3])
  end
  return 1
end }
