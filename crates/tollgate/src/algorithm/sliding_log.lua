-- sliding_log.rs: a sorted set. Each member is an instant (µs, as text)
-- whose score is the running total of units admitted up to and including
-- it; the member "\0b" holds the base, the total before the oldest entry,
-- and "\0x" minus the instant the log has no more to say (so it sorts first).
-- Once that instant has passed, the log lapsed: every entry is dead, and
-- stays so whatever the window, for "\0x" is then named "\0x<instant>"
-- (entries stamped before it are dead) until a later lapse; the dead are
-- trimmed in steps as the others, so no call frees a whole set.
-- Instants and totals rise together, so:
--   the live units are newest total − base;
--   the entry at which `needed` units have left is the first whose total is
--   at least base + needed, one ZRANGEBYSCORE;
--   the last entry that left the window is found from the front when few
--   have, else by a bisection over ranks (O(log² n)); an admission trims the
--   oldest of them, at most TRIM_STEP (as its Rust version drops them; the
--   rest stay, known to have left, for later admissions), never a read: a
--   redefined limit may count them again.
-- A decision costs O(log² n + TRIM_STEP). Totals stay below 2^53 for
-- as long as fewer than 2^53 units are admitted to one key without a pause
-- of one window (at a million units a second, 285 years).

local sliding_log = {}

local BASE = "\0b"
local EXPIRES = "\0x"
-- Entries read at a time: the head of the log, and a page of a refund's walk.
local TRIM_BATCH = 32

function sliding_log.params(n)
  return { limit = n[2], window = n[3] }
end

-- Whether an entry stamped `at` has left at `now`: the window has passed
-- it, or it is dead (stamped before `dead`).
local function left(p, at, dead, now)
  return at < dead or at + p.window <= now
end

-- Since when a log's entries are dead (0: none), from the name of its first
-- member; nil: not a log.
local function dead_since(member)
  if substring(member, 1, 2) ~= EXPIRES then
    return nil
  end
  if #member == 2 then
    return 0
  end
  return tonumber(substring(member, 3))
end

-- The rank of the last entry that has left the window, between rank `lo`
-- (one that has left) and rank `hi` (one that has not): a bisection, each
-- step one ZRANGE of one member.
local function last_gone(key, p, now, dead, lo, hi)
  while hi - lo > 1 do
    local mid = idiv(lo + hi, 2)
    if left(p, tonumber(rcall("ZRANGE", key, mid, mid)[1]), dead, now) then
      lo = mid
    else
      hi = mid
    end
  end
  return lo
end

-- s: { key, base (the total through the last entry that left), trimmed
-- (the entries an admission trims), trim_base ("\0b" once they are
-- trimmed), last_at, last_total, last_member, left (the entries that
-- left), dead (entries stamped before it are dead), expiry (the name "\0x"
-- has) }, or nil for an empty log. A
-- log whose every entry has left holds none live, and an admission trims a
-- step of it, as of any other.
function sliding_log.load(key, p, now)
  local head = rpcall("ZRANGE", key, 0, TRIM_BATCH + 1, "WITHSCORES")
  if head.err then
    return nil, true
  end
  if #head == 0 then
    return nil, false
  end
  local dead = dead_since(head[1])
  if dead == nil or head[3] ~= BASE then
    -- Another algorithm's set.
    return nil, true
  end
  local last = { head[#head - 1], head[#head] }
  if #head >= 2 * (TRIM_BATCH + 2) then
    last = rcall("ZRANGE", key, -1, -1, "WITHSCORES")
  end
  if last[1] == BASE then
    -- No entry: the log says nothing (a write replaces the set whole).
    return nil, true
  end
  local last_at = tonumber(last[1])
  if -tonumber(head[2]) <= now then
    -- The log lapsed: every entry is dead.
    dead = last_at + 1
  end
  -- The entries that left the window are ranks 2 .. gone (gone = 1: none).
  local gone, base, i = 1, tonumber(head[4]), 5
  while i <= #head and left(p, tonumber(head[i]), dead, now) do
    gone, base, i = gone + 1, tonumber(head[i + 1]), i + 2
  end
  if i > #head then
    if left(p, last_at, dead, now) then
      -- Every entry has left: the last that left is the newest.
      gone = rcall("ZCARD", key) - 1
      base = tonumber(last[2])
    else
      -- Every entry read left and the newest did not: the last that left,
      -- by bisection up to the newest.
      gone = last_gone(key, p, now, dead, gone, rcall("ZCARD", key) - 1)
      base = tonumber(rcall("ZRANGE", key, gone, gone, "WITHSCORES")[2])
    end
  end
  local trimmed = min(gone - 1, TRIM_STEP)
  local trim_base = base
  if trimmed < gone - 1 then
    trim_base = tonumber(rcall("ZRANGE", key, trimmed + 1, trimmed + 1, "WITHSCORES")[2])
  end
  return {
    key = key,
    base = base,
    trimmed = trimmed,
    trim_base = trim_base,
    last_at = last_at,
    last_total = tonumber(last[2]),
    last_member = last[1],
    left = gone - 1,
    dead = dead,
    expiry = head[1],
  }
end

local function reset_after(p, s, now)
  if s == nil or s.last_total == s.base then
    return 0
  end
  return s.last_at + p.window - now
end

function sliding_log.available(p, s)
  if s == nil then
    return p.limit
  end
  return sat_sub(p.limit, s.last_total - s.base)
end

local record

-- When `needed` units will have left (µs from now): the oldest entries
-- leave first.
local function entries_leave(p, s, now, needed)
  local entry = rcall("ZRANGEBYSCORE", s.key, s.base + needed, "+inf", "LIMIT", 0, 1)
  return tonumber(entry[1]) + p.window - now
end

function sliding_log.decide(p, s, now, action, cost)
  if action == RECORD then
    return record(p, s, now, cost)
  elseif action == RELEASE then
    cost = 0
  end
  local total = 0
  if s then
    total = s.last_total - s.base
  end
  local refused = window_refusal(p, s, now, total, cost, reset_after, entries_leave)
  if refused then
    return refused
  end
  local remaining = sat_sub(p.limit, total)
  if cost == 0 then
    return allow(p.limit, remaining, reset_after(p, s, now), 0)
  end
  -- Stamped no earlier than the newest entry, so the log stays in order
  -- when the clock goes back (the entry then leaves a little late, never early).
  local stamp = now
  if s and s.last_at > now then
    stamp = s.last_at
  end
  return allow(p.limit, remaining - cost, stamp + p.window - now, 0), { stamp = stamp, cost = cost }
end

-- Logs units spent already, whether or not they fit (a check when they
-- do). Over the limit, the decision is a check of the same cost on the log
-- with them in it, found without building it.
record = function(p, s, now, cost)
  local d, change = sliding_log.decide(p, s, now, CHECK, cost)
  -- A record of nothing is a peek.
  if d[1] == 1 or cost == 0 then
    return d, change
  end
  local total = 0
  local stamp = now
  if s then
    total = s.last_total - s.base
    if s.last_at > now then
      stamp = s.last_at
    end
  end
  -- A request of `cost` after them waits until enough units have left:
  -- the logged ones first, then these.
  local retry_after = nil
  if cost <= p.limit then
    local needed = total + cost + cost - p.limit
    if s and needed <= total then
      local entry = rcall("ZRANGEBYSCORE", s.key, s.base + needed, "+inf", "LIMIT", 0, 1)
      retry_after = tonumber(entry[1]) + p.window - now
    else
      retry_after = stamp + p.window - now
    end
  end
  return deny(p.limit, 0, retry_after, stamp + p.window - now), { stamp = stamp, cost = cost }
end

-- Gives back units admitted at `at`: they leave the entry stamped `at`,
-- while it counts, and every later total drops by them (an admission made
-- after the clock went back, stamped at the newest entry's instant, finds
-- none and gets nothing back). Walks back from the newest entry, so it
-- costs O(log n + entries newer than `at`). Reports as a peek after; so does
-- a refund of units that have left.
function sliding_log.refund(p, s, now, at, cost)
  if s == nil or cost == 0 or left(p, at, s.dead, now) then
    return sliding_log.decide(p, s, now, RELEASE, 0)
  end
  -- Entries stamped at or after `at`, newest first; the total before them
  -- and the stamp of the entry before them (nil: none).
  local newer, before, before_at = {}, nil, nil
  local offset = 0
  while before == nil do
    local page = rcall("ZRANGE", s.key, -(offset + TRIM_BATCH), -(offset + 1), "WITHSCORES")
    for i = #page - 1, 1, -2 do
      local member = page[i]
      if member == BASE or dead_since(member) then
        before = tonumber(page[i + 1])
        break
      end
      local stamp = tonumber(member)
      if stamp < at then
        before, before_at = tonumber(page[i + 1]), stamp
        break
      end
      newer[#newer + 1] = { member, stamp, tonumber(page[i + 1]) }
    end
    if #page < 2 * TRIM_BATCH then
      break
    end
    offset = offset + TRIM_BATCH
  end
  local own = newer[#newer]
  if own == nil or before == nil or own[2] ~= at then
    return sliding_log.decide(p, s, now, RELEASE, 0)
  end
  local units = own[3] - before
  local removed = min(cost, units)
  local total = s.last_total - removed - s.base
  local newest = s.last_at
  if removed == units and #newer == 1 then
    newest = before_at
  end
  local reset_after = 0
  if total > 0 then
    reset_after = newest + p.window - now
  end
  local decision = allow(p.limit, sat_sub(p.limit, total), reset_after, 0)
  return decision, { refund = newer, removed = removed, emptied = removed == units }
end

-- µs the set stays when a refund leaves no entry live but more than a
-- step of entries that left (0: none, it goes whole): the calls that come
-- trim them in steps.
function sliding_log.backlog(p, s)
  if s ~= nil and s.left > TRIM_STEP then
    return p.window
  end
  return 0
end

-- "\0x" as `s` names it (dead since when), writing it so; the name it had
-- goes.
local function expiry(key, s)
  if s == nil or s.dead == 0 then
    return EXPIRES
  end
  local name = EXPIRES .. fmt(s.dead)
  if s.expiry ~= name then
    rcall("ZREM", key, s.expiry)
  end
  return name
end

function sliding_log.store(key, _, s, change, now, ttl, stale)
  local expires = -(now + ttl)
  if change.refund then
    local newer = change.refund
    for i = 1, #newer - 1 do
      rcall("ZINCRBY", key, -change.removed, newer[i][1])
    end
    if change.emptied then
      rcall("ZREM", key, newer[#newer][1])
    else
      rcall("ZINCRBY", key, -change.removed, newer[#newer][1])
    end
    rcall("ZADD", key, expires, expiry(key, s))
    rcall("PEXPIRE", key, expire_ms(ttl))
    return
  end
  if s == nil then
    if stale then
      rcall("UNLINK", key)
    end
    rcall("ZADD", key, expires, EXPIRES, 0, BASE, change.cost, fmt(change.stamp))
  else
    if s.trimmed > 0 then
      rcall("ZREMRANGEBYRANK", key, 2, s.trimmed + 1)
    end
    local member = s.last_member
    if change.stamp ~= s.last_at then
      member = fmt(change.stamp)
    end
    rcall("ZADD", key, expires, expiry(key, s), s.trim_base, BASE, s.last_total + change.cost, member)
  end
  rcall("PEXPIRE", key, expire_ms(ttl))
end

ALGORITHMS[3] = sliding_log
