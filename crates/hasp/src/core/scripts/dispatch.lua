-- The function: runs the operations in order, each in its own pcall,
-- through the kinds' opcode table `ops`.
local function batch(keys, args)
  begin(keys, args)
  local results = {}
  local key, arg = first_key, first_arg
  while arg <= #ARGV do
    local entry = ops[ARGV[arg]]
    if not entry then
      return redis.error_reply('hasp batch: unknown opcode ' .. tostring(ARGV[arg]))
    end
    local ok, result = pcall(entry[3], key, arg)
    key, arg = key + entry[1], arg + entry[2]
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
