-- leaky_bucket.rs: the instant the queue has drained, "l<at>[:<frac>]".

local leaky_bucket = { tat = tat_encoding("l") }

function leaky_bucket.params(n)
  return { capacity = n[2], unit = n[3], per_micro = n[4] }
end

function leaky_bucket.load(key, p, now)
  return load_tat(key, p, leaky_bucket.tat, now)
end

function leaky_bucket.available(p, s, now)
  local queued = 0
  if s then
    queued = s
  end
  return units(p, sat_sub(p.capacity * p.unit, queued))
end

local function reserve(p, s, now, cost, max_wait)
  local capacity = p.capacity * p.unit
  -- Beyond the capacity after a record, by the overflow.
  local queued = s or 0
  local remaining = units(p, sat_sub(capacity, queued))
  if cost > p.capacity then
    return deny(p.capacity, remaining, nil, micros(p, queued))
  end
  local departure = micros(p, queued)
  local queued_after = queued + cost * p.unit
  local overfull = sat_sub(queued_after, capacity)
  local too_late = 0
  if max_wait then
    too_late = sat_sub(queued, max_wait * p.per_micro)
  end
  if overfull > 0 or too_late > 0 then
    local retry_after = micros(p, max(overfull, too_late))
    return deny(p.capacity, remaining, retry_after, micros(p, queued))
  end
  local decision = allow(p.capacity, units(p, capacity - queued_after), micros(p, queued_after), departure)
  if cost == 0 then
    return decision
  end
  return decision, queued_after
end

-- Units spent already: queued even beyond the capacity, which delays
-- whoever comes next by the overflow.
local function forced(p, s, now, cost)
  local queued = min((s or 0) + cost * p.unit, p.capacity * p.unit + MAX_TICKS)
  return queued, queued
end

local function check(p, s, now, _, cost)
  return reserve(p, s, now, cost, nil)
end

function leaky_bucket.decide(p, s, now, action, cost, max_wait)
  if action == RECORD then
    return record_whole(check, forced, p, s, now, cost)
  end
  -- `check` on a shaping limit waits for anything.
  return queue_action(reserve, p, s, now, action, cost, max_wait, nil)
end

function leaky_bucket.store(key, p, _, queued_after, now, ttl)
  local at, frac = tat_after(p, now, queued_after)
  store_tat(key, p, leaky_bucket.tat, at, frac, ttl)
end

-- Gives back `cost` units: they leave the queue; reports as a peek after.
function leaky_bucket.refund(p, s, now, _, cost)
  if s == nil or cost == 0 then
    return leaky_bucket.decide(p, s, now, RELEASE, 0)
  end
  local queued = sat_sub(s, cost * p.unit)
  return leaky_bucket.decide(p, queued, now, RELEASE, 0), queued
end

ALGORITHMS[6] = leaky_bucket
