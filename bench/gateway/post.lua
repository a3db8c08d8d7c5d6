-- wrk script: POST the JSON body in $BENCH_BODY to $BENCH_PATH (bench/gateway/api_paths.sh).
wrk.method = "POST"
wrk.path = os.getenv("BENCH_PATH")
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("BENCH_BODY")

local errors = 0
function response(status, headers, body)
  if status ~= 200 then errors = errors + 1 end
end

function done(summary, latency, requests)
  io.write(string.format("non200 %d\n", errors))
end
