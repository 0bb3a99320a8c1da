-- Tollgate's Redis library: every algorithm of crates/tollgate/src/algorithm/,
-- each in a Lua file beside its Rust version, assembled in the order
-- prelude.lua, the algorithms, tollgate.lua (store/redis/mod.rs).
--
-- On Redis 7+ and Valkey the library is loaded once with FUNCTION LOAD and
-- called with FCALL, so nothing below is defined per call; on Redis 6.2 the
-- same source runs through EVALSHA.
--
-- Lua numbers are doubles, exact for integers below 2^53; every quantity
-- stays below that (limits are validated in Rust), and integer division goes
-- through idiv, never a bare `/`. Numbers reach Redis as strings written by
-- fmt (an integer format: exact, and cheaper than the 17-digit float format
-- Redis applies to a Lua number).

local MAX_TICKS = 4503599627370496 -- 2^52
-- The most ended entries (log entries, leases) one call trims: the others
-- stay, known to have ended, for later calls (TRIM_STEP in algorithm/core.rs).
local TRIM_STEP = 250

-- The standard functions, read as upvalues. Redis runs a library's top level
-- without them and serves every global read at call time through a lookup
-- of its own, so they are bound once, by the entry point's first call.
local tonumber, type, unpack, ipairs, floor, min, max, huge
local format, match, find, gmatch, substring, sort, rcall, rpcall
local pack, concat, rep

local function bind_standard_functions()
  tonumber, type, unpack, ipairs = _G.tonumber, _G.type, _G.unpack, _G.ipairs
  floor, min, max, huge = _G.math.floor, _G.math.min, _G.math.max, _G.math.huge
  format, match, find, gmatch = _G.string.format, _G.string.match, _G.string.find, _G.string.gmatch
  substring, sort, rcall, rpcall = _G.string.sub, _G.table.sort, _G.redis.call, _G.redis.pcall
  pack, concat, rep = _G.struct.pack, _G.table.concat, _G.string.rep
end

-- Integer arithmetic on doubles, exact below 2^53.
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

local function imod(a, b)
  return a - idiv(a, b) * b
end

local function div_ceil(a, b)
  local q = idiv(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

local function sat_sub(a, b)
  if a > b then
    return a - b
  end
  return 0
end

local function fmt(n)
  return format("%d", n)
end

-- Decisions, as Decision::allow and Decision::deny (-1 retry_after: never).
-- A decision is written into the slot of the limit being decided (a table
-- reused from call to call, chosen by use_slot), so that deciding allocates
-- nothing: every table a call builds is garbage Redis must collect.
local SLOTS = {}
local slot

local function use_slot(i)
  slot = SLOTS[i]
  if slot == nil then
    slot = {}
    SLOTS[i] = slot
  end
  return slot
end

local function allow(limit, remaining, reset_after, wait)
  slot[1], slot[2], slot[3], slot[4], slot[5], slot[6], slot[7] = 1, limit, remaining, 0, reset_after, wait, 0
  return slot
end

local function deny(limit, remaining, retry_after, reset_after)
  slot[1], slot[2], slot[3], slot[4], slot[5], slot[6], slot[7] = 0, limit, remaining, retry_after or -1, reset_after, 0, 0
  return slot
end

-- A window limit's refusal of `cost` units when it counts `total`, as the
-- windows' Rust versions refuse them; nil when they fit. `reset_after` is
-- the limit's; `leave(p, s, now, needed)` says when `needed` units will
-- have left the window (µs from now). Over when total + cost > limit: a peek too, once
-- usage recorded above the limit has left nothing.
local function window_refusal(p, s, now, total, cost, reset_after, leave)
  local remaining = sat_sub(p.limit, total)
  if cost > p.limit then
    return deny(p.limit, remaining, nil, reset_after(p, s, now))
  end
  if total + cost > p.limit then
    return deny(p.limit, remaining, leave(p, s, now, total + cost - p.limit), reset_after(p, s, now))
  end
  return nil
end

-- What a request asks of each limit (the op codes of engine/protocol.rs).
local CHECK, CHECK_AT_MOST, RESERVE, ACQUIRE, RELEASE, RESET, REFUND, RECORD = 1, 2, 3, 4, 5, 6, 7, 8
-- Added to a limit's algorithm id when a check it refuses still records its
-- cost (engine/protocol.rs's RECORDS_OVERAGE).
local RECORDS_OVERAGE = 128
-- Added to it when the limit alerts (engine/protocol.rs's ALERTS): its
-- parameters are followed by its thresholds and their count.
local ALERTS = 256

-- A record (RECORD: units spent already, counted whether or not they fit),
-- as core.rs's record_whole: a check when they fit; otherwise the state
-- forced(p, s, now, cost) returns with them counted (as loaded, then as the
-- change to store), and the decision a check of the same cost gets on it.
local function record_whole(decide, forced, p, s, now, cost)
  local d, change = decide(p, s, now, CHECK, cost)
  -- A record of nothing is a peek.
  if d[1] == 1 or cost == 0 then
    return d, change
  end
  local after
  after, change = forced(p, s, now, cost)
  return (decide(p, after, now, CHECK, cost)), change
end

-- How a borrowing or shaping limit (reservation, leaky bucket) runs an
-- action, as their Rust versions' `decide` do: a release only reports (never
-- denied, never waits); `check` accepts a wait of at most `check_wait`
-- (nil: any).
local function queue_action(reserve, p, s, now, action, cost, max_wait, check_wait)
  if action == RELEASE then
    local decision = reserve(p, s, now, 0, nil)
    decision[6] = 0
    return decision
  end
  if action == CHECK then
    max_wait = check_wait
  end
  return reserve(p, s, now, cost, max_wait)
end

-- rate.rs: exact rates in ticks. A rate is p.unit (ticks per unit of cost)
-- and p.per_micro (ticks per microsecond); an instant with sub-microsecond
-- precision (a TAT) is two numbers, `at` (µs) and `frac` (ticks, < per_micro).

local function ticks(p, units)
  local t = units * p.unit
  if t > MAX_TICKS then
    return nil
  end
  return t
end

local function micros(p, t)
  if p.per_micro == 1 then
    return t
  end
  return div_ceil(t, p.per_micro)
end

local function units(p, t)
  if p.unit == 1 then
    return t
  end
  return idiv(t, p.unit)
end

-- Ticks between now and the instant (at, frac); zero once it has passed.
local function backlog(p, at, frac, now)
  if at < now then
    return 0
  end
  return (at - now) * p.per_micro + frac
end

-- The instant `b` ticks after now.
local function tat_after(p, now, b)
  if p.per_micro == 1 then
    return now + b, 0
  end
  local whole = idiv(b, p.per_micro)
  return now + whole, b - whole * p.per_micro
end

-- Storage ---------------------------------------------------------------
--
-- Each limit of each subject is one key, in the encoding of its algorithm:
-- a string for states of one or two numbers (GCRA's TAT is a bare integer,
-- the others carry a one-letter tag), a hash for the sliding window's
-- buckets, a sorted set for the sliding log and the concurrency leases.
-- A state whose information has run out counts as none: each state says
-- when that is (a TAT by itself, the others by the instant they were
-- written with, as the memory store records it), so a limit redefined with
-- other parameters sees the same states in both stores. A key holding
-- another algorithm's state counts as none too. A string that is no state of any algorithm
-- was not written by Tollgate: the decision is refused (FOREIGN).

local FOREIGN = {}

-- With the server's time a key expires exactly when its state stops carrying
-- information. With a caller's `now` (tests, replays) real time and the
-- caller's time differ, so the key is kept at least EXPLICIT_NOW_TTL ms; the
-- decision never depends on it, since each state says when it lapses in the
-- caller's time.
local EXPLICIT_NOW_TTL = 3600000
local explicit_now = false

-- The texts of recent expiries, by their ms (decisions of one limit often
-- share one: a window's end, a short TAT), at most MAX_EXPIRY_TEXTS of them.
local EXPIRY_TEXTS, EXPIRY_TEXTS_KEPT, MAX_EXPIRY_TEXTS = {}, 0, 256

-- The expiry of a state that says something for `ttl` µs: in ms, as text.
local function expire_ms(ttl)
  local ms = div_ceil(ttl, 1000)
  if explicit_now and ms < EXPLICIT_NOW_TTL then
    ms = EXPLICIT_NOW_TTL
  end
  local text = EXPIRY_TEXTS[ms]
  if text == nil then
    if EXPIRY_TEXTS_KEPT >= MAX_EXPIRY_TEXTS then
      EXPIRY_TEXTS, EXPIRY_TEXTS_KEPT = {}, 0
    end
    text = fmt(ms)
    EXPIRY_TEXTS[ms], EXPIRY_TEXTS_KEPT = text, EXPIRY_TEXTS_KEPT + 1
  end
  return text
end

-- The string at `key`: the value, nil when there is none, or false when
-- the key holds another type (another algorithm's set or hash).
local function get_string(key)
  local value = rpcall("GET", key)
  if type(value) == "table" then
    return false
  end
  return value or nil
end

-- A string holding some algorithm's state (another one's, when the caller
-- did not recognise it) counts as none; anything else is FOREIGN.
local function other_state(value)
  if find(value, "^[filrs]?%d+:?%d*:?%d*$") or find(value, "^%-%d%d%d%d+$") or find(value, "^i%-%d+:%d+:%d+$") then
    return nil
  end
  return FOREIGN
end

-- TAT states: "<tag><at>" or "<tag><at>:<frac>". A TAT that has passed says
-- nothing. Every algorithm keeping one reads it only as its backlog (the
-- ticks between now and the TAT), so that is what the state is once loaded:
-- one number.
--
-- GCRA's tag is empty and its TAT an integer Redis stores as one (no string
-- allocated, the size of a bare timestamp): `<at>` in whole microseconds, or
-- packed as `-<at><frac in 3 digits>` when a microsecond holds at most 1 000
-- ticks (the sign marks the packing, which reads as a number too large for a
-- double to hold exactly, so it is read back as text); `<at>:<frac>` beyond.
--
-- How an algorithm with tag `tag` keeps its TAT: the pattern that reads it,
-- the formats that write it (one string.format call either way).
local PACKED_TICKS = 1000

local function tat_encoding(tag)
  return {
    pattern = "^" .. tag .. "(%d+):?(%d*)$",
    whole = tag .. "%d",
    fractional = tag .. "%d:%d",
    packed = tag == "" and "-%d%03d" or nil,
  }
end

local function load_tat(key, p, encoding, now)
  local value = get_string(key)
  if not value then
    return nil
  end
  local at, frac = nil, 0
  if encoding.packed then
    at = tonumber(value)
    if at and at < 0 then
      at, frac = tonumber(substring(value, 2, -4)), tonumber(substring(value, -3))
      if not (at and frac) then
        return other_state(value)
      end
    end
  end
  if not at then
    local a, f = match(value, encoding.pattern)
    if not a then
      return other_state(value)
    end
    at, frac = tonumber(a), tonumber(f) or 0
  end
  if at + (frac > 0 and 1 or 0) <= now then
    return nil
  end
  return backlog(p, at, frac, now)
end

local function store_tat(key, p, encoding, at, frac, ttl)
  local value
  if frac == 0 then
    value = format(encoding.whole, at)
  elseif encoding.packed and p.per_micro <= PACKED_TICKS then
    value = format(encoding.packed, at, frac)
  else
    value = format(encoding.fractional, at, frac)
  end
  rcall("SET", key, value, "PX", expire_ms(ttl))
end

-- The algorithms, by the id store/redis/mod.rs sends. Each registers
--   params(argv, at) -> p, next: its parameters from the arguments;
--   load(key, p, now) -> state (nil: none; FOREIGN), stale: whether the key
--     holds a set or hash of another algorithm that a write must clear;
--   available(p, s, now) -> units a check would admit now;
--   decide(p, s, now, action, cost, max_wait, lease) -> decision, change;
--   refund(p, s, now, at, cost, lease) -> decision, change: gives back
--     `cost` units taken at `at` (a lease's, on leases), reporting as a peek;
--   store(key, p, s, change, now, ttl, stale): writes what changed, whose
--     state says something for ttl > 0 µs (tollgate.lua deletes the key of
--     a change that says nothing more, ttl 0, instead of calling store).
local ALGORITHMS = {}
