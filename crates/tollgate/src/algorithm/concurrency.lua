-- concurrency.rs: a sorted set of leases, each member a lease's name scored
-- by when it ends. Two kinds of member hold what the scores of leases
-- cannot, under names no lease has (they start with a NUL byte) and with
-- negative scores (below every lease): "\0n" the units held in total,
-- "\0c<name>" a lease's units when it holds other than one. So:
--   ended leases are the scores up to now, trimmed a few at a time (in
--     one range when none of them holds other than one unit);
--   the units held are one ZSCORE, a lease's one ZMSCORE;
--   retry_after walks the leases soonest to end first, stopping when enough
--   units are freed (at most `needed` leases, each holds at least one unit).
-- A decision costs O(log n + leases ended + leases walked).

local concurrency = {}

local TOTAL = "\0n"
local COST = "\0c"
local PAGE = 64

function concurrency.params(n)
  return { limit = n[2], ttl = n[3] }
end

-- The units of each lease of `names` (members at odd places when `scored`),
-- from the "\0c" members: one unless one says otherwise.
local function costs_of(key, names, scored)
  local step = scored and 2 or 1
  local members = {}
  for i = 1, #names, step do
    members[#members + 1] = COST .. names[i]
  end
  local costs = rcall("ZMSCORE", key, unpack(members))
  for i, cost in ipairs(costs) do
    costs[i] = cost and -tonumber(cost) or 1
  end
  for i = #costs + 1, #members do
    costs[i] = 1
  end
  return costs, members
end

-- s: { key, total }, or nil when no lease is held.
function concurrency.load(key, _, now)
  local total = rpcall("ZSCORE", key, TOTAL)
  if type(total) == "table" then
    return nil, true
  end
  if not total then
    -- None, or another algorithm's set.
    return nil, rcall("EXISTS", key) == 1
  end
  total = -tonumber(total)
  local trimmed = false
  local ended = rcall("ZRANGEBYSCORE", key, "(0", now, "LIMIT", 0, PAGE)
  if #ended == PAGE and rcall("ZCOUNT", key, "-inf", "(0") == 1 then
    -- A page or more ended, and no lease holds other than one unit (the
    -- total is the only negative score): they go in one range.
    total = total - rcall("ZREMRANGEBYSCORE", key, "(0", now)
    trimmed = true
    ended = {}
  end
  while #ended > 0 do
    local costs, members = costs_of(key, ended, false)
    for i, id in ipairs(ended) do
      total = total - costs[i]
      members[#members + 1] = id
    end
    rcall("ZREM", key, unpack(members))
    trimmed = true
    if #ended < PAGE then
      break
    end
    ended = rcall("ZRANGEBYSCORE", key, "(0", now, "LIMIT", 0, PAGE)
  end
  if total <= 0 then
    rcall("UNLINK", key)
    return nil, false
  end
  if trimmed then
    rcall("ZADD", key, -total, TOTAL)
  end
  return { key = key, total = total }
end

-- The units lease `id` holds (0: none), and whether it says so in a "\0c" member.
local function held_by(s, id)
  if s == nil or id == nil then
    return 0, false
  end
  local scores = rcall("ZMSCORE", s.key, id, COST .. id)
  if not scores[1] then
    return 0, false
  end
  if scores[2] then
    return -tonumber(scores[2]), true
  end
  return 1, false
end

-- When the last lease other than `except` ends (0: none).
local function latest(s, except)
  if s == nil then
    return 0
  end
  local top = rcall("ZRANGE", s.key, -2, -1, "WITHSCORES")
  for i = #top - 1, 1, -2 do
    local ends = tonumber(top[i + 1])
    if ends > 0 and top[i] ~= except then
      return ends
    end
  end
  return 0
end

-- Leases other than `except` end soonest-first: when `needed` units are free.
local function freed_after(s, now, except, needed)
  local freed, offset = 0, 0
  local size = min(needed + 1, PAGE)
  while true do
    local page = rcall("ZRANGEBYSCORE", s.key, "(0", "+inf", "WITHSCORES", "LIMIT", offset, size)
    if #page == 0 then
      return nil
    end
    local costs = costs_of(s.key, page, true)
    for i = 1, #page, 2 do
      if page[i] ~= except then
        freed = freed + costs[(i + 1) / 2]
        if freed >= needed then
          return tonumber(page[i + 1]) - now
        end
      end
    end
    offset, size = offset + size, PAGE
  end
end

function concurrency.available(p, s)
  if s == nil then
    return p.limit
  end
  return sat_sub(p.limit, s.total)
end

function concurrency.decide(p, s, now, action, cost, _, lease)
  local total = 0
  if s then
    total = s.total
  end
  local own, own_cost_member = held_by(s, lease)
  -- Renewing or releasing a lease first gives back the units it holds.
  local others = total - own
  if action == RELEASE then
    local decision = allow(p.limit, sat_sub(p.limit, others), sat_sub(latest(s, lease), now), 0)
    return decision, { release = lease, total = others, own = own }
  end
  -- What is held now, as a peek reports it.
  local remaining = sat_sub(p.limit, total)
  local reset_after = sat_sub(latest(s, nil), now)
  if cost > p.limit then
    return deny(p.limit, remaining, nil, reset_after)
  end
  if cost > sat_sub(p.limit, others) then
    local retry_after = freed_after(s, now, lease, others + cost - p.limit)
    return deny(p.limit, remaining, retry_after, reset_after)
  end
  if lease == nil or cost == 0 then
    return allow(p.limit, remaining, reset_after, 0)
  end
  local ends = now + p.ttl
  local decision = allow(p.limit, p.limit - others - cost, max(latest(s, lease), ends) - now, 0)
  return decision, { lease = lease, ends = ends, cost = cost, total = others + cost, cost_member = own_cost_member }
end

function concurrency.store(key, _, _, change, _, ttl, stale)
  if stale then
    rcall("UNLINK", key)
  end
  local lease = change.lease or change.release
  if change.release then
    if change.own > 0 then
      rcall("ZREM", key, lease, COST .. lease)
      rcall("ZADD", key, -change.total, TOTAL)
    end
  elseif change.cost ~= 1 then
    rcall("ZADD", key, change.ends, lease, -change.cost, COST .. lease, -change.total, TOTAL)
  else
    rcall("ZADD", key, change.ends, lease, -change.total, TOTAL)
    if change.cost_member then
      rcall("ZREM", key, COST .. lease)
    end
  end
  rcall("PEXPIRE", key, expire_ms(ttl))
end

-- Gives back what lease `lease` holds (an acquire undone), as a release;
-- without a lease, a peek.
function concurrency.refund(p, s, now, _, _, lease)
  if lease == nil then
    return concurrency.decide(p, s, now, CHECK, 0)
  end
  return concurrency.decide(p, s, now, RELEASE, 0, nil, lease)
end

ALGORITHMS[8] = concurrency
