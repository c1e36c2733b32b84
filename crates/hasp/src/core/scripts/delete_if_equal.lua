-- DELIFEQ for a server without it (Redis 7.0): deletes KEYS[1] if it holds
-- exactly ARGV[1]. Answers 1 (deleted) or 0 (not: nothing changed), as
-- DELIFEQ does. A script of its own, not an operation of the batch
-- function: at one operation per call it costs Redis what the smallest
-- compare-and-delete costs (wire/native.rs).
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
