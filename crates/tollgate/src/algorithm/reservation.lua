-- reservation.rs: the instant the permit store is full again (past
-- max_burst: debt), "r<at>[:<frac>]".

local reservation = { tat = tat_encoding("r") }

function reservation.params(n)
  return { max_burst = n[2], initial = n[3], unit = n[4], per_micro = n[5] }
end

function reservation.load(key, p, now)
  return load_tat(key, p, reservation.tat, now)
end

local function missing(p, s, now)
  if s then
    return s
  end
  return (p.max_burst - p.initial) * p.unit
end

local function remaining_after(p, m)
  local stored = p.max_burst * p.unit - m
  if stored < 0 then
    return 0
  end
  return units(p, stored) + 1
end

function reservation.available(p, s, now)
  if missing(p, s, now) <= p.max_burst * p.unit then
    return huge
  end
  return 0
end

local function reserve(p, s, now, cost, max_wait)
  local limit = p.max_burst + 1
  local full = p.max_burst * p.unit
  local m = missing(p, s, now)
  local remaining = remaining_after(p, m)
  local cost_ticks = ticks(p, cost)
  if cost_ticks == nil then
    return deny(limit, remaining, nil, micros(p, m))
  end
  local debt = sat_sub(m, full)
  local wait = micros(p, debt)
  local too_late = 0
  if max_wait then
    too_late = sat_sub(debt, max_wait * p.per_micro)
  end
  local missing_after = m + cost_ticks
  local over_cap = sat_sub(missing_after, full + MAX_TICKS)
  if too_late > 0 or over_cap > 0 then
    local retry_after = micros(p, max(too_late, over_cap))
    return deny(limit, remaining, retry_after, micros(p, m))
  end
  local decision = allow(limit, remaining_after(p, missing_after), micros(p, missing_after), wait)
  if cost == 0 then
    return decision
  end
  return decision, missing_after
end

local function check(p, s, now, _, cost)
  return reserve(p, s, now, cost, 0)
end

-- Past the cap on debt (2^52 ticks) nothing more is owed.
local function forced(p, s, now, cost)
  local _, missing_after = reserve(p, s, now, cost, nil)
  missing_after = missing_after or missing(p, s, now)
  return missing_after, missing_after
end

function reservation.decide(p, s, now, action, cost, max_wait)
  if action == RECORD then
    -- Spent already: borrowed whatever the wait, which the next caller
    -- pays; they fit when a check would have admitted them.
    return record_whole(check, forced, p, s, now, cost)
  end
  -- `check` on a borrowing limit waits for nothing.
  return queue_action(reserve, p, s, now, action, cost, max_wait, 0)
end

function reservation.store(key, p, _, missing_after, now, ttl)
  local at, frac = tat_after(p, now, missing_after)
  store_tat(key, p, reservation.tat, at, frac, ttl)
end

-- Gives back `cost` permits (a reservation cancelled): the permits missing
-- from a full store shrink by them; reports as a peek after.
function reservation.refund(p, s, now, _, cost)
  if s == nil or cost == 0 then
    return reservation.decide(p, s, now, RELEASE, 0)
  end
  local m = sat_sub(s, cost * p.unit)
  return reservation.decide(p, m, now, RELEASE, 0), m
end

ALGORITHMS[5] = reservation
