"""Lua scripts for the Redis limit store's rate windows (rpm and tpm): a sliding-window log
per key, and the per-tick sums that keep each call's work bounded.

The conventions every script follows are in ``gateway.limits.lua``, which holds the budget
and concurrency-slot scripts.
"""

from __future__ import annotations

from gateway.limits.lua import HELPERS

# ---------------------------------------------------------------------------------------------
# Rate limits: sliding-window log.
#
# Why a log and not GCRA or a sliding-window counter: "N per minute" must mean at most N in
# ANY 60 s span. GCRA with a burst of N admits N at once and then one every 60/N s, i.e.
# almost 2N in the minute after a burst; the sliding-window counter interpolates between two
# fixed windows and is only approximately right. The log stores one entry per admitted
# request (score = time), so the count is exact, and the exact reset and retry-after times
# fall out of it (when the oldest entries leave the window).
#
# tpm uses the same log with a weight per entry ("<member>:<tokens>") and a running sum.
# Weights may be negative (add_tokens refunds an overestimate); the sum is read clamped at 0.
#
# Bounded work. Redis runs one script at a time, for every worker and every key, so no script
# may do work in proportion to a key's log: at 1,000 requests a second a tpm log holds 120,000
# entries (an estimate and its correction per request), and Lua reads them at about a
# microsecond each. Before, the first check after a pause took every entry that had left out
# one by one (30 s: 119 ms), and every tpm 429 walked the log from its oldest entry to find
# its retry-after (174 ms for a request the size of the window): 32 clients refused that way
# held Redis long enough for other requests' limit calls to time out (503 limits_unavailable).
# Now about 1 ms for either (bench/limits_latency.py; README, "Rate windows on Redis"):
#
# * Entries that have left are dropped at most LOG_TRIM per call (ZREMRANGEBYRANK); nothing
#   needs them gone, as the logs are counted by score (ZCOUNT, O(log n)). A log with nothing
#   left in the window is UNLINKed, which frees it off Redis's main thread. (A caller whose
#   clock lags another's may count rpm entries that have left the other's window but not its
#   own and are not dropped yet: they are in its window.)
# * The tpm log is also summed per tick of time (1/4 s) in a hash beside it (_TOKEN_LOG):
#   ticks wholly out of the window leave by their sums, and only the tick the cutoff falls in
#   is read entry by entry. Where that sweep got to is kept, so a caller whose clock lags
#   never takes the same entries out twice.
# * A tpm 429's retry-after adds up ticks by their sums and reads only the tick in which
#   enough has left. A tick is skipped only when no timestamp in it can get there (what left
#   before it, plus its timestamps' positive net weights, is short of what is needed), so the
#   answer is the one walking every entry gives: the first timestamp by which enough has left.
#
# A call reads O(log n), one tick's entries and one hash field per tick of the window,
# whatever the key's rate or the pause before it.
#
# KEYS: 1 request log (zset), 2 token log (zset), 3 token sum (int), 4 token sums per tick
#       (hash)
# ARGV: 1 now, 2 cutoff (= now - window; entries with score <= cutoff have left),
#       3 window seconds, 4 rpm (-1: none), 5 tpm (-1: none), 6 tokens, 7 unique member,
#       8 key ttl ms
# Returns: {allowed 0|1, reason 0|1 rpm|2 tpm, requests, reset_requests, tokens,
#           reset_tokens, retry_after ("-1": never)}
# ---------------------------------------------------------------------------------------------
_LOG_TRIM = """
local LOG_TRIM = 256

-- Entries of a log with score <= cutoff have left the window. Returns how many are still in
-- it and how many that have left are still stored (the oldest ranks); drops up to LOG_TRIM.
local function trim_log(log, cutoff)
  local dead = redis.call('ZCOUNT', log, '-inf', cutoff)
  local live = redis.call('ZCARD', log) - dead
  if dead == 0 then return live, 0 end
  if live == 0 then
    redis.call('UNLINK', log)
    return 0, 0
  end
  local drop = math.min(dead, LOG_TRIM)
  redis.call('ZREMRANGEBYRANK', log, 0, drop - 1)
  return live, dead - drop
end
"""

_TOKEN_LOG = """
-- The tpm log is summed per tick of 1/TICKS s (a power of two, so tick bounds are exact
-- decimals). A tick bounds the entries read one by one (the cutoff's tick, and the tick a 429
-- finds its answer in); the number of ticks bounds the fields of the hash, which Redis keeps
-- as a flat list scanned on every lookup up to 512 fields. Measured at 1,000 requests a
-- second (2,000 entries a second): 1 s ticks read 2,000 entries after a pause (1.6-2.1 ms);
-- 1/8 s ticks made a 429's pass over ~480 fields slow (2.1 ms); 1/4 s: 0.5-1.1 ms for either.
local TICKS = 4
local function weight(m) return tonumber(string.match(m, ':(%-?%d+)$')) end
local function tick(score) return math.floor(tonumber(score) * TICKS) end
local function tick_start(k) return string.format('%.3f', k / TICKS) end

-- t = {log, sum, per-tick hash}. The hash holds, for each tick k with entries, "<k>" (the
-- sum of their weights) and "<k>-" (the sum of its timestamps' net weights that are below 0,
-- if any: a refund is booked at its estimate's timestamp, so a net weight is rarely
-- negative); and "lo" (no tick before it has entries), "to" (the cutoff of the last sweep
-- that took ticks out by their sums), "stale" (1: entries that have left are still stored).
-- It exists exactly while the log has entries.

-- Adds an entry at timestamp `at` (a string); lo is the hash's "lo" (nil: none yet).
local function add_token_entry(t, lo, at, member, w, ttl)
  local k = tick(at)
  local f = istr(k)
  local before = 0
  local same = redis.call('ZRANGEBYSCORE', t[1], at, at)
  for i = 1, #same do before = before + weight(same[i]) end
  redis.call('ZADD', t[1], at, member)
  redis.call('INCRBY', t[2], istr(w))
  redis.call('HINCRBY', t[3], f, istr(w))
  local below = math.min(before + w, 0) - math.min(before, 0)
  if below ~= 0 then redis.call('HINCRBY', t[3], f .. '-', istr(below)) end
  if lo == nil or k < lo then redis.call('HSET', t[3], 'lo', f) end
  for i = 1, 3 do redis.call('PEXPIRE', t[i], ttl) end
end

-- Takes what has left the window (score <= cutoff) out of the sum. Returns the sum and the
-- hash's "lo" after (nil: the log is empty).
local function sweep_tokens(t, cutoff)
  local marks = redis.call('HMGET', t[3], 'to', 'lo', 'stale')
  local to, lo = marks[1], tonumber(marks[2])
  if lo == nil then return tonumber(redis.call('GET', t[2]) or '0'), nil end
  -- a caller whose clock lags must not take out again what a later cutoff took out
  if to and tonumber(to) > tonumber(cutoff) then cutoff = to end
  local ck = tick(cutoff)
  local ck_start = tick_start(ck)
  local freed, changed = 0, marks[3] == '1'
  if lo < ck then
    -- whole ticks before the cutoff's: out by their sums, no entry read
    local fields = {}
    if ck - lo <= redis.call('HLEN', t[3]) then
      for k = lo, ck - 1 do
        fields[#fields + 1] = istr(k)
        fields[#fields + 1] = istr(k) .. '-'
      end
    else
      local names = redis.call('HKEYS', t[3])
      for i = 1, #names do
        local k = tonumber(string.match(names[i], '^%-?%d+$'))
        if k ~= nil and k < ck then
          fields[#fields + 1] = names[i]
          fields[#fields + 1] = names[i] .. '-'
        end
      end
    end
    for i = 1, #fields, 256 do
      local chunk = {unpack(fields, i, math.min(i + 255, #fields))}
      local sums = redis.call('HMGET', t[3], unpack(chunk))
      for j = 1, #sums, 2 do freed = freed + (tonumber(sums[j]) or 0) end
      redis.call('HDEL', t[3], unpack(chunk))
    end
    lo, changed = ck, true
  end
  -- the cutoff's own tick: its entries up to the cutoff, one by one
  local part = redis.call('ZRANGEBYSCORE', t[1], ck_start, cutoff, 'WITHSCORES')
  if #part > 0 then
    local total, negative, net, at = 0, 0, 0, nil
    for i = 1, #part, 2 do
      if part[i + 1] ~= at then
        negative = negative + math.min(net, 0)
        at, net = part[i + 1], 0
      end
      local w = weight(part[i])
      net = net + w
      total = total + w
    end
    negative = negative + math.min(net, 0)
    redis.call('HINCRBY', t[3], istr(ck), istr(-total))
    if negative ~= 0 then redis.call('HINCRBY', t[3], istr(ck) .. '-', istr(-negative)) end
    redis.call('ZREMRANGEBYSCORE', t[1], ck_start, cutoff)
    freed = freed + total
  end
  local stale, live = 0, nil
  if changed then
    -- what is stored below the cutoff's tick went out with its tick's sum
    live, stale = trim_log(t[1], '(' .. ck_start)
  elseif #part > 0 then
    live = redis.call('ZCARD', t[1])  -- nothing is stored below the cutoff's tick
  end
  if live == 0 then
    redis.call('UNLINK', t[1], t[2], t[3])
    return 0, nil
  end
  if changed then
    -- entries taken out by their tick's sum may still be stored: a caller whose clock lags
    -- must not read them one by one (those taken out one by one are gone)
    redis.call('HSET', t[3], 'to', cutoff, 'lo', istr(lo), 'stale', stale > 0 and '1' or '0')
  end
  if freed == 0 then return tonumber(redis.call('GET', t[2]) or '0'), lo end
  return redis.call('DECRBY', t[2], istr(freed)), lo
end

-- The first timestamp by which at least `need` tokens have left the window (its entries and
-- all older ones), or nil if that never happens. Call after sweep_tokens; lo is its "lo".
local function tokens_free_at(t, lo, need)
  local newest = redis.call('ZRANGE', t[1], -1, -1, 'WITHSCORES')
  if lo == nil or #newest == 0 then return nil end
  -- the ticks from lo to the newest entry's, in order (or, if the log is sparse over a long
  -- span, those the hash has: never more names than fields)
  local ticks = {}
  local hi = tick(newest[2])
  if hi - lo < redis.call('HLEN', t[3]) then
    for k = lo, hi do ticks[#ticks + 1] = k end
  else
    for _, name in ipairs(redis.call('HKEYS', t[3])) do
      local k = tonumber(string.match(name, '^%-?%d+$'))
      if k ~= nil then ticks[#ticks + 1] = k end
    end
    table.sort(ticks)
  end
  local freed = 0
  for i = 1, #ticks, 128 do
    local last = math.min(i + 127, #ticks)
    local fields = {}
    for j = i, last do
      fields[#fields + 1] = istr(ticks[j])
      fields[#fields + 1] = istr(ticks[j]) .. '-'
    end
    local sums = redis.call('HMGET', t[3], unpack(fields))
    for j = i, last do
      local sum = tonumber(sums[2 * (j - i) + 1]) or 0
      -- freed before this tick, plus its timestamps' positive net weights, bounds what is
      -- freed at any of them: short of need, none gets there and its entries are skipped
      if freed + sum - (tonumber(sums[2 * (j - i) + 2]) or 0) < need then
        freed = freed + sum
      else
        local lower, upper = tick_start(ticks[j]), '(' .. tick_start(ticks[j] + 1)
        local start, at, net = 0, nil, 0
        repeat
          local chunk = redis.call(
            'ZRANGEBYSCORE', t[1], lower, upper, 'WITHSCORES', 'LIMIT', start, 128)
          for e = 1, #chunk, 2 do
            if chunk[e + 1] ~= at then
              if at ~= nil then
                freed = freed + net
                if freed >= need then return tonumber(at) end
              end
              at, net = chunk[e + 1], 0
            end
            net = net + weight(chunk[e])
          end
          start = start + 128
        until #chunk < 256
        if at ~= nil then
          freed = freed + net
          if freed >= need then return tonumber(at) end
        end
      end
    end
  end
  return nil
end
"""

RATE_LUA = (
    HELPERS
    + _LOG_TRIM
    + _TOKEN_LOG
    + """
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[3])
local rpm = tonumber(ARGV[4])
local tpm = tonumber(ARGV[5])
local tokens = tonumber(ARGV[6])
local T = {KEYS[2], KEYS[3], KEYS[4]}

local function newest_reset(log)
  local last = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
  if #last == 0 then return 0 end
  return math.max(0, tonumber(last[2]) + window - now)
end

local requests = 0
local stale = 0  -- request log entries that have left but are still stored (oldest ranks)
if rpm >= 0 then requests, stale = trim_log(KEYS[1], ARGV[2]) end
local used, lo = 0, nil
if tpm >= 0 then
  used, lo = sweep_tokens(T, ARGV[2])
  used = math.max(0, used)
end

-- On rejection retry_after is when *every* exceeded limit has room again (-1: never).
local reason = 0
local retry = 0
if rpm >= 0 and requests + 1 > rpm then
  reason = 1
  if rpm > 0 then
    -- the request fits once the (requests - rpm + 1) oldest entries have left
    local rank = stale + requests - rpm
    local e = redis.call('ZRANGE', KEYS[1], rank, rank, 'WITHSCORES')
    retry = math.max(retry, tonumber(e[2]) + window - now)
  else
    retry = -1
  end
end
if tpm >= 0 and used + tokens > tpm then
  if reason == 0 then reason = 2 end
  local when = -1
  if tokens <= tpm then
    -- a refund shares its estimate's timestamp and leaves with it, so only whole
    -- timestamps count (how members sort within one must not decide the answer)
    local at = tokens_free_at(T, lo, used + tokens - tpm)
    if at ~= nil then when = math.max(0, at + window - now) end
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
    add_token_entry(T, lo, ARGV[1], ARGV[7] .. ':' .. istr(tokens), tokens, ARGV[8])
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

# KEYS: 1 token log, 2 token sum, 3 token sums per tick.
# ARGV: 1 cutoff, 2 at (the entry's timestamp), 3 tokens (signed), 4 member, 5 ttl ms
ADD_TOKENS_LUA = (
    HELPERS
    + _LOG_TRIM
    + _TOKEN_LOG
    + """
local T = {KEYS[1], KEYS[2], KEYS[3]}
local _, lo = sweep_tokens(T, ARGV[1])
add_token_entry(T, lo, ARGV[2], ARGV[4] .. ':' .. ARGV[3], tonumber(ARGV[3]), ARGV[5])
return 1
"""
)
