-- The function: runs the operations in order, each in its own pcall. A
-- lock's opcodes are dispatched directly, the other kinds' through `ops`.
local function batch(keys, args)
  begin(keys, args)
  local results = {}
  local key, arg = first_key, first_arg
  while arg <= #ARGV do
    local op, lock = ARGV[arg], K[key]
    local ok, result
    if op == 'a' or op == 'w' then
      ok, result = pcall(acquire, lock, ARGV[arg + 2], ARGV[arg + 1], op == 'w', true)
      key, arg = key + 1, arg + 3
    elseif op == 'r' then
      ok, result = pcall(release, lock, ARGV[arg + 1], '1', ARGV[arg + 2])
      key, arg = key + 1, arg + 3
    elseif op == 'R' then
      ok, result = pcall(release, lock, ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3])
      key, arg = key + 1, arg + 4
    elseif op == 'h' then
      ok, result = pcall(hand_off, lock, K[key + 1], ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3],
        ARGV[arg + 4], ARGV[arg + 5])
      key, arg = key + 2, arg + 6
    elseif op == 'e' then
      ok, result = pcall(extend, lock, ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3])
      key, arg = key + 1, arg + 4
    elseif op == 'u' then
      ok, result = pcall(undo, lock, ARGV[arg + 1], ARGV[arg + 2])
      key, arg = key + 1, arg + 3
    elseif op == 's' then
      ok, result = pcall(settle, lock, ARGV[arg + 1], ARGV[arg + 2], ARGV[arg + 3])
      key, arg = key + 1, arg + 4
    elseif op == 'f' then
      ok, result = pcall(force, lock)
      key, arg = key + 1, arg + 1
    else
      local entry = ops[op]
      if not entry then
        return redis.error_reply('hasp batch: unknown opcode ' .. tostring(op))
      end
      ok, result = pcall(entry[3], key, arg)
      key, arg = key + entry[1], arg + entry[2]
    end
    if not ok then
      -- A string, not an error reply: clients turn an error anywhere in the
      -- reply into a failure of the whole call.
      if type(result) == 'table' then
        result = result.err or tostring(result)
      end
      result = 'failed: ' .. tostring(result)
    end
    results[#results + 1] = result
  end
  return results
end
