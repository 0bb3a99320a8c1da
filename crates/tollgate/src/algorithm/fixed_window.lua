-- fixed_window.rs: a counter per window, "f<end>:<count>"; it says nothing
-- once its window has ended. Windows are aligned on the epoch, or follow the
-- calendar: then the window is 0 and the client sends the starts of four
-- consecutive periods around its clock, the server picking its own.

local fixed_window = {}

function fixed_window.params(n)
  local p = { limit = n[2], window = n[3] }
  if p.window == 0 then
    p.bounds = { n[4], n[5], n[6], n[7] }
  end
  return p
end

-- The end of the window holding `at`; nil outside the bounds sent.
local function end_of(p, at)
  local b = p.bounds
  if b == nil then
    return at - imod(at, p.window) + p.window
  end
  for i = 1, 3 do
    if b[i] <= at and at < b[i + 1] then
      return b[i + 1]
    end
  end
  return nil
end

function fixed_window.load(key, p, now)
  local value = get_string(key)
  if not value then
    return nil
  end
  local window_end, count = match(value, "^f(%d+):(%d+)$")
  if not window_end then
    return other_state(value)
  end
  window_end = tonumber(window_end)
  if window_end <= now then
    return nil
  end
  return { window_end = window_end, count = tonumber(count) }
end

-- The end of the window counted in at now, and its count.
local function current(p, s, now)
  -- A newer window than now's (the clock went back) still counts.
  if s then
    return s.window_end, s.count
  end
  local window_end = end_of(p, now)
  if window_end == nil then
    error({ err = "ERR tollgate: a calendar window's periods do not hold the server's time (the client's clock is a period away)" })
  end
  return window_end, 0
end

function fixed_window.available(p, s, now)
  local _, count = current(p, s, now)
  return sat_sub(p.limit, count)
end

-- Units spent already: the window's count goes above the limit.
local function forced(p, s, now, cost)
  local window_end, count = current(p, s, now)
  local after = { window_end = window_end, count = count + cost }
  return after, after
end

function fixed_window.decide(p, s, now, action, cost)
  if action == RECORD then
    return record_whole(fixed_window.decide, forced, p, s, now, cost)
  elseif action == RELEASE then
    cost = 0
  end
  local window_end, count = current(p, s, now)
  local reset_after = 0
  if count > 0 then
    reset_after = window_end - now
  end
  local remaining = sat_sub(p.limit, count)
  if cost > p.limit then
    return deny(p.limit, remaining, nil, reset_after)
  end
  -- Over when count + cost > limit: a peek too, once usage recorded above
  -- the limit has left nothing (as envoyproxy/ratelimit counts).
  if count + cost > p.limit then
    return deny(p.limit, remaining, window_end - now, reset_after)
  end
  if cost == 0 then
    return allow(p.limit, remaining, reset_after, 0)
  end
  count = count + cost
  return allow(p.limit, remaining - cost, window_end - now, 0), { window_end = window_end, count = count }
end

function fixed_window.store(key, _, _, change, _, ttl)
  rcall("SET", key, format("f%d:%d", change.window_end, change.count), "PX", expire_ms(ttl))
end

-- Gives back units taken at `at` from the count of the window holding `at`,
-- when that window is still the one counted; reports as a peek after.
function fixed_window.refund(p, s, now, at, cost)
  if s == nil or end_of(p, at) ~= s.window_end or cost == 0 then
    return fixed_window.decide(p, s, now, RELEASE, 0)
  end
  local left = { window_end = s.window_end, count = sat_sub(s.count, cost) }
  return fixed_window.decide(p, left, now, RELEASE, 0), left
end

ALGORITHMS[1] = fixed_window
