-- policy.rs: all-or-nothing over the limits of one decision, and the entry
-- point, which takes a batch of decisions (one TIME read per call).
--
-- Calling convention (few arguments: Redis turns each into a Lua string):
--   KEYS: the keys of every limit of every decision, in order.
--   args[1]: the number of decisions; then per decision:
--     "<op>:<cost>:<n>:<max_wait>:<now>": op (CHECK … RECORD), cost, n
--     limits, max_wait in µs (-1: none), now in µs (empty: the server's
--     TIME);
--     the lease name, for ACQUIRE, RELEASE and REFUND only (empty: none);
--     for REFUND, then the instant the units were taken (µs);
--     per limit: "<algorithm id>:<its parameters>:<cost it sees>".
--   Texts are parsed once and kept (a server sees few distinct limits and
--   requests), except a head with an explicit now.
-- Returns integers, per decision: status (1 allowed, 0 denied, -1 a key
-- holds a value Tollgate did not write), granted, the instant decided at,
-- then per limit (none for a reset or a refusal): allowed, limit,
-- remaining, retry_after (-1: never), reset_after, wait. They come as one
-- string of 8-byte little-endian signed integers (struct.pack, in C): a
-- client reads it whole, where an array costs it one RESP integer to parse
-- per value.

-- Tables reused from call to call (cleared by overwriting the first n
-- entries), so that a decision allocates nothing it can avoid. The reply
-- too: a call packs its first REPLIED integers.
local LIMITS, COSTS, STATES, STALE, CHANGES = {}, {}, {}, {}, {}
local REPLY, REPLIED = {}, 0
-- The integers of a decision's reply before its limits', and per limit
-- (engine/protocol.rs).
local REPLY_HEAD, REPLY_PER_LIMIT = 3, 7
-- What each limit that alerts had available before a decision.
local BEFORE = {}
-- The decision's outbox ({ stream, max_len }; nil: none) and its label per
-- limit (engine/protocol.rs's Outbox).
local OUTBOX, LABELS = nil, {}

-- The numbers of a text "a:b:…" (empty fields skipped).
local function numbers(text)
  local n = {}
  for number in gmatch(text, "[^:]+") do
    n[#n + 1] = tonumber(number)
  end
  return n
end

-- Parsed texts by their text, at most MAX_KNOWN of them.
local PARSED, KNOWN, MAX_KNOWN = {}, 0, 1000

local function keep(text, parsed)
  if KNOWN >= MAX_KNOWN then
    PARSED, KNOWN = {}, 0
  end
  PARSED[text], KNOWN = parsed, KNOWN + 1
  return parsed
end

-- A limit's parameters, with its algorithm and the cost it sees.
local function limit_of(text)
  local p = PARSED[text]
  if p then
    return p
  end
  local n = numbers(text)
  local alerts = nil
  if n[1] >= ALERTS then
    n[1] = n[1] - ALERTS
    -- ...:<thresholds>:<their count>:<cost>
    local count = n[#n - 1]
    alerts = {}
    for i = 1, count do
      alerts[i] = n[#n - 1 - count + i - 1]
    end
  end
  local records_overage = n[1] >= RECORDS_OVERAGE
  if records_overage then
    n[1] = n[1] - RECORDS_OVERAGE
  end
  local algorithm = ALGORITHMS[n[1]]
  p = algorithm.params(n)
  p.algorithm, p.cost, p.records_overage, p.alerts = algorithm, n[#n], records_overage, alerts
  return keep(text, p)
end

-- The alert thresholds of `p` crossed by a decision `d` (a slot) on a
-- limit that had `before` units available: its use (the limit less what
-- remains) rose from below each to at or above; a mask, bit i-1 for the
-- i-th threshold (policy.rs, Crossing::found).
local function crossed(p, before, d)
  local limit = d[2]
  local used_before, used_after = limit - min(before, limit), limit - min(d[3], limit)
  local mask, bit = 0, 1
  for i = 1, #p.alerts do
    local at = p.alerts[i] * limit
    if used_before * 100 < at and used_after * 100 >= at then
      mask = mask + bit
    end
    bit = bit * 2
  end
  return mask
end

-- Adds the thresholds of `p` in `mask`, crossed by decision `d` of the
-- limit kept at `key` (the decision's i-th), to the outbox: per threshold,
-- an entry of the key, the limit's label, the threshold, the units used
-- and the limit, when the use resets and when it crossed (µs), as the
-- engine's `emit`.
local function emit(key, i, p, d, mask, now)
  if OUTBOX == nil then
    return
  end
  local limit = d[2]
  local used = limit - min(d[3], limit)
  local bit = 1
  for j = 1, #p.alerts do
    if mask % (2 * bit) >= bit then
      rcall("XADD", OUTBOX[1], "MAXLEN", "~", OUTBOX[2], "*", "key", key, "label", LABELS[i], "threshold",
        fmt(p.alerts[j]), "used", fmt(used), "limit", fmt(limit), "reset_at", fmt(now + d[5]), "at", fmt(now))
    end
    bit = bit * 2
  end
end

-- A decision's head: { op, cost, n, max_wait (nil: none), now (nil: TIME),
-- outbox (true: the limits are followed by an outbox's arguments) }.
local function head_of(text)
  local head = PARSED[text]
  if head then
    return head
  end
  local op, cost, n, max_wait, now, outbox = match(text, "^(%d+):(%d+):(%d+):(%-?%d+):(%d*):?(1?)$")
  op, max_wait = tonumber(op), tonumber(max_wait)
  head = { op, tonumber(cost), tonumber(n), max_wait >= 0 and max_wait or nil, tonumber(now), outbox == "1" }
  -- A head with an explicit now is seldom seen twice.
  if now ~= "" then
    return head
  end
  return keep(text, head)
end

-- Writes a limit's change: its state stops mattering after `ttl` µs (0: at
-- once, and the key goes, unless it holds ended entries not yet trimmed:
-- then it stays for the algorithm's `backlog`, to go in steps).
local function store(key, p, s, change, now, ttl, stale)
  local algorithm = p.algorithm
  if ttl == 0 and algorithm.backlog then
    ttl = algorithm.backlog(p, s)
  end
  if ttl == 0 then
    rcall("UNLINK", key)
  else
    algorithm.store(key, p, s, change, now, ttl, stale)
  end
end

-- Appends a decision's head to the reply: a refused decision's whole reply.
local function answer_head(status, granted, now)
  local at = REPLIED
  REPLY[at + 1], REPLY[at + 2], REPLY[at + 3] = status, granted, now
  REPLIED = at + REPLY_HEAD
end

-- Appends a decision's integers to the reply.
local function answer(status, granted, now, n)
  answer_head(status, granted, now)
  local reply, at = REPLY, REPLIED
  for i = 1, n do
    local d = SLOTS[i]
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5], reply[at + 6], reply[at + 7] =
      d[1], d[2], d[3], d[4], d[5], d[6], d[7]
    at = at + REPLY_PER_LIMIT
  end
  REPLIED = at
end

-- Appends the reply of a decision refused because a key holds a value
-- Tollgate did not write.
local function refuse_foreign(now)
  answer_head(-1, 0, now)
end

-- Stores each limit's change, if it made one (its slot says how long the
-- state carries information).
local function store_changes(keys, first, n, now)
  for i = 1, n do
    if CHANGES[i] ~= nil then
      store(keys[first + i], LIMITS[i], STATES[i], CHANGES[i], now, SLOTS[i][5], STALE[i])
    end
  end
end

-- Gives back `COSTS[i]` units taken at `at` on every limit: never refused.
local function refund(keys, first, n, now, at, cost, lease)
  for i = 1, n do
    local p = LIMITS[i]
    use_slot(i)
    local _
    _, CHANGES[i] = p.algorithm.refund(p, STATES[i], now, at, COSTS[i], lease)
  end
  store_changes(keys, first, n, now)
  answer(1, cost, now, n)
end

local function decide(keys, first, n, now, op, cost, max_wait, lease)
  for i = 1, n do
    local p = LIMITS[i]
    local s, stale = p.algorithm.load(keys[first + i], p, now)
    if s == FOREIGN then
      refuse_foreign(now)
      return
    end
    STATES[i], STALE[i] = s, stale
    if p.alerts then
      BEFORE[i] = p.algorithm.available(p, s, now)
    end
  end
  if op == REFUND then
    refund(keys, first, n, now, max_wait, cost, lease)
    return
  end
  local action = op
  if op == CHECK_AT_MOST then
    -- One cost for every limit (Rust refuses per-limit costs here).
    action = CHECK
    local least = huge
    for i = 1, n do
      least = min(least, LIMITS[i].algorithm.available(LIMITS[i], STATES[i], now))
    end
    if least == 0 and cost > 0 then
      cost = 1
    else
      cost = min(least, cost)
    end
    for i = 1, n do
      COSTS[i] = cost
    end
  end
  local allowed = true
  for i = 1, n do
    local p = LIMITS[i]
    use_slot(i)
    local decision
    decision, CHANGES[i] = p.algorithm.decide(p, STATES[i], now, action, COSTS[i], max_wait, lease)
    if decision[1] == 0 then
      allowed = false
    end
  end
  if not allowed and op ~= RECORD then
    -- Nothing is consumed: limits that would have admitted report as a
    -- peek; a refusing one that records its overage counts it.
    for i = 1, n do
      local p = LIMITS[i]
      if SLOTS[i][1] == 1 then
        use_slot(i)
        local _
        _, CHANGES[i] = p.algorithm.decide(p, STATES[i], now, action, 0, max_wait, lease)
      elseif p.records_overage and action == CHECK then
        use_slot(i)
        local _
        _, CHANGES[i] = p.algorithm.decide(p, STATES[i], now, RECORD, COSTS[i], max_wait, lease)
      end
    end
  end
  for i = 1, n do
    local p = LIMITS[i]
    if p.alerts and CHANGES[i] ~= nil then
      local mask = crossed(p, BEFORE[i], SLOTS[i])
      SLOTS[i][7] = mask
      if mask > 0 then
        emit(keys[first + i], i, p, SLOTS[i], mask, now)
      end
    end
  end
  store_changes(keys, first, n, now)
  answer(allowed and 1 or 0, (allowed or op == RECORD) and cost or 0, now, n)
end

-- decide() for one limit (not check_at_most or reset), without the loops:
-- with one limit a denial has nothing to give back. For a refund, max_wait
-- is the instant the units were taken.
local function decide_one(key, now, op, cost, max_wait, lease)
  local p = LIMITS[1]
  local algorithm = p.algorithm
  local s, stale = algorithm.load(key, p, now)
  if s == FOREIGN then
    refuse_foreign(now)
    return
  end
  use_slot(1)
  if op == REFUND then
    local _, change = algorithm.refund(p, s, now, max_wait, p.cost, lease)
    if change ~= nil then
      store(key, p, s, change, now, SLOTS[1][5], stale)
    end
    answer(1, cost, now, 1)
    return
  end
  local before = p.alerts and algorithm.available(p, s, now)
  local d, change = algorithm.decide(p, s, now, op, p.cost, max_wait, lease)
  if d[1] == 0 and p.records_overage and op == CHECK then
    d, change = algorithm.decide(p, s, now, RECORD, p.cost, max_wait, lease)
  end
  if change ~= nil then
    if before then
      d[7] = crossed(p, before, d)
      if d[7] > 0 then
        emit(key, 1, p, d, d[7], now)
      end
    end
    store(key, p, s, change, now, d[5], stale)
  end
  answer(d[1], (d[1] == 1 or op == RECORD) and cost or 0, now, 1)
end

-- struct.pack formats of 1 … PACK_CHUNK integers, made once each; longer
-- replies are packed in chunks (unpack puts every value on Lua's stack).
local PACK_FORMATS, PACK_CHUNK = {}, 240

local function pack_format(count)
  local f = PACK_FORMATS[count]
  if not f then
    f = "<" .. rep("i8", count)
    PACK_FORMATS[count] = f
  end
  return f
end

-- The first `count` integers of `reply`, packed.
local function packed(reply, count)
  if count <= PACK_CHUNK then
    return pack(pack_format(count), unpack(reply, 1, count))
  end
  local parts = {}
  for from = 1, count, PACK_CHUNK do
    local to = min(from + PACK_CHUNK - 1, count)
    parts[#parts + 1] = pack(pack_format(to - from + 1), unpack(reply, from, to))
  end
  return concat(parts)
end

local function run(keys, args)
  if not rcall then
    bind_standard_functions()
  end
  REPLIED = 0
  local server_now
  local at, first = 2, 0
  for _ = 1, tonumber(args[1]) do
    local head = head_of(args[at])
    local op, cost, n, max_wait, now = head[1], head[2], head[3], head[4], head[5]
    at = at + 1
    explicit_now = now ~= nil
    if now == nil then
      if server_now == nil then
        local time = rcall("TIME")
        server_now = tonumber(time[1]) * 1000000 + tonumber(time[2])
      end
      now = server_now
    end
    local lease = nil
    if op == ACQUIRE or op == RELEASE or op == REFUND then
      lease = args[at]
      at = at + 1
      if lease == "" then
        lease = nil
      end
      if op == REFUND then
        -- The instant the units were taken, in max_wait's place below.
        max_wait = tonumber(args[at])
        at = at + 1
      end
    end
    for i = 1, n do
      local p = limit_of(args[at])
      LIMITS[i], COSTS[i] = p, p.cost
      at = at + 1
    end
    OUTBOX = nil
    if head[6] then
      OUTBOX = { args[at], args[at + 1] }
      for i = 1, n do
        LABELS[i] = args[at + 1 + i]
      end
      at = at + 2 + n
    end
    if n == 1 and op ~= CHECK_AT_MOST and op ~= RESET then
      decide_one(keys[first + 1], now, op, cost, max_wait, lease)
    elseif op == RESET then
      for i = 1, n do
        rcall("UNLINK", keys[first + i])
      end
      answer_head(1, 0, now)
    else
      decide(keys, first, n, now, op, cost, max_wait, lease)
    end
    first = first + n
  end
  return packed(REPLY, REPLIED)
end
