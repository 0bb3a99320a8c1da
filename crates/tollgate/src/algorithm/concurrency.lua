-- concurrency.rs: a sorted set of leases, each member a lease's name scored
-- by when it ends. Two kinds of member hold what the scores of leases
-- cannot, under names no lease has (they start with a NUL byte) and with
-- negative scores (below every lease): "\0n" the units held in total,
-- "\0c<name>" a lease's units when it holds other than one. So:
--   ended leases are the scores up to now: counted by one ZCOUNT, trimmed at
--     most TRIM_STEP a call (in one range when no lease holds other than
--     one unit), the rest counted in "\0n" until a later call trims them;
--   the units held are one ZSCORE less the ended leases' (their count when
--     every lease holds one unit), a lease's one ZMSCORE;
--   retry_after walks the leases soonest to end first, stopping when enough
--   units are freed (at most `needed` leases, each holds at least one unit).
-- A decision costs O(log n + TRIM_STEP + leases walked); when leases of
-- other than one unit and more than TRIM_STEP ended leases meet, add the
-- shortest of three walks (see ended_units).

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

-- The units of a page of leases (names).
local function units_of(key, page)
  local units = 0
  if #page > 0 then
    for _, cost in ipairs((costs_of(key, page, false))) do
      units = units + cost
    end
  end
  return units
end

-- The units of the leases scored in (min, max], walked a page at a time.
local function units_between(key, min_score, max_score)
  local units, offset = 0, 0
  while true do
    local page = rcall("ZRANGEBYSCORE", key, min_score, max_score, "LIMIT", offset, PAGE)
    units = units + units_of(key, page)
    if #page < PAGE then
      return units
    end
    offset = offset + PAGE
  end
end

-- The units of the `rest` ended leases still in the set (after this call's
-- trim), exact: `rest` when every lease holds one unit; otherwise by the
-- shortest of three walks: those leases; the live ones (their units taken
-- from `total`, what the set holds); or the leases of other than one unit,
-- whose extra units count when they have ended.
local function ended_units(key, now, total, rest, costly)
  if rest == 0 or costly == 0 then
    return rest
  end
  local after_now = "(" .. fmt(now)
  local live = rcall("ZCOUNT", key, after_now, "+inf")
  if live <= rest and live <= costly then
    return total - units_between(key, after_now, "+inf")
  elseif costly > rest then
    return units_between(key, "(0", now)
  end
  local extra, offset = 0, 0
  while true do
    local page = rcall("ZRANGEBYSCORE", key, "-inf", "(0", "WITHSCORES", "LIMIT", offset, PAGE)
    local names, costs = {}, {}
    for i = 1, #page, 2 do
      if page[i] ~= TOTAL then
        names[#names + 1] = substring(page[i], 3)
        costs[#costs + 1] = -tonumber(page[i + 1])
      end
    end
    if #names > 0 then
      local ends = rcall("ZMSCORE", key, unpack(names))
      for j = 1, #names do
        if ends[j] and tonumber(ends[j]) <= now then
          extra = extra + costs[j] - 1
        end
      end
    end
    if #page < 2 * PAGE then
      return rest + extra
    end
    offset = offset + PAGE
  end
end

-- s: { key, total (the units live leases hold), ended (the units of ended
-- leases left in the set) }, or nil when no lease is live.
function concurrency.load(key, _, now)
  local total = rpcall("ZSCORE", key, TOTAL)
  if type(total) == "table" then
    return nil, true
  end
  if not total then
    -- None, or another algorithm's set.
    return nil, rcall("EXISTS", key) == 1
  end
  -- The units of every lease in the set, ended or not.
  total = -tonumber(total)
  local ended = rcall("ZCOUNT", key, "(0", now)
  if ended == 0 then
    return { key = key, total = total, ended = 0 }
  end
  -- The oldest ended leases, at most TRIM_STEP, go now.
  local costly = rcall("ZCOUNT", key, "-inf", "(0") - 1
  local trimmed = min(ended, TRIM_STEP)
  if costly == 0 then
    -- "\0n" is rank 0, the ended leases the ranks after it.
    rcall("ZREMRANGEBYRANK", key, 1, trimmed)
    total = total - trimmed
  else
    local page = rcall("ZRANGEBYSCORE", key, "(0", now, "LIMIT", 0, TRIM_STEP)
    local costs, members = costs_of(key, page, false)
    for i, id in ipairs(page) do
      total = total - costs[i]
      members[#members + 1] = id
    end
    rcall("ZREM", key, unpack(members))
    costly = rcall("ZCOUNT", key, "-inf", "(0") - 1
  end
  rcall("ZADD", key, -total, TOTAL)
  local left = ended_units(key, now, total, ended - trimmed, costly)
  return { key = key, total = total - left, ended = left }
end

-- The units lease `id` holds while live (0: none, or ended), whether it
-- says so in a "\0c" member, and the units of the lease of that name when
-- it has ended but is still in the set (an acquire replaces it).
local function held_by(s, id, now)
  if s == nil or id == nil then
    return 0, false, 0
  end
  local scores = rcall("ZMSCORE", s.key, id, COST .. id)
  if not scores[1] then
    return 0, false, 0
  end
  local units = 1
  if scores[2] then
    units = -tonumber(scores[2])
  end
  if tonumber(scores[1]) <= now then
    return 0, scores[2] ~= false, units
  end
  return units, scores[2] ~= false, 0
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

-- Live leases other than `except` end soonest-first: when `needed` units are free.
local function freed_after(s, now, except, needed)
  local freed, offset = 0, 0
  local size = min(needed + 1, PAGE)
  while true do
    local page = rcall("ZRANGEBYSCORE", s.key, "(" .. fmt(now), "+inf", "WITHSCORES", "LIMIT", offset, size)
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
  local total, ended = 0, 0
  if s then
    total, ended = s.total, s.ended
  end
  local own, own_cost_member, replaced = held_by(s, lease, now)
  -- Renewing or releasing a lease first gives back the units it holds.
  local others = total - own
  if action == RELEASE then
    local decision = allow(p.limit, sat_sub(p.limit, others), sat_sub(latest(s, lease), now), 0)
    return decision, { release = lease, total = others + ended, own = own }
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
  -- "\0n" counts the ended leases left in the set, but for one replaced.
  local held = others + cost + ended - replaced
  return decision, { lease = lease, ends = ends, cost = cost, total = held, cost_member = own_cost_member }
end

-- µs the set stays when a decision leaves no lease live but ended leases
-- unread (0: none, it goes whole): the calls that come trim them in steps.
function concurrency.backlog(p, s)
  if s ~= nil and s.ended > 0 then
    return p.ttl
  end
  return 0
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
