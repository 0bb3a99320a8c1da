-- Tollgate: every algorithm of crates/tollgate/src/algorithm/, one atomic call.
--
-- Each function below mirrors the Rust function of the same name: the same
-- steps in the same order, the same integer units (microseconds, and ticks
-- for exact rates). Lua numbers are doubles, exact for integers below 2^53;
-- every quantity stays below that (limits are validated in Rust), and integer
-- division goes through idiv, never a bare `/`.
--
-- Calling convention (a batch of decisions, one TIME read per call):
--   KEYS: the keys of every limit of every decision, in order.
--   ARGV[1]: now in µs, or "" to read the server's TIME.
--   ARGV[2]: the number of decisions.
--   then per decision: op, cost, max_wait (-1: none), lease, named (0/1), n,
--   then per limit (n of them): algorithm, its 7 numeric parameters, and
--   the cost this limit sees.
-- Returns one array per decision: {"ok", allowed, granted, n, then 6 numbers
-- per limit: allowed, limit, remaining, retry_after (-1: never), reset_after,
-- wait} or {"err", message}.

local MAX_TICKS = 4503599627370496 -- 2^52

-- Integer arithmetic on doubles, exact below 2^53.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

local function imod(a, b)
  return a - idiv(a, b) * b
end

local function div_ceil(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

local function sat_sub(a, b)
  if a > b then
    return a - b
  end
  return 0
end

-- Decisions, as Decision::allow and Decision::deny (-1 retry_after: never).
local function allow(limit, remaining, reset_after, wait)
  return { 1, limit, remaining, 0, reset_after, wait }
end

local function deny(limit, remaining, retry_after, reset_after)
  return { 0, limit, remaining, retry_after or -1, reset_after, 0 }
end

-- rate.rs ---------------------------------------------------------------

local function ticks(rate, units)
  local t = units * rate.unit
  if t > MAX_TICKS then
    return nil
  end
  return t
end

local function micros(rate, t)
  return div_ceil(t, rate.per_micro)
end

local function units(rate, t)
  return idiv(t, rate.unit)
end

local function backlog(tat, now, rate)
  if tat.at < now then
    return 0
  end
  return (tat.at - now) * rate.per_micro + tat.frac
end

local function tat_after(now, b, rate)
  return { at = now + idiv(b, rate.per_micro), frac = imod(b, rate.per_micro) }
end

-- fixed_window.rs -------------------------------------------------------

local function fixed_window_current(p, s, now)
  local start = now - imod(now, p.window)
  -- A newer window than now's (the clock went back) still counts.
  if s and s.start >= start then
    return s.start, s.count
  end
  return start, 0
end

local function fixed_window_available(p, s, now)
  local _, count = fixed_window_current(p, s, now)
  return sat_sub(p.limit, count)
end

local function fixed_window_check(p, s, now, cost)
  local start, count = fixed_window_current(p, s, now)
  local window_end = start + p.window
  local function reset_after(c)
    if c > 0 then
      return window_end - now
    end
    return 0
  end
  local remaining = sat_sub(p.limit, count)
  if cost > p.limit then
    return deny(p.limit, remaining, nil, reset_after(count))
  end
  if cost > remaining then
    return deny(p.limit, remaining, window_end - now, reset_after(count))
  end
  count = count + cost
  local decision = allow(p.limit, p.limit - count, reset_after(count), 0)
  if cost == 0 then
    return decision
  end
  return decision, { start = start, count = count }
end

-- sliding_window.rs -----------------------------------------------------

local function sliding_window_sub(p)
  return idiv(p.window, p.buckets)
end

local function sliding_window_live(p, s, now)
  local oldest = sat_sub(idiv(now, sliding_window_sub(p)), p.buckets)
  local counts, total = {}, 0
  if s then
    for _, entry in ipairs(s.counts) do
      if entry[1] >= oldest then
        counts[#counts + 1] = { entry[1], entry[2] }
        total = total + entry[2]
      end
    end
  end
  return counts, total
end

local function sliding_window_leaves(p, index)
  return (index + p.buckets + 1) * sliding_window_sub(p)
end

local function sliding_window_reset_after(p, counts, now)
  if #counts == 0 then
    return 0
  end
  return sliding_window_leaves(p, counts[#counts][1]) - now
end

local function sliding_window_available(p, s, now)
  local _, total = sliding_window_live(p, s, now)
  return sat_sub(p.limit, total)
end

local function sliding_window_check(p, s, now, cost)
  local counts, total = sliding_window_live(p, s, now)
  local remaining = sat_sub(p.limit, total)
  if cost > p.limit then
    return deny(p.limit, remaining, nil, sliding_window_reset_after(p, counts, now))
  end
  if cost > remaining then
    local needed = total + cost - p.limit
    local freed, retry_after = 0, nil
    for _, entry in ipairs(counts) do
      freed = freed + entry[2]
      if freed >= needed then
        retry_after = sliding_window_leaves(p, entry[1]) - now
        break
      end
    end
    return deny(p.limit, remaining, retry_after, sliding_window_reset_after(p, counts, now))
  end
  if cost == 0 then
    return allow(p.limit, remaining, sliding_window_reset_after(p, counts, now), 0)
  end
  -- Kept in order of index, even when the clock went back.
  local index = idiv(now, sliding_window_sub(p))
  local at = #counts + 1
  while at > 1 and counts[at - 1][1] > index do
    at = at - 1
  end
  if at > 1 and counts[at - 1][1] == index then
    counts[at - 1][2] = counts[at - 1][2] + cost
  else
    table.insert(counts, at, { index, cost })
  end
  local decision = allow(p.limit, remaining - cost, sliding_window_reset_after(p, counts, now), 0)
  return decision, { counts = counts }
end

-- sliding_log.rs --------------------------------------------------------

local function sliding_log_live(p, s, now)
  local entries, total = {}, 0
  if s then
    for _, entry in ipairs(s.entries) do
      if entry[1] + p.window > now then
        entries[#entries + 1] = { entry[1], entry[2] }
        total = total + entry[2]
      end
    end
  end
  return entries, total
end

local function sliding_log_reset_after(p, entries, now)
  if #entries == 0 then
    return 0
  end
  return entries[#entries][1] + p.window - now
end

local function sliding_log_available(p, s, now)
  local _, total = sliding_log_live(p, s, now)
  return sat_sub(p.limit, total)
end

local function sliding_log_check(p, s, now, cost)
  local entries, total = sliding_log_live(p, s, now)
  local remaining = sat_sub(p.limit, total)
  if cost > p.limit then
    return deny(p.limit, remaining, nil, sliding_log_reset_after(p, entries, now))
  end
  if cost > remaining then
    local needed = total + cost - p.limit
    local freed, retry_after = 0, nil
    for _, entry in ipairs(entries) do
      freed = freed + entry[2]
      if freed >= needed then
        retry_after = entry[1] + p.window - now
        break
      end
    end
    return deny(p.limit, remaining, retry_after, sliding_log_reset_after(p, entries, now))
  end
  if cost == 0 then
    return allow(p.limit, remaining, sliding_log_reset_after(p, entries, now), 0)
  end
  -- Kept in order of time, even when the clock went back.
  local at = #entries + 1
  while at > 1 and entries[at - 1][1] > now do
    at = at - 1
  end
  if at > 1 and entries[at - 1][1] == now then
    entries[at - 1][2] = entries[at - 1][2] + cost
  else
    table.insert(entries, at, { now, cost })
  end
  local decision = allow(p.limit, remaining - cost, sliding_log_reset_after(p, entries, now), 0)
  return decision, { entries = entries }
end

-- token_bucket.rs -------------------------------------------------------

local function token_bucket_deficit(p, s, now)
  local capacity = p.capacity * p.rate.unit
  if s and s.smooth then
    return math.min(backlog(s.tat, now, p.rate), capacity)
  end
  return (p.capacity - p.initial) * p.rate.unit
end

local function token_bucket_tokens(p, s, now)
  local boundary = idiv(now, p.interval)
  if s and not s.smooth and s.boundary <= boundary then
    return math.min((boundary - s.boundary) * p.refill + s.tokens, p.capacity), boundary
  elseif s and not s.smooth then
    -- Counted in a newer interval (the clock went back): no refill, keep its boundary.
    return s.tokens, s.boundary
  end
  return p.initial, boundary
end

local function token_bucket_available(p, s, now)
  if p.smooth then
    return units(p.rate, p.capacity * p.rate.unit - token_bucket_deficit(p, s, now))
  end
  local tokens = token_bucket_tokens(p, s, now)
  return tokens
end

local function token_bucket_first_touch(p, s, decision, level)
  if s == nil and p.initial < p.capacity then
    return decision, level
  end
  return decision
end

local function token_bucket_check_smooth(p, s, now, cost)
  local rate = p.rate
  local capacity = p.capacity * rate.unit
  local deficit = token_bucket_deficit(p, s, now)
  local remaining = units(rate, capacity - deficit)
  local level = { smooth = true, tat = tat_after(now, deficit, rate) }
  if cost > p.capacity then
    return token_bucket_first_touch(p, s, deny(p.capacity, remaining, nil, micros(rate, deficit)), level)
  end
  local deficit_after = deficit + cost * rate.unit
  if deficit_after > capacity then
    local retry_after = micros(rate, deficit_after - capacity)
    return token_bucket_first_touch(p, s, deny(p.capacity, remaining, retry_after, micros(rate, deficit)), level)
  end
  local decision = allow(p.capacity, units(rate, capacity - deficit_after), micros(rate, deficit_after), 0)
  if cost == 0 then
    return token_bucket_first_touch(p, s, decision, level)
  end
  return decision, { smooth = true, tat = tat_after(now, deficit_after, rate) }
end

local function token_bucket_check_interval(p, s, now, cost)
  local tokens, boundary = token_bucket_tokens(p, s, now)
  local function after_refill(missing)
    if missing == 0 then
      return 0
    end
    return (boundary + div_ceil(missing, p.refill)) * p.interval - now
  end
  local function reset_after(t)
    return after_refill(sat_sub(p.capacity, t))
  end
  local level = { smooth = false, tokens = tokens, boundary = boundary }
  if cost > p.capacity then
    return token_bucket_first_touch(p, s, deny(p.capacity, tokens, nil, reset_after(tokens)), level)
  end
  if cost > tokens then
    local decision = deny(p.capacity, tokens, after_refill(cost - tokens), reset_after(tokens))
    return token_bucket_first_touch(p, s, decision, level)
  end
  tokens = tokens - cost
  local decision = allow(p.capacity, tokens, reset_after(tokens), 0)
  if cost == 0 then
    return token_bucket_first_touch(p, s, decision, level)
  end
  return decision, { smooth = false, tokens = tokens, boundary = boundary }
end

local function token_bucket_check(p, s, now, cost)
  if p.smooth then
    return token_bucket_check_smooth(p, s, now, cost)
  end
  return token_bucket_check_interval(p, s, now, cost)
end

-- gcra.rs ---------------------------------------------------------------

local function gcra_horizon(p)
  local emission_interval = p.rate.unit
  local tolerance = (p.burst - 1) * emission_interval
  return tolerance + emission_interval
end

local function gcra_available(p, s, now)
  local ahead = 0
  if s then
    ahead = backlog(s.tat, now, p.rate)
  end
  return units(p.rate, sat_sub(gcra_horizon(p), ahead))
end

local function gcra_check(p, s, now, cost)
  local rate = p.rate
  local horizon = gcra_horizon(p)
  local ahead = 0
  if s then
    ahead = math.min(backlog(s.tat, now, rate), horizon)
  end
  local remaining = units(rate, horizon - ahead)
  if cost > p.burst then
    return deny(p.burst, remaining, nil, micros(rate, ahead))
  end
  local new_ahead = ahead + cost * rate.unit
  if new_ahead > horizon then
    local retry_after = micros(rate, new_ahead - horizon)
    return deny(p.burst, remaining, retry_after, micros(rate, ahead))
  end
  local decision = allow(p.burst, units(rate, horizon - new_ahead), micros(rate, new_ahead), 0)
  if cost == 0 then
    return decision
  end
  return decision, { tat = tat_after(now, new_ahead, rate) }
end

-- leaky_bucket.rs -------------------------------------------------------

local function leaky_bucket_available(p, s, now)
  local queued = 0
  if s then
    queued = backlog(s.tat, now, p.rate)
  end
  return units(p.rate, sat_sub(p.capacity * p.rate.unit, queued))
end

local function leaky_bucket_reserve(p, s, now, cost, max_wait)
  local rate = p.rate
  local capacity = p.capacity * rate.unit
  local queued = 0
  if s then
    queued = math.min(backlog(s.tat, now, rate), capacity)
  end
  local remaining = units(rate, capacity - queued)
  if cost > p.capacity then
    return deny(p.capacity, remaining, nil, micros(rate, queued))
  end
  local departure = micros(rate, queued)
  local queued_after = queued + cost * rate.unit
  local overfull = sat_sub(queued_after, capacity)
  local too_late = 0
  if max_wait then
    too_late = sat_sub(queued, max_wait * rate.per_micro)
  end
  if overfull > 0 or too_late > 0 then
    local retry_after = micros(rate, math.max(overfull, too_late))
    return deny(p.capacity, remaining, retry_after, micros(rate, queued))
  end
  local decision = allow(p.capacity, units(rate, capacity - queued_after), micros(rate, queued_after), departure)
  if cost == 0 then
    return decision
  end
  return decision, { tat = tat_after(now, queued_after, rate) }
end

-- reservation.rs --------------------------------------------------------

local function reservation_missing(p, s, now)
  if s then
    return backlog(s.tat, now, p.rate)
  end
  return (p.max_burst - p.initial) * p.rate.unit
end

local function reservation_remaining(p, missing)
  local stored = p.max_burst * p.rate.unit - missing
  if stored < 0 then
    return 0
  end
  return units(p.rate, stored) + 1
end

local function reservation_available(p, s, now)
  if reservation_missing(p, s, now) <= p.max_burst * p.rate.unit then
    return math.huge
  end
  return 0
end

local function reservation_reserve(p, s, now, cost, max_wait)
  local rate = p.rate
  local limit = p.max_burst + 1
  local full = p.max_burst * rate.unit
  local missing = reservation_missing(p, s, now)
  local remaining = reservation_remaining(p, missing)
  local cost_ticks = ticks(rate, cost)
  if cost_ticks == nil then
    return deny(limit, remaining, nil, micros(rate, missing))
  end
  local debt = sat_sub(missing, full)
  local wait = micros(rate, debt)
  local too_late = 0
  if max_wait then
    too_late = sat_sub(debt, max_wait * rate.per_micro)
  end
  local missing_after = missing + cost_ticks
  local over_cap = sat_sub(missing_after, full + MAX_TICKS)
  if too_late > 0 or over_cap > 0 then
    local retry_after = micros(rate, math.max(too_late, over_cap))
    return deny(limit, remaining, retry_after, micros(rate, missing))
  end
  local decision = allow(limit, reservation_remaining(p, missing_after), micros(rate, missing_after), wait)
  if cost == 0 then
    return decision
  end
  return decision, { tat = tat_after(now, missing_after, rate) }
end

-- concurrency.rs --------------------------------------------------------

local function concurrency_live(s, now, except)
  local leases, in_flight = {}, 0
  if s then
    for _, lease in ipairs(s.leases) do
      if lease.expires > now and lease.id ~= except then
        leases[#leases + 1] = lease
        in_flight = in_flight + lease.cost
      end
    end
  end
  return leases, in_flight
end

local function concurrency_reset_after(leases, now)
  local latest = 0
  for _, lease in ipairs(leases) do
    latest = math.max(latest, lease.expires - now)
  end
  return latest
end

local function concurrency_available(p, s, now)
  local _, in_flight = concurrency_live(s, now, nil)
  return sat_sub(p.limit, in_flight)
end

local function concurrency_acquire(p, s, now, cost, id)
  -- What is held now, as a peek reports it.
  local held, in_flight = concurrency_live(s, now, nil)
  local remaining = sat_sub(p.limit, in_flight)
  local reset_after = concurrency_reset_after(held, now)
  -- Renewing a lease first gives back the units it holds.
  local leases, held_by_others = concurrency_live(s, now, id)
  if cost > p.limit then
    return deny(p.limit, remaining, nil, reset_after)
  end
  if cost > sat_sub(p.limit, held_by_others) then
    local needed = held_by_others + cost - p.limit
    local freed, retry_after = 0, nil
    for _, lease in ipairs(leases) do
      freed = freed + lease.cost
      if freed >= needed then
        retry_after = lease.expires - now
        break
      end
    end
    return deny(p.limit, remaining, retry_after, reset_after)
  end
  if id == nil or cost == 0 then
    return allow(p.limit, remaining, reset_after, 0)
  end
  local expires = now + p.ttl
  local at = #leases + 1
  for i, lease in ipairs(leases) do
    if lease.expires > expires then
      at = i
      break
    end
  end
  table.insert(leases, at, { id = id, expires = expires, cost = cost })
  local decision = allow(p.limit, p.limit - held_by_others - cost, concurrency_reset_after(leases, now), 0)
  return decision, { leases = leases }
end

local function concurrency_release(p, s, now, id)
  local leases, in_flight = concurrency_live(s, now, id)
  local decision = allow(p.limit, sat_sub(p.limit, in_flight), concurrency_reset_after(leases, now), 0)
  return decision, { leases = leases }
end

-- algorithm/mod.rs: dispatch --------------------------------------------

local function available(p, s, now)
  local a = p.algorithm
  if a == "fixed_window" then
    return fixed_window_available(p, s, now)
  elseif a == "sliding_window" then
    return sliding_window_available(p, s, now)
  elseif a == "sliding_log" then
    return sliding_log_available(p, s, now)
  elseif a == "token_bucket" then
    return token_bucket_available(p, s, now)
  elseif a == "reservation" then
    return reservation_available(p, s, now)
  elseif a == "leaky_bucket" then
    return leaky_bucket_available(p, s, now)
  elseif a == "gcra" then
    return gcra_available(p, s, now)
  end
  return concurrency_available(p, s, now)
end

-- action: "check" | "reserve" | "acquire" | "release"; max_wait: µs or nil.
-- Operations a limit does not support were refused in Rust before the call.
local function decide_limit(p, s, now, action, cost, max_wait, lease)
  local a = p.algorithm
  if a == "reservation" or a == "leaky_bucket" then
    local reserve = leaky_bucket_reserve
    if a == "reservation" then
      reserve = reservation_reserve
    end
    if action == "release" then
      -- A release only reports: it is never denied and never waits.
      local decision, state = reserve(p, s, now, 0, nil)
      decision[6] = 0
      return decision, state
    end
    -- `check` on a borrowing limit waits for nothing; on a shaping one, for anything.
    if action == "check" then
      if a == "reservation" then
        max_wait = 0
      else
        max_wait = nil
      end
    end
    return reserve(p, s, now, cost, max_wait)
  end
  if a == "concurrency" then
    if action == "release" then
      return concurrency_release(p, s, now, lease)
    end
    return concurrency_acquire(p, s, now, cost, lease)
  end
  if action == "release" then
    cost = 0
  end
  if a == "fixed_window" then
    return fixed_window_check(p, s, now, cost)
  elseif a == "sliding_window" then
    return sliding_window_check(p, s, now, cost)
  elseif a == "sliding_log" then
    return sliding_log_check(p, s, now, cost)
  elseif a == "token_bucket" then
    return token_bucket_check(p, s, now, cost)
  end
  return gcra_check(p, s, now, cost)
end

-- Storage: one hash per limit and subject. Field "a" names the algorithm
-- (another algorithm's state counts as none), "x" is when the state stops
-- carrying information (µs); the rest is the algorithm's state.

-- Returns the state, or nil and whether the key holds a lapsed or foreign
-- state (whose fields a write must clear first).
local function load(key, p, now)
  local raw = redis.call("HGETALL", key)
  if #raw == 0 then
    return nil, false
  end
  local h = {}
  for i = 1, #raw, 2 do
    h[raw[i]] = raw[i + 1]
  end
  if h.a ~= p.algorithm or tonumber(h.x) <= now then
    return nil, true
  end
  local a = p.algorithm
  if a == "fixed_window" then
    return { start = tonumber(h.s), count = tonumber(h.c) }
  elseif a == "token_bucket" and h.m == "i" then
    return { smooth = false, tokens = tonumber(h.t), boundary = tonumber(h.b) }
  elseif a == "token_bucket" then
    return { smooth = true, tat = { at = tonumber(h.t), frac = tonumber(h.f) } }
  elseif a == "gcra" or a == "leaky_bucket" or a == "reservation" then
    return { tat = { at = tonumber(h.t), frac = tonumber(h.f) } }
  elseif a == "concurrency" then
    local leases = {}
    for field, value in pairs(h) do
      if string.sub(field, 1, 2) == "l:" then
        local sep = string.find(value, ":", 1, true)
        leases[#leases + 1] = {
          id = string.sub(field, 3),
          expires = tonumber(string.sub(value, 1, sep - 1)),
          cost = tonumber(string.sub(value, sep + 1)),
        }
      end
    end
    table.sort(leases, function(x, y)
      if x.expires ~= y.expires then
        return x.expires < y.expires
      end
      return x.id < y.id
    end)
    return { leases = leases }
  end
  -- sliding_window and sliding_log: numeric fields "#<index or instant>" = count.
  local entries = {}
  for field, value in pairs(h) do
    if string.sub(field, 1, 1) == "#" then
      entries[#entries + 1] = { tonumber(string.sub(field, 2)), tonumber(value) }
    end
  end
  table.sort(entries, function(x, y)
    return x[1] < y[1]
  end)
  if a == "sliding_window" then
    return { counts = entries }
  end
  return { entries = entries }
end

local function fmt(n)
  return string.format("%.0f", n)
end

-- With the server's time a key expires exactly when its state stops carrying
-- information. With a caller's `now` (tests, replays) real time and the
-- caller's time differ, so the key is kept at least EXPLICIT_NOW_TTL ms; the
-- decision never depends on it, since "x" says when the state lapses in the
-- caller's time.
local EXPLICIT_NOW_TTL = 3600000
local explicit_now = false

-- Algorithms whose hash always has the same fields: HSET overwrites them all,
-- so the key need not be deleted first.
local FIXED_FIELDS = { fixed_window = true, gcra = true, leaky_bucket = true, reservation = true }

local function store(key, p, s, now, ttl, stale)
  if ttl == 0 or stale or not FIXED_FIELDS[p.algorithm] then
    redis.call("DEL", key)
  end
  if ttl == 0 then
    return
  end
  local fields = { "a", p.algorithm, "x", fmt(now + ttl) }
  local function put(name, value)
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
  local a = p.algorithm
  if a == "fixed_window" then
    put("s", fmt(s.start))
    put("c", fmt(s.count))
  elseif a == "token_bucket" and not s.smooth then
    put("m", "i")
    put("t", fmt(s.tokens))
    put("b", fmt(s.boundary))
  elseif a == "token_bucket" or a == "gcra" or a == "leaky_bucket" or a == "reservation" then
    put("t", fmt(s.tat.at))
    put("f", fmt(s.tat.frac))
  elseif a == "concurrency" then
    for _, lease in ipairs(s.leases) do
      put("l:" .. lease.id, fmt(lease.expires) .. ":" .. fmt(lease.cost))
    end
  else
    for _, entry in ipairs(s.counts or s.entries) do
      put("#" .. fmt(entry[1]), fmt(entry[2]))
    end
  end
  redis.call("HSET", key, unpack(fields))
  local expire_ms = div_ceil(ttl, 1000)
  if explicit_now then
    expire_ms = math.max(expire_ms, EXPLICIT_NOW_TTL)
  end
  redis.call("PEXPIRE", key, expire_ms)
end

-- policy.rs: all-or-nothing over the limits of one decision ---------------

local function parse_limit(argv, at)
  local a = argv[at]
  local n = {}
  for i = 1, 7 do
    n[i] = tonumber(argv[at + i])
  end
  local p = { algorithm = a }
  if a == "fixed_window" or a == "sliding_log" then
    p.limit, p.window = n[1], n[2]
  elseif a == "sliding_window" then
    p.limit, p.window, p.buckets = n[1], n[2], n[3]
  elseif a == "token_bucket" then
    p.capacity, p.refill, p.interval, p.smooth, p.initial = n[1], n[2], n[3], n[4] == 0, n[5]
    p.rate = { unit = n[6], per_micro = n[7] }
  elseif a == "reservation" then
    p.max_burst, p.initial = n[1], n[2]
    p.rate = { unit = n[6], per_micro = n[7] }
  elseif a == "leaky_bucket" then
    p.capacity = n[1]
    p.rate = { unit = n[6], per_micro = n[7] }
  elseif a == "gcra" then
    p.burst = n[1]
    p.rate = { unit = n[6], per_micro = n[7] }
  else
    p.limit, p.ttl = n[1], n[2]
  end
  p.cost = tonumber(argv[at + 8])
  return p
end

local function decide(keys, limits, now, op, cost, max_wait, lease)
  local states, stale = {}, {}
  for i, p in ipairs(limits) do
    states[i], stale[i] = load(keys[i], p, now)
  end
  local action = op
  if op == "check_at_most" then
    -- One cost for every limit (Rust refuses per-limit costs here).
    action = "check"
    local least = math.huge
    for i, p in ipairs(limits) do
      least = math.min(least, available(p, states[i], now))
    end
    if least == 0 and cost > 0 then
      cost = 1
    else
      cost = math.min(least, cost)
    end
    for _, p in ipairs(limits) do
      p.cost = cost
    end
  end
  local decisions, new_states = {}, {}
  local allowed = true
  for i, p in ipairs(limits) do
    decisions[i], new_states[i] = decide_limit(p, states[i], now, action, p.cost, max_wait, lease)
    if decisions[i][1] == 0 then
      allowed = false
    end
  end
  if not allowed then
    -- Nothing is consumed: limits that would have admitted report as a peek.
    for i, p in ipairs(limits) do
      if decisions[i][1] == 1 then
        decisions[i], new_states[i] = decide_limit(p, states[i], now, action, 0, max_wait, lease)
      end
    end
  end
  for i, p in ipairs(limits) do
    if new_states[i] then
      store(keys[i], p, new_states[i], now, decisions[i][5], stale[i])
    end
  end
  local granted = 0
  if allowed then
    granted = cost
  end
  local reply = { "ok", allowed and 1 or 0, fmt(granted), #limits }
  for _, d in ipairs(decisions) do
    for j = 1, 6 do
      reply[#reply + 1] = fmt(d[j])
    end
  end
  return reply
end

-- Entry point ---------------------------------------------------------------

local now = tonumber(ARGV[1])
explicit_now = now ~= nil
if now == nil then
  local time = redis.call("TIME")
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
local replies = {}
local at, key_at = 3, 1
for _ = 1, tonumber(ARGV[2]) do
  local op, cost, max_wait, lease = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), ARGV[at + 3]
  local count = tonumber(ARGV[at + 5])
  at = at + 6
  if max_wait < 0 then
    max_wait = nil
  end
  if lease == "" then
    lease = nil
  end
  local limits, keys = {}, {}
  for i = 1, count do
    limits[i] = parse_limit(ARGV, at)
    keys[i] = KEYS[key_at]
    at, key_at = at + 9, key_at + 1
  end
  if op == "reset" then
    for _, key in ipairs(keys) do
      redis.call("DEL", key)
    end
    replies[#replies + 1] = { "ok", 1, "0", 0 }
  else
    replies[#replies + 1] = decide(keys, limits, now, op, cost, max_wait, lease)
  end
end
return replies
