//! A region's share of a global limit, in the regional Redis: one hash per
//! subject and limit, which every replica of the region takes from in one
//! atomic call, and which one replica at a time (holding its fenced lock)
//! fills from the home store.
//!
//! Fields: `units` (what the share holds), `until` (µs: when they lapse),
//! `at` (µs: when the home store counted them, for a give-back), `lock`
//! and `lock_until` (the replica filling it, and until when), `retry_at`
//! (µs: not before this is a fill worth asking home for: home had no more,
//! or could not be reached), `asked` and `since` (units asked since the
//! last fill: the region's recent rate), `provisional_at` (µs: when a
//! fill made without home may come next).

use std::sync::OnceLock;

use redis::Script;

/// A script's body, after `instant(given)`: the instant a caller gave
/// (µs), or the server's clock (`TIME`) when it gave none.
macro_rules! with_clock {
    ($body:literal) => {
        concat!(
            "local function instant(given)\n",
            "  local now = tonumber(given)\n",
            "  if now then return now end\n",
            "  local time = redis.call('TIME')\n",
            "  return tonumber(time[1]) * 1000000 + tonumber(time[2])\n",
            "end\n",
            $body
        )
    };
}

/// Takes `cost` units (all or nothing; `at_most`: as many as held, up to
/// `cost`), and asks for a fill when what is left falls under the region's
/// low-water mark (its recent rate over `low` µs) and no replica fills it
/// (a peek, of cost 0, asks none).
///
/// ARGV: cost, at_most (0/1), now (µs; empty: the server's clock), token,
/// lock (µs), low (µs), block (µs), most (units).
/// Reply: granted, left, until − now (µs, 0: none), retry_at − now (µs,
/// 0: none), the block to fill (0: none; then this replica holds the lock),
/// the lock's holder (1: this replica, 2: another, 0: none), and the
/// instant decided at (µs).
const TAKE: &str = with_clock!(
    r"
local now = instant(ARGV[3])
local cost, at_most = tonumber(ARGV[1]), ARGV[2] == '1'
local f = redis.call('HMGET', KEYS[1], 'units', 'until', 'lock', 'lock_until', 'retry_at', 'asked', 'since')
local units, untl = tonumber(f[1]) or 0, tonumber(f[2]) or 0
if untl <= now then units = 0 end
local lock, lock_until = f[3], tonumber(f[4]) or 0
local horizon = tonumber(ARGV[7])
local retry_at, asked, since = tonumber(f[5]) or 0, tonumber(f[6]) or 0, tonumber(f[7])
local fresh = since == nil
if fresh then since = now end
-- The recent rate: what was asked over the last quarter to half block.
local recent = horizon / 4
if now - since > recent then
  asked = math.ceil(asked * recent / 2 / (now - since))
  since = now - recent / 2
end
asked = asked + cost
local granted = 0
if at_most then granted = math.min(units, cost) elseif units >= cost then granted = cost end
local left = units - granted
redis.call('HSET', KEYS[1], 'asked', asked, 'since', since)
if granted > 0 then redis.call('HSET', KEYS[1], 'units', left) end
local holder = 0
if lock and lock_until > now then
  if lock == ARGV[4] then holder = 1 else holder = 2 end
end
local fill = 0
if holder == 0 and now >= retry_at and cost > 0 then
  local rate = asked / math.max(now - since, recent / 2)
  local low = math.max(cost, math.ceil(rate * tonumber(ARGV[6])))
  if left < low or (granted < cost and not at_most) then
    local most = math.max(tonumber(ARGV[8]), cost)
    if fresh then
      fill = math.max(math.floor(most / 2), cost)
    else
      fill = math.min(math.max(cost, math.ceil(rate * horizon)), most)
    end
    redis.call('HSET', KEYS[1], 'lock', ARGV[4], 'lock_until', now + tonumber(ARGV[5]))
    holder = 1
  end
end
local keep = math.max(untl, retry_at, now + tonumber(ARGV[5])) - now
redis.call('PEXPIRE', KEYS[1], math.ceil(keep / 1000) + 1000)
local until_left = 0
if untl > now then until_left = untl - now end
local retry_left = 0
if retry_at > now then retry_left = retry_at - now end
return {granted, left, until_left, retry_left, fill, holder, now}
"
);

/// Adds a block the home store granted, if this replica still holds the
/// lock (a replica whose lock lapsed and was taken over adds nothing: the
/// caller gives the block back home), and frees the lock. Units still live
/// whose lapse is near the new block's are kept with the earlier lapse;
/// units that would lapse much earlier are handed back to the caller to
/// give back home, and the block replaces them.
///
/// ARGV: now (µs; empty: the server's clock), token, units, lifetime (µs),
/// at (µs: when home counted them), retry (µs from now; 0: none),
/// slack (µs), provisional period (µs; 0: a block from home).
/// Reply: added (0/1), units handed back, when those were counted (µs).
const ADD: &str = with_clock!(
    r"
local now = instant(ARGV[1])
local f = redis.call('HMGET', KEYS[1], 'units', 'until', 'lock', 'at', 'provisional_at')
if f[3] ~= ARGV[2] then return {0, 0, 0} end
local provisional = tonumber(ARGV[8])
if provisional > 0 and (tonumber(f[5]) or 0) > now then
  redis.call('HDEL', KEYS[1], 'lock', 'lock_until')
  redis.call('HSET', KEYS[1], 'retry_at', tonumber(f[5]))
  return {1, 0, 0}
end
local units, untl, at = tonumber(f[1]) or 0, tonumber(f[2]) or 0, tonumber(f[4]) or 0
local block, new_until = tonumber(ARGV[3]), now + tonumber(ARGV[4])
local back, back_at = 0, 0
if untl <= now then
  back, back_at = units, at
  units, untl = block, new_until
elseif new_until - untl <= tonumber(ARGV[7]) then
  units, untl = units + block, math.min(untl, new_until)
else
  back, back_at = units, at
  units, untl = block, new_until
end
redis.call('HSET', KEYS[1], 'units', units, 'until', untl, 'at', tonumber(ARGV[5]))
redis.call('HDEL', KEYS[1], 'lock', 'lock_until')
if tonumber(ARGV[6]) > 0 then
  redis.call('HSET', KEYS[1], 'retry_at', now + tonumber(ARGV[6]))
end
if provisional > 0 then
  redis.call('HSET', KEYS[1], 'provisional_at', now + provisional)
end
redis.call('PEXPIRE', KEYS[1], math.ceil((math.max(untl, now + provisional) - now) / 1000) + 1000)
return {1, back, back_at}
"
);

/// Frees the lock without a block (home refused or could not be reached),
/// asking no fill again for `retry` µs. ARGV: now, token, retry (µs).
const RELEASE: &str = with_clock!(
    r"
local now = instant(ARGV[1])
if redis.call('HGET', KEYS[1], 'lock') ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], 'lock', 'lock_until')
redis.call('HSET', KEYS[1], 'retry_at', now + tonumber(ARGV[3]))
return 1
"
);

/// Gives `units` back to the share (a spread decision's refund), while it
/// lives. ARGV: now, units. Reply: units held after.
const GIVE: &str = with_clock!(
    r"
local now = instant(ARGV[1])
local f = redis.call('HMGET', KEYS[1], 'units', 'until')
if (tonumber(f[2]) or 0) <= now then return 0 end
return redis.call('HINCRBY', KEYS[1], 'units', tonumber(ARGV[2]))
"
);

/// Reads what a share holds: units (0 once lapsed), and µs until the
/// lapse. ARGV: now.
const PEEK: &str = with_clock!(
    r"
local now = instant(ARGV[1])
local f = redis.call('HMGET', KEYS[1], 'units', 'until')
local untl = tonumber(f[2]) or 0
if untl <= now then return {0, 0} end
return {tonumber(f[1]) or 0, untl - now}
"
);

macro_rules! script {
    ($name:ident, $source:ident) => {
        pub(super) fn $name() -> &'static Script {
            static SCRIPT: OnceLock<Script> = OnceLock::new();
            SCRIPT.get_or_init(|| Script::new($source))
        }
    };
}

script!(take, TAKE);
script!(add, ADD);
script!(release, RELEASE);
script!(give, GIVE);
script!(peek, PEEK);
