-- The anchor Tollgate's sliding log and concurrency limiter are measured
-- against: a sliding log as one writes it by hand, one sorted-set member per
-- request scored by its instant (TIME; ZREMRANGEBYSCORE what left the
-- window, ZCARD, ZADD, PEXPIRE). KEYS[1]: the log; ARGV: window (µs), limit, a member unique to
-- the request, the key's expiry (ms). Returns the count before the request.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
local count = redis.call('ZCARD', KEYS[1])
if count < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return count
