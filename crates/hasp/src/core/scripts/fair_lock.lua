-- Fair locks: a lock's value and fencing counter (lock.lua) plus a line of
-- waiters (line.lua), served in order of arrival across clients.
--
--   op  KEYS                      ARGV
--   fa  lock, fence, queue, due   fa, owner, lease, nonce, waiter, wttl
--                                 acquire when free and nobody waits ahead
--                                 (waiter '': a try, which never queues);
--                                 else queue as waiter, or refresh its place
--   fr  lock, fence, queue, due   fr, owner, holds, nonce    release holds
--   fe  lock, fence, queue, due   fe, owner, lease, token    renew (as 'e')
--   fu  lock, fence, queue, due   fu, owner, holds, nonce    undo (as 'u')
--   fs  lock, fence, queue, due   fs, owner, holds, nonce    settle (as 's')
--   fq  lock, fence, queue, due   fq, <1|waiter>             leave the line
--
-- A lock that becomes free (released, its holder's lease ended, a dead
-- head purged) is published to the head of the line only: '>' and its id.
-- Re-entry by the holder is immediate: fairness is between owners.
--
-- Each operation answers an integer:
--   fa      token >= 1 acquired (a re-entry keeps its token); -t not
--           acquired: ask again in t ms (when the holder's lease or the
--           place of the waiter at the head ends, whichever is sooner); 0
--           not acquired, no hint
--   fr, fs  -1 not held by owner, 0 freed, n holds left
--   fe      as e
--   fu      as fr
--   fq      1 left the line, 0 was not in it

local function wake_head(lock, queue)
  local head = call('zrange', queue, 0, 0)[1]
  if head then
    released(lock, '>' .. waiter_of(head))
  end
end

local function fair_tidy(lock, queue, due, now)
  if purge_waiters(queue, due, now) and call('exists', lock) == 0 then
    wake_head(lock, queue)
  end
end

local function fair_acquire(lock, fence, queue, due, owner, lease, nonce, waiter, wttl)
  local now = clock_ms()
  fair_tidy(lock, queue, due, now)
  local count, _, flag, holder, kept = read_hold(lock)
  if holder == owner then
    call('set', lock, hold_value(tonumber(count) + 1, nonce, flag, owner, kept), 'PX', lease)
    return tonumber(kept)
  end
  local member = waiter ~= '' and ('1|' .. waiter) or nil
  if not count then
    local rank = member and call('zrank', queue, member)
    if rank == 0 or call('zcard', queue) == 0 then
      local token, digits = fresh_token(fence)
      call('set', lock, hold_value('1', nonce, '-', owner, digits), 'PX', lease)
      if rank then
        leave_line(queue, due, member)
      end
      return token
    end
  end
  if member then
    join_line(queue, due, member, now, wttl)
  end
  -- Ask again when the holder's lease ends, or when the place of the
  -- waiter at the head ends (it is told when the lock is free; if it is
  -- dead, it is purged then).
  local ttl = call('pttl', lock)
  local wait = sooner(ttl > 0 and ttl or nil, head_due_in(queue, due, member, now))
  return wait and -wait or 0
end

local function fair_release(lock, queue, due, owner, holds, nonce)
  fair_tidy(lock, queue, due, clock_ms())
  local result = give_back(lock, owner, holds, nonce)
  if result == 0 then
    call('del', lock)
    wake_head(lock, queue)
  end
  return result
end

local function fair_leave(lock, queue, due, member)
  local rank = leave_line(queue, due, member)
  if not rank then
    return 0
  end
  if rank == 0 and call('exists', lock) == 0 then
    wake_head(lock, queue)
  end
  return 1
end

ops.fa = { 4, 6, function(k, a)
  return fair_acquire(K[k], K[k + 1], K[k + 2], K[k + 3], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
end }
ops.fr = { 4, 4, function(k, a)
  return fair_release(K[k], K[k + 2], K[k + 3], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.fe = { 4, 4, function(k, a)
  return extend(K[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.fu = { 4, 4, function(k, a)
  local count, last, _, holder = read_hold(K[k])
  if count and holder == ARGV[a + 1] and last == ARGV[a + 3] then
    return fair_release(K[k], K[k + 2], K[k + 3], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
  end
  return -1
end }
ops.fs = { 4, 4, function(k, a)
  local _, last = read_hold(K[k])
  if last == ARGV[a + 3] then
    return -1
  end
  return fair_release(K[k], K[k + 2], K[k + 3], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.fq = { 4, 2, function(k, a)
  return fair_leave(K[k], K[k + 2], K[k + 3], ARGV[a + 1])
end }
