-- Free a lock whoever holds it, and wake every client's waiters.
--
-- KEYS[1]  lock hash
-- KEYS[2]  release channel
-- ARGV[1]  message to publish
--
-- Returns  1 if a lock was deleted, 0 if there was none
if redis.call('del', KEYS[1]) == 1 then
  redis.call('publish', KEYS[2], ARGV[1])
  return 1
end
return 0
