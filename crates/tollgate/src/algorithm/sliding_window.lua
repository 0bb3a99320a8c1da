-- sliding_window.rs: a hash of sub-interval start (µs) -> count, at most
-- `buckets + 1` of them, and "x", when the state has no more to say. Counts
-- that left the window are deleted when the state is next written (as its
-- Rust version drops them), never on a read: a redefined limit may count them
-- again.

local sliding_window = {}

function sliding_window.params(n)
  return { limit = n[2], window = n[3], buckets = n[4] }
end

local function sub(p)
  return idiv(p.window, p.buckets)
end

-- When the count of the sub-interval starting at `start` leaves the window.
local function leaves(p, start)
  return start + (p.buckets + 1) * sub(p)
end

-- The live counts, oldest first, and their sum (s: that list, or nil).
function sliding_window.load(key, p, now)
  local raw = rpcall("HGETALL", key)
  if raw.err then
    return nil, true
  end
  if #raw == 0 then
    return nil, false
  end
  local counts, dead, expires = {}, {}, nil
  for i = 1, #raw, 2 do
    local index, count = tonumber(raw[i]), tonumber(raw[i + 1])
    if raw[i] == "x" then
      expires = count
    elseif not index or not count then
      -- Not a sliding window's hash.
      return nil, true
    elseif leaves(p, index) > now then
      counts[#counts + 1] = { index, count }
    else
      dead[#dead + 1] = raw[i]
    end
  end
  if #counts == 0 or not expires or expires <= now then
    return nil, true
  end
  sort(counts, function(x, y)
    return x[1] < y[1]
  end)
  counts.dead = dead
  return counts
end

local function total_of(counts)
  local total = 0
  if counts then
    for _, entry in ipairs(counts) do
      total = total + entry[2]
    end
  end
  return total
end

local function reset_after(p, counts, now)
  if counts == nil then
    return 0
  end
  return leaves(p, counts[#counts][1]) - now
end

function sliding_window.available(p, s)
  return sat_sub(p.limit, total_of(s))
end

-- Units spent already: counted in now's sub-interval above the limit.
local function forced(p, s, now, cost)
  local index = now - imod(now, sub(p))
  local counts, count, placed = {}, cost, false
  for _, entry in ipairs(s or {}) do
    if entry[1] == index then
      count = count + entry[2]
    else
      if not placed and entry[1] > index then
        counts[#counts + 1] = { index, count }
        placed = true
      end
      counts[#counts + 1] = entry
    end
  end
  if not placed then
    -- Kept in order of index: the newest, when nothing later was counted.
    counts[#counts + 1] = { index, count }
  end
  return counts, { index = index, count = count }
end

-- When `needed` units will have left (µs from now): the oldest counts
-- leave first.
local function counts_leave(p, s, now, needed)
  local freed = 0
  for _, entry in ipairs(s) do
    freed = freed + entry[2]
    if freed >= needed then
      return leaves(p, entry[1]) - now
    end
  end
  return nil
end

function sliding_window.decide(p, s, now, action, cost)
  if action == RECORD then
    return record_whole(sliding_window.decide, forced, p, s, now, cost)
  elseif action == RELEASE then
    cost = 0
  end
  local total = total_of(s)
  local refused = window_refusal(p, s, now, total, cost, reset_after, counts_leave)
  if refused then
    return refused
  end
  local remaining = sat_sub(p.limit, total)
  if cost == 0 then
    return allow(p.limit, remaining, reset_after(p, s, now), 0)
  end
  -- The newest count may be of a later sub-interval than now's (the clock went back).
  local index = now - imod(now, sub(p))
  local newest = index
  if s and s[#s][1] > index then
    newest = s[#s][1]
  end
  local count = cost
  for _, entry in ipairs(s or {}) do
    if entry[1] == index then
      count = count + entry[2]
    end
  end
  return allow(p.limit, remaining - cost, leaves(p, newest) - now, 0), { index = index, count = count }
end

function sliding_window.store(key, _, s, change, now, ttl, stale)
  if stale then
    rcall("UNLINK", key)
  elseif s and #s.dead > 0 then
    rcall("HDEL", key, unpack(s.dead))
  end
  if change.count > 0 then
    rcall("HSET", key, fmt(change.index), fmt(change.count), "x", fmt(now + ttl))
  else
    -- A refund emptied the sub-interval.
    rcall("HDEL", key, fmt(change.index))
    rcall("HSET", key, "x", fmt(now + ttl))
  end
  rcall("PEXPIRE", key, expire_ms(ttl))
end

-- Gives back units taken at `at` from the count of the sub-interval holding
-- `at`, while it counts; reports as a peek after.
function sliding_window.refund(p, s, now, at, cost)
  if s == nil or cost == 0 then
    return sliding_window.decide(p, s, now, RELEASE, 0)
  end
  local index = at - imod(at, sub(p))
  local counts, change = { dead = s.dead }, nil
  for _, entry in ipairs(s) do
    if entry[1] == index then
      change = { index = index, count = sat_sub(entry[2], cost) }
      if change.count > 0 then
        counts[#counts + 1] = { index, change.count }
      end
    else
      counts[#counts + 1] = entry
    end
  end
  if change == nil then
    return sliding_window.decide(p, s, now, RELEASE, 0)
  end
  if #counts == 0 then
    counts = nil
  end
  return sliding_window.decide(p, counts, now, RELEASE, 0), change
end

ALGORITHMS[2] = sliding_window
