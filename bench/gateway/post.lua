-- wrk script: POST the JSON body in $BENCH_BODY to $BENCH_PATH (bench/gateway/api_paths.sh).
wrk.method = "POST"
wrk.path = os.getenv("BENCH_PATH")
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("BENCH_BODY")

-- response() runs in each thread's own Lua state and done() in the main one, so the count
-- is a global of each thread's state, summed through the threads setup() was given.
local threads = {}
function setup(thread) table.insert(threads, thread) end

errors = 0
function response(status, headers, body)
  if status ~= 200 then errors = errors + 1 end
end

function done(summary, latency, requests)
  local n = 0
  for _, t in ipairs(threads) do n = n + t:get("errors") end
  io.write(string.format("non200 %d\n", n))
end
