-- The anchor Tollgate's GCRA is measured against: a GCRA written by hand
-- (TIME, GET, SET … PX). ARGV: the emission interval and the horizon, in µs.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local emission, horizon = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + emission
if new_tat - now > horizon then
  return {0, new_tat - now - horizon}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000))
return {1, 0}
