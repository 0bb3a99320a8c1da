-- token_bucket.rs: smooth mode keeps the instant the bucket is full again,
-- "s<at>[:<frac>]"; interval mode the tokens counted at an interval
-- boundary and when that level has no more to say,
-- "i<tokens>:<boundary>:<expires>" (instants in µs).

local token_bucket = { tat = tat_encoding("s") }

function token_bucket.params(n)
  local p = { capacity = n[2], refill = n[3], interval = n[4], smooth = n[5] == 0, initial = n[6] }
  p.unit, p.per_micro, p.max_debt = n[7], n[8], n[9]
  return p
end

-- A live state of the other mode (the limit was redefined): it counts as no
-- level, but it is there, so a first touch does not store one (as in Rust).
local OTHER_MODE = {}

local function load_interval(value, now)
  -- A debt is a negative level.
  local tokens, boundary, expires = match(value, "^i(%-?%d+):(%d+):(%d+)$")
  if not tokens or tonumber(expires) <= now then
    return nil
  end
  return { tokens = tonumber(tokens), boundary = tonumber(boundary) }
end

function token_bucket.load(key, p, now)
  if p.smooth then
    local value = get_string(key)
    if value and substring(value, 1, 1) == "i" then
      return load_interval(value, now) and OTHER_MODE
    end
    return load_tat(key, p, token_bucket.tat, now)
  end
  local value = get_string(key)
  if not value then
    return nil
  end
  if substring(value, 1, 1) == "s" then
    return load_tat(key, p, token_bucket.tat, now) and OTHER_MODE
  end
  local level = load_interval(value, now)
  if level == nil and not find(value, "^i%-?%d+:%d+:%d+$") then
    return other_state(value)
  end
  return level
end

-- Smooth mode: ticks missing from a full bucket at now (beyond capacity
-- after a record, by the debt).
local function deficit(p, s)
  if s and s ~= OTHER_MODE then
    return s
  end
  return (p.capacity - p.initial) * p.unit
end

-- Interval mode: tokens at now, and the start of the interval they are
-- counted in (now's, or a newer one already counted).
local function tokens_at(p, s, now)
  local boundary = now - imod(now, p.interval)
  if s == OTHER_MODE then
    return p.initial, boundary
  elseif s and s.boundary <= boundary then
    local intervals = idiv(boundary - s.boundary, p.interval)
    return min(intervals * p.refill + s.tokens, p.capacity), boundary
  elseif s then
    -- Counted in a newer interval (the clock went back): no refill, keep its boundary.
    return s.tokens, s.boundary
  end
  return p.initial, boundary
end

function token_bucket.available(p, s, now)
  if p.smooth then
    return units(p, sat_sub(p.capacity * p.unit, deficit(p, s)))
  end
  local tokens = tokens_at(p, s, now)
  return max(tokens, 0)
end

-- A bucket starting below capacity stores the level its first request saw,
-- even on a denial or a peek, so that it has an instant to refill from.
local function first_touch(p, s, decision, level)
  if s == nil and p.initial < p.capacity then
    return decision, level
  end
  return decision
end

local function check_smooth(p, s, now, cost)
  local capacity = p.capacity * p.unit
  local d = deficit(p, s)
  local remaining = units(p, sat_sub(capacity, d))
  if cost > p.capacity then
    return first_touch(p, s, deny(p.capacity, remaining, nil, micros(p, d)), d)
  end
  local deficit_after = d + cost * p.unit
  if deficit_after > capacity then
    local retry_after = micros(p, deficit_after - capacity)
    return first_touch(p, s, deny(p.capacity, remaining, retry_after, micros(p, d)), d)
  end
  local decision = allow(p.capacity, units(p, capacity - deficit_after), micros(p, deficit_after), 0)
  if cost == 0 then
    return first_touch(p, s, decision, d)
  end
  return decision, deficit_after
end

local function check_interval(p, s, now, cost)
  local tokens, boundary = tokens_at(p, s, now)
  local function after_refill(missing)
    if missing == 0 then
      return 0
    end
    return boundary + div_ceil(missing, p.refill) * p.interval - now
  end
  local function reset_after(t)
    return after_refill(sat_sub(p.capacity, t))
  end
  local level = { tokens = tokens, boundary = boundary }
  local held = max(tokens, 0)
  if cost > p.capacity then
    return first_touch(p, s, deny(p.capacity, held, nil, reset_after(tokens)), level)
  end
  if cost > tokens then
    local decision = deny(p.capacity, held, after_refill(cost - tokens), reset_after(tokens))
    return first_touch(p, s, decision, level)
  end
  tokens = tokens - cost
  local decision = allow(p.capacity, tokens, reset_after(tokens), 0)
  if cost == 0 then
    return first_touch(p, s, decision, level)
  end
  return decision, { tokens = tokens, boundary = boundary }
end

-- Units spent already: a debt the refill pays back, capped at max_debt
-- ticks (smooth) or whole tokens of them (interval).
local function forced(p, s, now, cost)
  if p.smooth then
    local d = min(deficit(p, s) + cost * p.unit, p.capacity * p.unit + p.max_debt)
    return d, d
  end
  local tokens, boundary = tokens_at(p, s, now)
  local level = { tokens = max(tokens - cost, -idiv(p.max_debt, p.unit)), boundary = boundary }
  return level, level
end

function token_bucket.decide(p, s, now, action, cost)
  if action == RECORD then
    return record_whole(token_bucket.decide, forced, p, s, now, cost)
  elseif action == RELEASE then
    cost = 0
  end
  if p.smooth then
    return check_smooth(p, s, now, cost)
  end
  return check_interval(p, s, now, cost)
end

function token_bucket.store(key, p, _, change, now, ttl)
  if p.smooth then
    local at, frac = tat_after(p, now, change)
    store_tat(key, p, token_bucket.tat, at, frac, ttl)
  else
    local value = format("i%d:%d:%d", change.tokens, change.boundary, now + ttl)
    rcall("SET", key, value, "PX", expire_ms(ttl))
  end
end

-- Gives back `cost` tokens, up to a full bucket; reports as a peek after.
-- No level is stored for a bucket that has none.
function token_bucket.refund(p, s, now, _, cost)
  if s == nil or s == OTHER_MODE or cost == 0 then
    return (token_bucket.decide(p, s, now, RELEASE, 0))
  end
  local level
  if p.smooth then
    level = sat_sub(deficit(p, s), cost * p.unit)
  else
    local tokens, boundary = tokens_at(p, s, now)
    level = { tokens = min(tokens + cost, p.capacity), boundary = boundary }
  end
  return token_bucket.decide(p, level, now, RELEASE, 0), level
end

ALGORITHMS[4] = token_bucket
