-- wrk script: POST the JSON body in $BENCH_BODY to $BENCH_PATH (bench/gateway/api_paths.sh).
wrk.method = "POST"
wrk.path = os.getenv("BENCH_PATH")
wrk.headers["Content-Type"] = "application/json"
wrk.body = os.getenv("BENCH_BODY")

dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "non200.lua")
