"""Lua scripts for the Redis limit store.

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

_HELPERS = """
local function istr(x) return string.format('%d', x) end
local function fstr(x) return string.format('%.6f', x) end
"""

# ---------------------------------------------------------------------------------------------
# Rate limits: sliding-window log.
#
# Why a log and not GCRA or a sliding-window counter: "N per minute" must mean at most N in
# ANY 60 s span. GCRA with a burst of N admits N at once and then one every 60/N s, i.e.
# almost 2N in the minute after a burst; the sliding-window counter interpolates between two
# fixed windows and is only approximately right. The log stores one entry per admitted
# request (score = time), so the count is exact, and the exact reset and retry-after times
# fall out of it (when the oldest entries leave the window). Its cost is memory bounded by
# the limit itself (at most rpm entries per key) and O(log n) per request.
#
# tpm uses the same log with a weight per entry ("<member>:<tokens>") and a running sum, so
# checking doesn't add up the whole window: expired entries are subtracted as they leave.
# Weights may be negative (add_tokens refunds an overestimate); the sum is read clamped at 0.
#
# KEYS: 1 request log (zset), 2 token log (zset), 3 token sum (int)
# ARGV: 1 now, 2 cutoff (= now - window; entries with score <= cutoff have left),
#       3 window seconds, 4 rpm (-1: none), 5 tpm (-1: none), 6 tokens, 7 unique member,
#       8 key ttl ms
# Returns: {allowed 0|1, reason 0|1 rpm|2 tpm, requests, reset_requests, tokens,
#           reset_tokens, retry_after ("-1": never)}
# ---------------------------------------------------------------------------------------------
_TOKEN_SWEEP = """
local function weight(m) return tonumber(string.match(m, ':(%-?%d+)$')) end

local function sweep_tokens(log, sum, cutoff)
  local expired = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #expired == 0 then
    return tonumber(redis.call('GET', sum) or '0')
  end
  local freed = 0
  for i = 1, #expired do freed = freed + weight(expired[i]) end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  if redis.call('ZCARD', log) == 0 then
    redis.call('DEL', sum)
    return 0
  end
  return redis.call('DECRBY', sum, istr(freed))
end
"""

RATE_LUA = (
    _HELPERS
    + _TOKEN_SWEEP
    + """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[3])
local rpm = tonumber(ARGV[4])
local tpm = tonumber(ARGV[5])
local tokens = tonumber(ARGV[6])

local function newest_reset(log)
  local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #last == 0 then return 0 end
  return math.max(0, tonumber(last[2]) + window - now)
end

local requests = 0
if rpm >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
  requests = redis.call('ZCARD', KEYS[1])
end
local used = 0
if tpm >= 0 then used = math.max(0, sweep_tokens(KEYS[2], KEYS[3], ARGV[2])) end

-- On rejection retry_after is when *every* exceeded limit has room again (-1: never).
local reason = 0
local retry = 0
if rpm >= 0 and requests + 1 > rpm then
  reason = 1
  if rpm > 0 then
    -- the request fits once the (requests - rpm + 1) oldest entries have left
    local e = redis.call('ZRANGE', KEYS[1], requests - rpm, requests - rpm, 'WITHSCORES')
    retry = math.max(retry, tonumber(e[2]) + window - now)
  else
    retry = -1
  end
end
if tpm >= 0 and used + tokens > tpm then
  if reason == 0 then reason = 2 end
  local when = -1
  if tokens <= tpm then
    -- walk the log from the oldest entry until enough tokens have left the window; a
    -- refund shares its estimate's score and leaves with it, so only whole scores count
    -- (how members sort within a score must not decide the answer)
    local need = used + tokens - tpm
    local freed = 0
    local start = 0
    local pending = nil
    while when < 0 do
      local chunk = redis.call('ZRANGE', KEYS[2], start, start + 127, 'WITHSCORES')
      if #chunk == 0 then break end
      for i = 1, #chunk, 2 do
        local score = tonumber(chunk[i + 1])
        if pending ~= nil and score ~= pending and freed >= need then
          when = math.max(0, pending + window - now)
          break
        end
        freed = freed + weight(chunk[i])
        pending = score
      end
      start = start + 128
    end
    if when < 0 and pending ~= nil and freed >= need then
      when = math.max(0, pending + window - now)
    end
  end
  if when < 0 or retry < 0 then retry = -1 else retry = math.max(retry, when) end
end

if reason == 0 then
  if rpm >= 0 then
    redis.call('ZADD', KEYS[1], ARGV[1], ARGV[7])
    redis.call('PEXPIRE', KEYS[1], ARGV[8])
    requests = requests + 1
  end
  if tpm >= 0 and tokens ~= 0 then
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[7] .. ':' .. istr(tokens))
    redis.call('INCRBY', KEYS[3], istr(tokens))
    redis.call('PEXPIRE', KEYS[2], ARGV[8])
    redis.call('PEXPIRE', KEYS[3], ARGV[8])
    used = used + tokens
  end
end

local reset_requests = 0
if rpm >= 0 then reset_requests = newest_reset(KEYS[1]) end
local reset_tokens = 0
if tpm >= 0 then reset_tokens = newest_reset(KEYS[2]) end
local allowed = 0
if reason == 0 then allowed = 1 end
return {allowed, reason, requests, fstr(reset_requests), used, fstr(reset_tokens), fstr(retry)}
"""
)

# KEYS: 1 token log, 2 token sum.  ARGV: 1 cutoff, 2 now, 3 tokens (signed), 4 member, 5 ttl ms
ADD_TOKENS_LUA = (
    _HELPERS
    + _TOKEN_SWEEP
    + """
sweep_tokens(KEYS[1], KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4] .. ':' .. ARGV[3])
redis.call('INCRBY', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return 1
"""
)

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
# (256) to keep script latency flat after a mass failure; anything left over is swept by the
# next call, and until then the budget is merely conservative (never over-committed). Holds,
# held and reserved get a key TTL of one hold TTL on every write: they expire together, and
# only once no hold in them can still be live, so an idle key leaves nothing behind.
# ---------------------------------------------------------------------------------------------
_HOLD_SWEEP = """
local function sweep_holds(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 256)
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
    _HELPERS
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
    _HELPERS
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
    _HELPERS
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
