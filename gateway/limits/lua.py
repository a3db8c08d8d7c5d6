"""Lua scripts for the Redis limit store: the conventions they all follow, and the budget and
concurrency-slot scripts (the rate windows' are in ``gateway.limits.lua_rate``).

Each limit operation is one script, so Redis runs the read-check-write as a single atomic
step: concurrent workers and replicas can't both see "one left" and both take it. Scripts
are loaded once (SCRIPT LOAD) and called by SHA (``gateway.limits.resp.Script`` falls back
to loading on NOSCRIPT, e.g. after a Redis restart).

Conventions shared by every script:

* Every key a script touches is passed in KEYS and carries the same ``{hash tag}`` (the API
  key), so the scripts are valid on Redis Cluster.
* Timestamps travel as strings formatted by Python and are handed to ZADD/ZRANGEBYSCORE
  unchanged. Lua 5.1 prints numbers with 14 significant digits, which would round a Unix
  timestamp to 100 µs; passing the string keeps full precision and gives the Redis backend
  bit-for-bit the same window boundaries as the in-memory one.
* Integers are formatted with ``%d`` before they go back to Redis (INCRBY rejects "1e+15").
  Amounts are micro-USD: doubles are exact up to 2^53 µUSD (9 billion USD).
* Floats returned to Python (durations) are strings: Redis truncates Lua numbers to integers.
"""

from __future__ import annotations

from gateway.limits.base import HOLD_SWEEP_LIMIT

HELPERS = """
local function istr(x) return string.format('%d', x) end
local function fstr(x) return string.format('%.6f', x) end
"""


# ---------------------------------------------------------------------------------------------
# Budgets.
#
# KEYS (all scripts): 1 holds (zset: reservation id -> hold deadline), 2 held (hash:
#   reservation id -> micro-USD held), 3 reserved (int: sum of held), 4 spent in the current
#   period (int), 5 spent so far by this reservation id (int, for the per-request cap; only
#   created for reservations that carry a cap).
#
# Abandoned holds: a worker that dies between reserve and settle leaves its hold behind. The
# hold's deadline sits in the holds zset and every budget script first sweeps the holds whose
# deadline has passed, returning their amount to the budget. The sweep is bounded per call
# (HOLD_SWEEP_LIMIT, 256) to keep script latency flat after a mass failure; anything left over is swept by the
# next call, and until then the budget is merely conservative (never over-committed). Holds,
# held and reserved get a key TTL of one hold TTL on every write: they expire together, and
# only once no hold in them can still be live, so an idle key leaves nothing behind.
# ---------------------------------------------------------------------------------------------
_HOLD_SWEEP = f"""
local HOLD_SWEEP_LIMIT = {HOLD_SWEEP_LIMIT}
local function sweep_holds(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, HOLD_SWEEP_LIMIT)
  if #expired == 0 then return end
  local freed = 0
  for i = 1, #expired do
    local amount = redis.call('HGET', KEYS[2], expired[i])
    if amount then freed = freed + tonumber(amount) end
    redis.call('HDEL', KEYS[2], expired[i])
    redis.call('ZREM', KEYS[1], expired[i])
  end
  if freed ~= 0 then redis.call('DECRBY', KEYS[3], istr(freed)) end
end
"""

# ARGV: 1 now, 2 reservation id, 3 amount, 4 key budget (-1: none), 5 request cap (-1: none),
#       6 hold deadline, 7 hold ttl ms
# Returns: {ok 0|1, reason 0|1 budget|2 request_budget, key budget left, request cap left,
#           held only 0|1}
#          (left = after the hold when ok, available when rejected; held only: the key's
#          budget refused only because of other calls' holds, as ReserveResult.held_only)
RESERVE_LUA = (
    HELPERS
    + _HOLD_SWEEP
    + """
sweep_holds(ARGV[1])
local amount = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local cap = tonumber(ARGV[5])
local reserved = tonumber(redis.call('GET', KEYS[3]) or '0')
local spent = tonumber(redis.call('GET', KEYS[4]) or '0')
local req_held = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
local req_spent = tonumber(redis.call('GET', KEYS[5]) or '0')
local key_left = 0
if budget >= 0 then key_left = budget - spent - reserved end
local req_left = 0
if cap >= 0 then req_left = cap - req_spent - req_held end

if budget >= 0 and amount > key_left then
  local held_only = 0
  if reserved > 0 and amount <= key_left + reserved then held_only = 1 end
  return {0, 1, key_left, req_left, held_only}
end
if cap >= 0 and amount > req_left then return {0, 2, key_left, req_left} end

redis.call('HINCRBY', KEYS[2], ARGV[2], ARGV[3])
redis.call('INCRBY', KEYS[3], ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
redis.call('PEXPIRE', KEYS[3], ARGV[7])
if cap >= 0 then
  -- track this request's spend for its cap; uncapped requests leave no per-request key
  redis.call('SET', KEYS[5], '0', 'NX')
  redis.call('PEXPIRE', KEYS[5], ARGV[7])
end
return {1, 0, key_left - amount, req_left - amount}
"""
)

# Settle and release (release = settle with actual 0).
# ARGV: 1 now, 2 reservation id, 3 micro-USD to release, 4 actual micro-USD,
#       5 spent-counter ttl ms (-1: keep forever), 6 hold ttl ms, 7 record key spend (1|0)
# A hold already swept (expired) releases nothing: its amount went back at the sweep.
SETTLE_LUA = (
    HELPERS
    + _HOLD_SWEEP
    + """
sweep_holds(ARGV[1])
local release = tonumber(ARGV[3])
local held = redis.call('HGET', KEYS[2], ARGV[2])
if held then
  held = tonumber(held)
  if release > held then release = held end
  if held - release <= 0 then
    redis.call('HDEL', KEYS[2], ARGV[2])
    redis.call('ZREM', KEYS[1], ARGV[2])
  else
    redis.call('HINCRBY', KEYS[2], ARGV[2], istr(-release))
  end
  if release ~= 0 then redis.call('DECRBY', KEYS[3], istr(release)) end
end
if ARGV[4] ~= '0' then
  if ARGV[7] == '1' then
    redis.call('INCRBY', KEYS[4], ARGV[4])
    if ARGV[5] ~= '-1' then redis.call('PEXPIRE', KEYS[4], ARGV[5]) end
  end
  if redis.call('EXISTS', KEYS[5]) == 1 then
    redis.call('INCRBY', KEYS[5], ARGV[4])
    redis.call('PEXPIRE', KEYS[5], ARGV[6])
  end
end
return 1
"""
)

# ARGV: 1 now.  Returns {reserved, spent}
STATE_LUA = (
    HELPERS
    + _HOLD_SWEEP
    + """
sweep_holds(ARGV[1])
return {tonumber(redis.call('GET', KEYS[3]) or '0'), tonumber(redis.call('GET', KEYS[4]) or '0')}
"""
)

# Raise a spend counter to the ledger's figure (budgets restored after a restart or a Redis
# that lost its data); never lowers it, so running it twice, or from every worker at once,
# is harmless. KEYS: 1 the spend counter.  ARGV: 1 micro-USD, 2 counter ttl ms (-1: forever).
# Returns the counter after.
RESTORE_SPENT_LUA = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local wanted = tonumber(ARGV[1])
if wanted <= current then return current end
redis.call('SET', KEYS[1], ARGV[1])
if ARGV[2] ~= '-1' then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return wanted
"""

# ---------------------------------------------------------------------------------------------
# Parallel requests: the key's requests holding a slot, as a sorted set scored by when each
# slot expires (a dead worker's slots free themselves). Taking one sweeps the expired first.
#
# ACQUIRE_SLOT  KEYS: 1 slots (zset).  ARGV: 1 now, 2 expiry, 3 max parallel, 4 request id,
#               5 key ttl ms.  Returns {taken 0|1, slots held (this one included if taken)}.
# RELEASE_SLOT  KEYS: 1 slots.  ARGV: 1 request id.  Returns how many are left.
# ---------------------------------------------------------------------------------------------
ACQUIRE_SLOT_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local held = redis.call('ZCARD', KEYS[1])
if not redis.call('ZSCORE', KEYS[1], ARGV[4]) and held >= tonumber(ARGV[3]) then
  return {0, held}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, redis.call('ZCARD', KEYS[1])}
"""

RELEASE_SLOT_LUA = """
redis.call('ZREM', KEYS[1], ARGV[1])
return redis.call('ZCARD', KEYS[1])
"""
