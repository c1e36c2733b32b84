-- Plain locks: the reentrant lock without a fencing token, under keys of
-- its own (<lock> is '<prefix>:{<name>}:plain'). Its value is the lock's
-- ('<count> <nonce> <flag> <owner>', lock.lua), so releasing, undoing and
-- settling it are the lock's own operations (r, R, u, s, f); only what
-- touches the fencing counter differs, and is here.
--
--   op  KEYS   ARGV
--   na  lock   na, lease, hold          acquire (see lock.lua's a)
--   nw  lock   nw, lease, hold          acquire, or flag this client as
--                                       waiting (lock.lua's w)
--   nh  lock   nh, owner, holds, nonce, heir, lease
--                                       release; if that frees the lock,
--                                       hand it to heir (lock.lua's h)
--   ne  lock   ne, owner, lease         extend the lease of owner's hold
--                                       ('0': only check that owner holds it)
--
-- A free plain lock is usually taken without this library: one
-- `SET <lock> <hold> NX PX <lease>` (the client falls back to na or nw when
-- that finds the lock held). On a server with conditional commands
-- (Valkey 9: DELIFEQ, SET IFEQ) the last release of a hold whose value is
-- still the one its acquisition wrote, and the renewal of such a hold, are
-- native commands too.
--
-- Each operation answers an integer:
--   na, nw  1 acquired (or re-entered: a hold of the owner through another
--           client); -ttl, 0: held by another owner, as lock.lua's a
--   nh      as lock.lua's h, with 1 for the heir's token
--   ne      1 renewed (or held), 0 not held by owner (nothing changed)

ops.na = { 1, 3, function(k, a)
  return acquire(K[k], ARGV[a + 2], ARGV[a + 1], false, false)
end }
ops.nw = { 1, 3, function(k, a)
  return acquire(K[k], ARGV[a + 2], ARGV[a + 1], true, false)
end }
ops.nh = { 1, 6, function(k, a)
  return hand_off(K[k], nil, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
end }
ops.ne = { 1, 3, function(k, a)
  local _, _, _, holder = read_hold(K[k])
  if holder ~= ARGV[a + 1] then
    return 0
  end
  if ARGV[a + 2] ~= '0' then
    call('pexpire', K[k], ARGV[a + 2])
  end
  return 1
end }
