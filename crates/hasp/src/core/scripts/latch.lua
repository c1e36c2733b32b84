-- Count-down latches: a count that any client lowers; waiters (any
-- client) are told when it reaches zero.
--
--   op  KEYS        ARGV
--   la  latch, ids  la, n, expiry     arm with n (>= 1) if absent or completed;
--                                     the latch expires after expiry ms ('0':
--                                     never)
--   ld  latch, ids  ld, id, done_ttl  count down once; with an id ('' for
--                                     none), at most once per id while it
--                                     counts
--   lx  latch, ids  lx                delete
--
-- latch   hash: 'n' = the count left; 0 = completed: a tombstone that lives
--         done_ttl ms, so that a waiter arriving late returns at once
-- ids     set: the ids counted so far (deleted when the latch completes)
--
-- Messages on <latch>:released: 'set' when armed, '0' when completed,
-- 'deleted' when deleted.
--
-- Each operation answers an integer:
--   la  1 armed, 0 still counting (nothing changed)
--   ld  -1 never set (no key created), else the count left (0: completed;
--       a count down below zero changes nothing)
--   lx  1 deleted, 0 there was none

local function arm(latch, ids, n, expiry)
  local count = tonumber(call('hget', latch, 'n'))
  if count and count > 0 then
    return 0
  end
  call('del', ids)
  call('hset', latch, 'n', n)
  if expiry ~= '0' then
    call('pexpire', latch, expiry)
  else
    call('persist', latch)
  end
  released(latch, 'set')
  return 1
end

local function count_down(latch, ids, id, done_ttl)
  local count = tonumber(call('hget', latch, 'n'))
  if not count then
    return -1
  end
  if count <= 0 then
    return 0
  end
  if id ~= '' then
    if call('sadd', ids, id) == 0 then
      return count
    end
    local ttl = call('pttl', latch)
    if ttl > 0 then
      call('pexpire', ids, ttl)
    end
  end
  count = call('hincrby', latch, 'n', -1)
  if count == 0 then
    call('del', ids)
    call('pexpire', latch, done_ttl)
    released(latch, '0')
  end
  return count
end

local function delete(latch, ids)
  call('del', ids)
  if call('del', latch) == 0 then
    return 0
  end
  released(latch, 'deleted')
  return 1
end

ops.la = { 2, 3, function(k, a)
  return arm(K[k], K[k + 1], ARGV[a + 1], ARGV[a + 2])
end }
ops.ld = { 2, 3, function(k, a)
  return count_down(K[k], K[k + 1], ARGV[a + 1], ARGV[a + 2])
end }
ops.lx = { 2, 1, function(k)
  return delete(K[k], K[k + 1])
end }
