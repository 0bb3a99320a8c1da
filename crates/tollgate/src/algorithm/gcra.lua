-- gcra.rs: one theoretical arrival time (TAT) per key, a bare integer
-- ("<at>:<frac>" when the rate does not divide into whole microseconds).

local gcra = { tat = tat_encoding("") }

-- τ + T: how far ahead of now the TAT may run, in ticks, is p.horizon.
function gcra.params(n)
  local burst, unit = n[2], n[3]
  return { burst = burst, unit = unit, per_micro = n[4], horizon = burst * unit, max_debt = n[5] }
end

function gcra.load(key, p, now)
  return load_tat(key, p, gcra.tat, now)
end

function gcra.available(p, s, now)
  local ahead = 0
  if s then
    ahead = s
  end
  return units(p, sat_sub(p.horizon, ahead))
end

-- Debt: the TAT runs past the horizon by the overspend, at most max_debt ticks.
local function forced(p, s, now, cost)
  local ahead = min((s or 0) + cost * p.unit, p.horizon + p.max_debt)
  return ahead, ahead
end

function gcra.decide(p, s, now, action, cost)
  if action == RECORD then
    return record_whole(gcra.decide, forced, p, s, now, cost)
  elseif action == RELEASE then
    cost = 0
  end
  local h = p.horizon
  -- Beyond the horizon after a record, by the debt.
  local ahead = s or 0
  local remaining = units(p, sat_sub(h, ahead))
  if cost > p.burst then
    return deny(p.burst, remaining, nil, micros(p, ahead))
  end
  local new_ahead = ahead + cost * p.unit
  if new_ahead > h then
    return deny(p.burst, remaining, micros(p, new_ahead - h), micros(p, ahead))
  end
  local decision = allow(p.burst, units(p, h - new_ahead), micros(p, new_ahead), 0)
  if cost == 0 then
    return decision
  end
  return decision, new_ahead
end

function gcra.store(key, p, _, new_ahead, now, ttl)
  local at, frac = tat_after(p, now, new_ahead)
  store_tat(key, p, gcra.tat, at, frac, ttl)
end

-- Gives back `cost` cells: the TAT moves back by their emission time,
-- never behind now; reports as a peek after.
function gcra.refund(p, s, now, _, cost)
  if s == nil or cost == 0 then
    return gcra.decide(p, s, now, RELEASE, 0)
  end
  local ahead = sat_sub(s, cost * p.unit)
  return gcra.decide(p, ahead, now, RELEASE, 0), ahead
end

ALGORITHMS[7] = gcra
