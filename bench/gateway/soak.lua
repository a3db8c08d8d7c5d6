-- wrk script for bench/gateway/soak.sh: chat requests whose prompt differs on every
-- request (a per-thread counter), so that no per-prompt cache can hold them all and a
-- leak in anything kept per request shows. $BENCH_MODEL is the model; $BENCH_KEY, when
-- set, the API key.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "non200.lua")

local count_thread = setup
function setup(thread)
  thread:set("tag", #threads)
  count_thread(thread)
end

local model = os.getenv("BENCH_MODEL") or "fake-model"
local key = os.getenv("BENCH_KEY") or ""
local headers = { ["Content-Type"] = "application/json" }
if key ~= "" then headers["Authorization"] = "Bearer " .. key end

local counter = 0
function request()
  counter = counter + 1
  local body = string.format(
    '{"model":"%s","messages":[{"role":"user","content":"Say hello to visitor %d-%d."}],'
      .. '"max_tokens":16}', model, tag, counter)
  return wrk.format("POST", "/v1/chat/completions", headers, body)
end
