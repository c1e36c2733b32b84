-- Every change hasp makes to its objects (locks, semaphores), many per
-- call. The client batches the operations its tasks have pending at the
-- same moment; each operation is applied in order and on its own, exactly
-- as if it had been sent alone: one that fails (a key of the wrong type)
-- answers its error in its own slot and changes nothing, and its
-- neighbours carry on.
--
-- This is a function library (Redis 7.0): several files run as one when
-- the library is loaded, which defines every helper once; each FCALL then
-- runs only `batch` (dispatch.lua). The files are prelude.lua (this),
-- lock.lua, plain_lock.lua, line.lua (a line of waiters, shared), fair_lock.lua, rw_lock.lua,
-- semaphore.lua, latch.lua, lease.lua and dispatch.lua; each kind registers
-- its operations in `ops` under their opcodes, with how many keys and
-- arguments (the opcode included) each takes. The client adds the `redis.register_function` line
-- (scripts.rs).
--
-- Per call, ARGV[1] is the client's id: the payload of the release
-- messages it publishes (it ignores its own: it wakes its local waiters
-- directly) and the flag it leaves on a lock its tasks wait for. Then come
-- the operations, each taking the next keys and arguments, its opcode
-- first.
--
-- Returns an array with one element per operation: a string 'failed: <the
-- error>' for an operation that failed, else the operation's integer.
--
-- The state of the call under way. The helpers below read it as upvalues;
-- `begin` sets it at the start of every call. `redis.call` exists only
-- while a function runs, not while its library loads.
local call, KEYS, ARGV
-- Where the keys are: in KEYS; or, in a call to one Redis Cluster node that
-- spans several of its slots, among the arguments: ARGV = '#k', n, <n
-- keys>, client id, operations. Every key of one operation still shares
-- one slot.
local K, first_key, client, first_arg
-- The server's clock in microseconds, read once per call (Redis freezes
-- time while a function runs). Every deadline hasp stores is computed from
-- it, never from a client's clock.
local now_us

local function begin(keys, args)
  call, KEYS, ARGV, now_us = redis.call, keys, args, nil
  if ARGV[1] == '#k' then
    local n = tonumber(ARGV[2])
    K, first_key, client, first_arg = ARGV, 3, ARGV[3 + n], 4 + n
  else
    K, first_key, client, first_arg = KEYS, 1, ARGV[1], 2
  end
end

-- opcode -> { keys, arguments (the opcode included), function(first key
-- index, opcode's argument index) }
local ops = {}

-- Tells the waiters of the object whose key is `base`, on its channel
-- `<base>:released`. PUBLISH is set by the line the client puts before
-- this file (scripts.rs): 'publish' for one server, 'spublish' for a Redis
-- Cluster, whose waiters listen on the shard that owns the slot.
local function released(base, message)
  call(PUBLISH, base .. ':released', message)
end

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
