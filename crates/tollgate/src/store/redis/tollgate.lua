-- policy.rs: all-or-nothing over the limits of one decision, and the entry
-- point, which takes a batch of decisions (one TIME read per call).
--
-- Calling convention:
--   KEYS: the keys of every limit of every decision, in order.
--   args[1]: the number of decisions; then per decision:
--     now in µs ("": the server's TIME), op (CHECK … RESET), cost, n (limits),
--     max_wait in µs (-1: none), lease ("": none),
--     then per limit: the algorithm's id, its parameters, the cost it sees.
-- Returns integers, per decision: status (1 allowed, 0 denied, -1 a key
-- holds a value Tollgate did not write), granted, then per limit (none for
-- a reset or a refusal): allowed, limit, remaining, retry_after (-1: never),
-- reset_after, wait.

local function decide(keys, first, limits, now, op, cost, max_wait, lease, reply)
  local n = #limits
  local states, stale = {}, {}
  for i = 1, n do
    local p = limits[i]
    local s, st = p.algorithm.load(keys[first + i], p, now)
    if s == FOREIGN then
      reply[#reply + 1] = -1
      reply[#reply + 1] = 0
      return
    end
    states[i], stale[i] = s, st
  end
  local action = op
  if op == CHECK_AT_MOST then
    -- One cost for every limit (Rust refuses per-limit costs here).
    action = CHECK
    local least = math.huge
    for i, p in ipairs(limits) do
      least = math.min(least, p.algorithm.available(p, states[i], now))
    end
    if least == 0 and cost > 0 then
      cost = 1
    else
      cost = math.min(least, cost)
    end
    for _, p in ipairs(limits) do
      p.cost = cost
    end
  end
  local decisions, changes = {}, {}
  local allowed = true
  for i, p in ipairs(limits) do
    decisions[i], changes[i] = p.algorithm.decide(p, states[i], now, action, p.cost, max_wait, lease)
    if decisions[i][1] == 0 then
      allowed = false
    end
  end
  if not allowed then
    -- Nothing is consumed: limits that would have admitted report as a peek.
    for i, p in ipairs(limits) do
      if decisions[i][1] == 1 then
        decisions[i], changes[i] = p.algorithm.decide(p, states[i], now, action, 0, max_wait, lease)
      end
    end
  end
  for i, p in ipairs(limits) do
    if changes[i] ~= nil then
      p.algorithm.store(keys[first + i], p, states[i], changes[i], now, decisions[i][5], stale[i])
    end
  end
  reply[#reply + 1] = allowed and 1 or 0
  reply[#reply + 1] = allowed and cost or 0
  for _, d in ipairs(decisions) do
    for j = 1, 6 do
      reply[#reply + 1] = d[j]
    end
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
    local limits = {}
    for i = 1, n do
      local algorithm = ALGORITHMS[tonumber(args[at])]
      local p
      p, at = algorithm.params(args, at + 1)
      p.algorithm, p.cost = algorithm, tonumber(args[at])
      limits[i] = p
      at = at + 1
    end
    if op == RESET then
      for i = 1, n do
        redis.call("DEL", keys[first + i])
      end
      reply[#reply + 1] = 1
      reply[#reply + 1] = 0
    else
      decide(keys, first, limits, now, op, cost, max_wait, lease, reply)
    end
    first = first + n
  end
  return reply
end
