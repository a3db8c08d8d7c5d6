# Shared by the wrk scripts that compare request shapes on one xrouter worker
# (api_paths.sh, cache_hits.sh). Source it after setting HERE; it sets ROOT, HARNESS, XR
# and OUT, starts nothing by itself, and stops what `track` was given on exit.
ROOT=$(cd "$HERE/../.." && pwd)
HARNESS=${HARNESS:-$ROOT/../shared/bench/gateway}
XR=${XROUTER_BIN:-$ROOT/.venv/bin/xrouter}
pids=()
# Stop every tracked process group and wait for it, so that a run right after this one
# finds its ports free.
cleanup() { for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
track() { pids+=("$1"); }
wait_ready() { for _ in $(seq 1 200); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; return 1; }

# The harness's fake upstream on CPU 1 (wrk shares it; the gateway gets CPU 0 alone).
start_fake_upstream() {
  taskset -c 1 setsid /tmp/venvs/fake/bin/python "$HARNESS/fake_upstream.py" --port 18000 \
    >"$OUT/fake.log" 2>&1 &
  track $!
}

print_header() { printf '%-22s %10s %9s %9s %9s %7s\n' "${1:-row}" "req/s" p50 p90 p99 non200; }

# measure ROW URL PATH BODY DURATION CONC: one request to check the body, 5 s of warm-up,
# then DURATION s measured; prints wrk's requests/s and latency percentiles.
measure() {
  local row=$1 url=$2 path=$3 body=$4 duration=$5 conc=$6 phase d
  curl -sf -o /dev/null -H 'content-type: application/json' -d "$body" "$url$path"
  for phase in warmup measure; do
    d=$([[ $phase == warmup ]] && echo 5 || echo "$duration")
    BENCH_PATH=$path BENCH_BODY=$body taskset -c 1 wrk -t"$conc" -c"$conc" -d"${d}s" --latency \
      -s "$HERE/post.lua" "$url" >"$OUT/wrk-$phase.txt"
  done
  pct() { awk -v p="$1" '$1 == p {print $2}' "$OUT/wrk-measure.txt"; }
  printf '%-22s %10s %9s %9s %9s %7s\n' "$row" "$(awk '/^Requests\/sec/ {print $2}' "$OUT/wrk-measure.txt")" \
    "$(pct 50%)" "$(pct 90%)" "$(pct 99%)" "$(awk '/^non200/ {print $2}' "$OUT/wrk-measure.txt")"
}
