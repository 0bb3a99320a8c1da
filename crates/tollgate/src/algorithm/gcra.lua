-- gcra.rs: one theoretical arrival time (TAT) per key, a bare integer
-- ("<at>:<frac>" when the rate does not divide into whole microseconds).

local gcra = { tat = tat_encoding("") }

-- τ + T: how far ahead of now the TAT may run, in ticks, is p.horizon.
function gcra.params(n)
  local burst, unit = n[2], n[3]
  return { burst = burst, unit = unit, per_micro = n[4], horizon = burst * unit }
end

-- load_tat, with the usual state (a bare integer) read in one step.
function gcra.load(key, p, now)
  local value = rpcall("GET", key)
  local at = tonumber(value)
  if at then
    if at <= now then
      return nil
    end
    return (at - now) * p.per_micro
  end
  if type(value) ~= "string" then
    -- No key, or another algorithm's set or hash.
    return nil
  end
  return read_tat(value, p, gcra.tat, now)
end

function gcra.available(p, s, now)
  local ahead = 0
  if s then
    ahead = s
  end
  return units(p, sat_sub(p.horizon, ahead))
end

function gcra.decide(p, s, now, action, cost)
  if action == RELEASE then
    cost = 0
  end
  local h = p.horizon
  local ahead = 0
  if s then
    ahead = min(s, h)
  end
  local remaining = units(p, h - ahead)
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
  if p.per_micro == 1 and ttl > 0 then
    rcall("SET", key, fmt(now + new_ahead), "PX", expire_ms(ttl))
    return
  end
  local at, frac = tat_after(p, now, new_ahead)
  store_tat(key, gcra.tat, at, frac, ttl)
end

-- Gives back `cost` cells: the TAT moves back by their emission time,
-- never behind now; reports as a peek after.
function gcra.refund(p, s, now, _, cost)
  if s == nil or cost == 0 then
    return gcra.decide(p, s, now, RELEASE, 0)
  end
  local ahead = sat_sub(min(s, p.horizon), cost * p.unit)
  return gcra.decide(p, ahead, now, RELEASE, 0), ahead
end

-- A check of one limit, its decision appended to `reply` as decide_one
-- writes it: gcra.decide's check without the decision table.
function gcra.check(key, p, now, cost, granted, reply)
  local s = gcra.load(key, p, now)
  local at = #reply
  if s == FOREIGN then
    reply[at + 1], reply[at + 2], reply[at + 3] = -1, 0, now
    return
  end
  local h = p.horizon
  local ahead = 0
  if s and s > 0 then
    ahead = min(s, h)
  end
  local new_ahead = ahead + cost * p.unit
  if cost > p.burst or new_ahead > h then
    local retry_after = -1
    if cost <= p.burst then
      retry_after = micros(p, new_ahead - h)
    end
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = 0, 0, now, 0, p.burst
    reply[at + 6], reply[at + 7], reply[at + 8], reply[at + 9] = units(p, h - ahead), retry_after, micros(p, ahead), 0
    return
  end
  local reset_after = micros(p, new_ahead)
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5] = 1, granted, now, 1, p.burst
  reply[at + 6], reply[at + 7], reply[at + 8], reply[at + 9] = units(p, h - new_ahead), 0, reset_after, 0
  if cost > 0 then
    gcra.store(key, p, s, new_ahead, now, reset_after)
  end
end

ALGORITHMS[7] = gcra
