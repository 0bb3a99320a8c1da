-- policy.rs: all-or-nothing over the limits of one decision, and the entry
-- point, which takes a batch of decisions (one TIME read per call).
--
-- Calling convention:
--   KEYS: the keys of every limit of every decision, in order.
--   args[1]: the number of decisions; then per decision:
--     now in µs ("": the server's TIME), op (CHECK … RESET), cost, n (limits),
--     max_wait in µs (-1: none), lease ("": none),
--     then per limit: "<algorithm id>:<its parameters>", joined by ':' (read
--     once and kept: a server sees few distinct limits), and the cost it sees.
-- Returns integers, per decision: status (1 allowed, 0 denied, -1 a key
-- holds a value Tollgate did not write), granted, then per limit (none for
-- a reset or a refusal): allowed, limit, remaining, retry_after (-1: never),
-- reset_after, wait.

-- Tables reused from call to call (cleared by overwriting the first n
-- entries), so that a decision allocates nothing it can avoid.
local LIMITS, COSTS, STATES, STALE, CHANGES = {}, {}, {}, {}, {}

-- Parameters by their text, parsed once.
local PARAMS, KNOWN, MAX_KNOWN = {}, 0, 1000

local function params_of(text)
  local p = PARAMS[text]
  if p then
    return p
  end
  local n = {}
  for number in string.gmatch(text, "[^:]+") do
    n[#n + 1] = tonumber(number)
  end
  local algorithm = ALGORITHMS[n[1]]
  p = algorithm.params(n)
  p.algorithm = algorithm
  if KNOWN >= MAX_KNOWN then
    PARAMS, KNOWN = {}, 0
  end
  PARAMS[text], KNOWN = p, KNOWN + 1
  return p
end

local function decide(keys, first, n, now, op, cost, max_wait, lease, reply)
  for i = 1, n do
    local p = LIMITS[i]
    local s, stale = p.algorithm.load(keys[first + i], p, now)
    if s == FOREIGN then
      reply[#reply + 1] = -1
      reply[#reply + 1] = 0
      return
    end
    STATES[i], STALE[i] = s, stale
  end
  local action = op
  if op == CHECK_AT_MOST then
    -- One cost for every limit (Rust refuses per-limit costs here).
    action = CHECK
    local least = math.huge
    for i = 1, n do
      least = math.min(least, LIMITS[i].algorithm.available(LIMITS[i], STATES[i], now))
    end
    if least == 0 and cost > 0 then
      cost = 1
    else
      cost = math.min(least, cost)
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
  if not allowed then
    -- Nothing is consumed: limits that would have admitted report as a peek.
    for i = 1, n do
      if SLOTS[i][1] == 1 then
        local p = LIMITS[i]
        use_slot(i)
        local _
        _, CHANGES[i] = p.algorithm.decide(p, STATES[i], now, action, 0, max_wait, lease)
      end
    end
  end
  for i = 1, n do
    if CHANGES[i] ~= nil then
      local p = LIMITS[i]
      p.algorithm.store(keys[first + i], p, STATES[i], CHANGES[i], now, SLOTS[i][5], STALE[i])
    end
  end
  local at = #reply
  reply[at + 1] = allowed and 1 or 0
  reply[at + 2] = allowed and cost or 0
  at = at + 2
  for i = 1, n do
    local d = SLOTS[i]
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4], reply[at + 5], reply[at + 6] =
      d[1], d[2], d[3], d[4], d[5], d[6]
    at = at + 6
  end
end

local function run(keys, args)
  local reply = {}
  local server_now
  local at, first = 2, 0
  for _ = 1, tonumber(args[1]) do
    local now = tonumber(args[at])
    explicit_now = now ~= nil
    if now == nil then
      if server_now == nil then
        local time = redis.call("TIME")
        server_now = tonumber(time[1]) * 1000000 + tonumber(time[2])
      end
      now = server_now
    end
    local op, cost, n = tonumber(args[at + 1]), tonumber(args[at + 2]), tonumber(args[at + 3])
    local max_wait, lease = tonumber(args[at + 4]), args[at + 5]
    at = at + 6
    if max_wait < 0 then
      max_wait = nil
    end
    if lease == "" then
      lease = nil
    end
    for i = 1, n do
      LIMITS[i], COSTS[i] = params_of(args[at]), tonumber(args[at + 1])
      at = at + 2
    end
    if op == RESET then
      for i = 1, n do
        redis.call("DEL", keys[first + i])
      end
      reply[#reply + 1] = 1
      reply[#reply + 1] = 0
    else
      decide(keys, first, n, now, op, cost, max_wait, lease, reply)
    end
    first = first + n
  end
  return reply
end
