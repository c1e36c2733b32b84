-- Learned leases: the history the clients of one class of adaptive locks
-- share (see the client's `adaptive` module).
--
--   op  KEYS     ARGV
--   lm  history  lm, srtt, rttvar, samples, ttl, max
--                merge this client's estimate (srtt, rttvar in ms, from
--                `samples` new samples; 0: only read) into the history, each
--                side weighted by its sample count capped at 64; the history
--                expires ttl ms after the last merge
--
-- history hash: 'srtt', 'rttvar' (ms), 'samples', 'updated_at' (server ms).
-- A history that is absurd (not numbers, negative, above max, updated in
-- the future) is ignored, and overwritten by the next merge with samples.
--
-- Answers an array: srtt and rttvar in µs, samples, updated_at (all 0 when
-- nothing is known anywhere).

local function merge_lease(history, srtt, rttvar, samples, ttl, max)
  local now = clock_ms()
  local h = call('hmget', history, 'srtt', 'rttvar', 'samples', 'updated_at')
  local s, v, n, at = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]), tonumber(h[4])
  max = tonumber(max)
  local valid = s and v and n and at and s == s and v == v and s >= 0 and v >= 0
    and s <= max and v <= max and n >= 1 and at <= now
  local ls, lv, ln = tonumber(srtt), tonumber(rttvar), tonumber(samples)
  local ms, mv, mn
  if valid and ln > 0 then
    local wr, wl = math.min(n, 64), math.min(ln, 64)
    ms = (s * wr + ls * wl) / (wr + wl)
    mv = (v * wr + lv * wl) / (wr + wl)
    mn = math.min(n + ln, 1000000000)
  elseif valid then
    return { math.floor(s * 1000), math.floor(v * 1000), n, at }
  elseif ln > 0 then
    ms, mv, mn = ls, lv, ln
  else
    return { 0, 0, 0, 0 }
  end
  call('hset', history, 'srtt', string.format('%.3f', ms), 'rttvar', string.format('%.3f', mv),
    'samples', mn, 'updated_at', now)
  call('pexpire', history, ttl)
  return { math.floor(ms * 1000), math.floor(mv * 1000), mn, now }
end

ops.lm = { 1, 6, function(k, a)
  return merge_lease(K[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
end }
