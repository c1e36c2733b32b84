-- Acknowledges and deletes the entries of one order stream whose orders
-- the caller stored, and no other entry.
--
-- A stream id names an entry on one server only: after a Sentinel switch
-- the new master numbers its entries by its own clock from the same last
-- id, so an id read on the master left behind can name another order on
-- the new one. Each entry is acknowledged and deleted only if it carries
-- the order the caller names for it; another entry under that id is left
-- pending, to be read and stored in its turn.
--
-- KEYS[1]  the order stream
-- ARGV[1]  the consumer group
-- ARGV[2], ARGV[3], ...  pairs: entry id, the order id it carries ('' for
--          an entry without one)
--
-- Returns the number of entries acknowledged and deleted.
local matched = {}
for i = 2, #ARGV - 1, 2 do
  local id, order = ARGV[i], ARGV[i + 1]
  local entry = redis.call('xrange', KEYS[1], id, id)[1]
  if entry then
    local carried = ''
    local fields = entry[2]
    for j = 1, #fields - 1, 2 do
      if fields[j] == 'order' then
        carried = fields[j + 1]
        break
      end
    end
    if carried == order then
      matched[#matched + 1] = id
    end
  end
end
-- One XACK and one XDEL for the batch (in slices: unpack has a limit).
for first = 1, #matched, 1000 do
  local slice = {unpack(matched, first, math.min(first + 999, #matched))}
  redis.call('xack', KEYS[1], ARGV[1], unpack(slice))
  redis.call('xdel', KEYS[1], unpack(slice))
end
return #matched
