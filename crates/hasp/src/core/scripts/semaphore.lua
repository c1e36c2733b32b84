-- Semaphores: a capacity of permits, held by owners under leases, with a
-- queue of waiters served in order of arrival.
--
--   op  KEYS                             ARGV
--   pa  sem, grants, leases, queue, due  pa, owner, k, lease, nonce   take k permits
--                                                             now, never queue
--   pw  sem, grants, leases, queue, due  pw, owner, k, lease, nonce, waiter, wttl
--                                                             take k permits, or
--                                                             queue as waiter (or
--                                                             refresh its place)
--   pr  sem, grants, leases, queue, due  pr, owner, k, nonce          give back k permits
--   pe  sem, grants, leases, queue, due  pe, owner, lease             extend the owner's
--                                                             lease ('0': check)
--   pu  sem, grants, leases, queue, due  pu, owner, k, nonce          undo acquisition nonce
--   ps  sem, grants, leases, queue, due  ps, owner, k, nonce          give back k, unless
--                                                             release nonce was
--                                                             applied already
--   pq  sem, grants, leases, queue, due  pq, <k>|<waiter>             leave the queue
--   pv  sem, grants, leases, queue, due  pv                           available permits
--   pc  sem, grants, leases, queue, due  pc, mode, n, expiry          capacity: 'try' sets
--                                                             n if none is set
--                                                             (and the expiry, ms,
--                                                             if not '0'); 'set'
--                                                             sets n; 'add' adds n
--   pd  sem, grants, leases, queue, due  pd, owner, lease, nonce      take every permit
--                                                             available now
--   pl  sem, grants, leases, queue, due  pl, owner                    lease left
--
-- sem     hash: ':cap' = capacity (no expiry, unless 'try' set one)
-- grants  hash: ':held' = permits held by live grants; <owner> = permits the
--         owner holds; ':n:<owner>' = the nonce of the last operation that
--         changed the owner's permits (see lock.lua's "nonce": 'pu' and 'ps'
--         settle lost replies as 'u' and 's' do)
-- leases  zset: owner -> the end of its lease, server milliseconds. A grant
--         whose end has come holds nothing: every operation first removes
--         up to 100 of them and gives their permits back. grants and leases
--         expire together when the last lease ends, so an idle semaphore
--         keeps only its capacity
-- queue, due  the line of waiters (see line.lua)
--
-- Order. A waiter may take its k permits when they are free after the
-- permits the live waiters ahead of it want: so a request for many is not
-- starved by a stream of small ones, and a small one behind it is served
-- first only when both fit. 'pa' and 'pd' count as arriving last.
--
-- Wake-ups. When permits may have become free for the head of the queue (a
-- release, a lease that ended, a new capacity, a waiter that left), the
-- script publishes the waiters at the head that now fit (see line.lua) on
-- <sem>:released.
--
-- Each operation answers an integer:
--   pa, pw  1    taken
--           -t   not taken; ask again in t ms (when the first lease, or the
--                place of the waiter at the head, ends)
--           0    not taken, and no lease is running
--   pr, ps  -1   the owner does not hold k permits (nothing changed)
--           n    permits the owner still holds (0: none, its lease is gone)
--   pu      as pr
--   pe      1 held (and re-armed), 0 not held
--   pq      1 left the queue, 0 was not in it
--   pv      capacity - permits held (negative after the capacity was lowered)
--   pc      1 done; 0 ('try') a capacity was set already; -1 ('add') the
--           capacity would go below zero (nothing changed)
--   pd      permits taken (0: none)
--   pl      ms left on the owner's lease, -1 when it holds nothing

-- Forgets owners' grants; with no lease left, the grants too.
local function drop_owners(grants, leases, owners)
  call('zrem', leases, unpack(owners))
  if call('exists', leases) == 0 then
    call('del', grants)
    return
  end
  for _, owner in ipairs(owners) do
    call('hdel', grants, owner, ':n:' .. owner)
  end
end

-- Gives back the permits of grants whose lease has ended (at most 100).
local function purge_grants(grants, leases, now)
  local ended = call('zrangebyscore', leases, '-inf', now, 'LIMIT', 0, 100)
  if #ended == 0 then
    return false
  end
  local freed = 0
  for _, owner in ipairs(ended) do
    freed = freed + (tonumber(call('hget', grants, owner)) or 0)
  end
  if freed > 0 then
    call('hincrby', grants, ':held', -freed)
  end
  drop_owners(grants, leases, ended)
  return true
end

local function free_permits(sem, grants)
  local cap = tonumber(call('hget', sem, ':cap')) or 0
  return cap - (tonumber(call('hget', grants, ':held')) or 0)
end

-- Permits the waiters ahead of member want (all waiters if member is not
-- queued); nil when more than 100 are ahead.
local function wanted_ahead(queue, member)
  local rank = member and call('zrank', queue, member)
  if rank then
    if rank > 100 then
      return nil
    end
  elseif call('zcard', queue) > 100 then
    return nil
  end
  local last = rank and rank - 1 or 99
  local sum = 0
  if last >= 0 then
    for _, m in ipairs(call('zrange', queue, 0, last)) do
      sum = sum + wanted(m)
    end
  end
  return sum
end

-- Publishes the waiters at the head of the queue whose permits are free.
local function wake(sem, grants, queue)
  local heads = call('zrange', queue, 0, 99)
  if #heads == 0 then
    return
  end
  local free = free_permits(sem, grants)
  local ids = {}
  for _, m in ipairs(heads) do
    local k = wanted(m)
    if k > free then
      break
    end
    free = free - k
    ids[#ids + 1] = waiter_of(m)
  end
  if #ids > 0 then
    released(sem, '>' .. table.concat(ids, ','))
  end
end

-- Removes ended grants and places; wakes the head if permits came back.
local function tidy(sem, grants, leases, queue, due, now)
  local freed = purge_grants(grants, leases, now)
  local left = purge_waiters(queue, due, now)
  if freed or left then
    wake(sem, grants, queue)
  end
end

local function grant(grants, leases, owner, k, lease, nonce, now)
  call('hincrby', grants, owner, k)
  call('hincrby', grants, ':held', k)
  call('hset', grants, ':n:' .. owner, nonce)
  call('zadd', leases, now + lease, owner)
  expire_at_last(leases, leases, grants)
end

local function first_lease_ends(leases, now)
  local first = call('zrange', leases, 0, 0, 'WITHSCORES')
  if first[2] then
    return math.max(tonumber(first[2]) - now, 1)
  end
  return nil
end

local function take(sem, grants, leases, queue, due, owner, k, lease, nonce, waiter, wttl)
  local now = clock_ms()
  tidy(sem, grants, leases, queue, due, now)
  k = tonumber(k)
  local member = waiter and (k .. '|' .. waiter)
  local ahead = wanted_ahead(queue, member)
  if ahead and k + ahead <= free_permits(sem, grants) then
    grant(grants, leases, owner, k, lease, nonce, now)
    if member and leave_line(queue, due, member) then
      -- Others behind may fit too; they were told when these permits
      -- came free, but not if they arrived since.
      wake(sem, grants, queue)
    end
    return 1
  end
  if member then
    join_line(queue, due, member, now, wttl)
  end
  -- Ask again when the first lease ends, or the place of the waiter at the
  -- head (it is told when its permits are free; if it is dead, it is purged
  -- then).
  local wait = sooner(first_lease_ends(leases, now), head_due_in(queue, due, member, now))
  return wait and -wait or 0
end

local function give(sem, grants, leases, queue, due, owner, k, nonce)
  local now = clock_ms()
  tidy(sem, grants, leases, queue, due, now)
  k = tonumber(k)
  local has = tonumber(call('hget', grants, owner))
  if not has or has < k then
    return -1
  end
  local left = has - k
  call('hincrby', grants, ':held', -k)
  if left == 0 then
    drop_owners(grants, leases, { owner })
  else
    call('hset', grants, owner, left, ':n:' .. owner, nonce)
  end
  wake(sem, grants, queue)
  return left
end

local function prolong(grants, leases, owner, lease)
  local now = clock_ms()
  local ends = tonumber(call('zscore', leases, owner))
  if not ends or ends <= now then
    return 0
  end
  if lease ~= '0' then
    call('zadd', leases, now + lease, owner)
    expire_at_last(leases, leases, grants)
  end
  return 1
end

local function leave(sem, grants, queue, due, waiter_member)
  local rank = leave_line(queue, due, waiter_member)
  if not rank then
    return 0
  end
  if rank == 0 then
    wake(sem, grants, queue)
  end
  return 1
end

local function resize(sem, grants, queue, mode, n, expiry)
  n = tonumber(n)
  if mode == 'try' then
    if call('hexists', sem, ':cap') == 1 then
      return 0
    end
    call('hset', sem, ':cap', n)
    if expiry ~= '0' then
      call('pexpire', sem, expiry)
    end
  elseif mode == 'set' then
    call('hset', sem, ':cap', n)
  else
    local cap = (tonumber(call('hget', sem, ':cap')) or 0) + n
    if cap < 0 then
      return -1
    end
    call('hset', sem, ':cap', cap)
  end
  wake(sem, grants, queue)
  return 1
end

local function drain(sem, grants, leases, queue, due, owner, lease, nonce)
  local now = clock_ms()
  tidy(sem, grants, leases, queue, due, now)
  local ahead = wanted_ahead(queue, nil)
  local k = ahead and free_permits(sem, grants) - ahead or 0
  if k <= 0 then
    return 0
  end
  grant(grants, leases, owner, k, lease, nonce, now)
  return k
end

local function lease_left(leases, owner)
  local now = clock_ms()
  local ends = tonumber(call('zscore', leases, owner))
  if not ends or ends <= now then
    return -1
  end
  return ends - now
end

ops.pa = { 5, 5, function(k, a)
  return take(K[k], K[k + 1], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[a + 4], nil, nil)
end }
ops.pw = { 5, 7, function(k, a)
  return take(K[k], K[k + 1], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6])
end }
local function release_op(k, a)
  return give(K[k], K[k + 1], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3])
end
ops.pr = { 5, 4, release_op }
ops.pe = { 5, 3, function(k, a)
  return prolong(K[k + 1], K[k + 2], ARGV[a + 1], ARGV[a + 2])
end }
ops.pu = { 5, 4, function(k, a)
  if call('hget', K[k + 1], ':n:' .. ARGV[a + 1]) ~= ARGV[a + 3] then
    return -1
  end
  return release_op(k, a)
end }
ops.ps = { 5, 4, function(k, a)
  if call('hget', K[k + 1], ':n:' .. ARGV[a + 1]) == ARGV[a + 3] then
    return -1
  end
  return release_op(k, a)
end }
ops.pq = { 5, 2, function(k, a)
  return leave(K[k], K[k + 1], K[k + 3], K[k + 4], ARGV[a + 1])
end }
ops.pv = { 5, 1, function(k)
  tidy(K[k], K[k + 1], K[k + 2], K[k + 3], K[k + 4], clock_ms())
  return free_permits(K[k], K[k + 1])
end }
ops.pc = { 5, 4, function(k, a)
  return resize(K[k], K[k + 1], K[k + 3], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3])
end }
ops.pd = { 5, 4, function(k, a)
  return drain(K[k], K[k + 1], K[k + 2], K[k + 3], K[k + 4], ARGV[a + 1], ARGV[a + 2],
    ARGV[a + 3])
end }
ops.pl = { 5, 2, function(k, a)
  return lease_left(K[k + 2], ARGV[a + 1])
end }
