-- Every change hasp makes to its objects (locks, semaphores), many per
-- call. The client batches the operations its tasks have pending at the
-- same moment; each operation is applied in order and on its own, exactly
-- as if it had been sent alone: one that fails (a key of the wrong type)
-- answers its error in its own slot and changes nothing, and its
-- neighbours carry on.
--
-- The script is several files run as one: prelude.lua (this), lock.lua,
-- then the other kinds inside one function, `load_kinds`, that the
-- dispatch runs only when a call carries one of their operations (Redis
-- runs the whole script on every call: defining their functions every time
-- would cost the lock's calls), and dispatch.lua. The other kinds are
-- line.lua (a line of waiters, shared), fair.lua, rw.lua, permits.lua,
-- latch.lua and lease.lua; each registers its operations in `ops` under
-- their opcodes, with how many keys and arguments (the opcode included)
-- each takes. The lock's opcodes are dispatched directly.
--
-- ARGV[1] is the client's id: the payload of the release messages it
-- publishes (it ignores its own: it wakes its local waiters directly) and
-- the flag it leaves on a lock its tasks wait for. Then come the
-- operations, each taking the next keys and arguments, its opcode first.
--
-- Returns an array with one element per operation: a string 'failed: <the
-- error>' for an operation that failed, else the operation's integer.
local call = redis.call
-- Where the keys are: in KEYS; or, in a call to one Redis Cluster node that
-- spans several of its slots (declared keys must share one slot), among the
-- arguments: ARGV = '#k', n, <n keys>, client id, operations. Every key of
-- one operation still shares one slot.
local K, first_key, client, first_arg
if ARGV[1] == '#k' then
  local n = tonumber(ARGV[2])
  K, first_key, client, first_arg = ARGV, 3, ARGV[3 + n], 4 + n
else
  K, first_key, client, first_arg = KEYS, 1, ARGV[1], 2
end

-- opcode -> { keys, arguments (the opcode included), function(first key
-- index, opcode's argument index) }
local ops = {}

-- The server's clock in microseconds, read once per call (Redis freezes
-- time while a script runs). Every deadline hasp stores is computed from
-- it, never from a client's clock.
local now_us
local function clock_us()
  if not now_us then
    local now = call('time')
    now_us = now[1] * 1000000 + now[2]
  end
  return now_us
end

local function clock_ms()
  return math.floor(clock_us() / 1000)
end
