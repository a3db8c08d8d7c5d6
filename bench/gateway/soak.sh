#!/usr/bin/env bash
# A leak check: one xrouter worker's memory and file descriptors under sustained load.
#
#   bench/gateway/soak.sh [--mode bare|full|compact] [--slices N] [--slice-seconds S] [--conc C]
#
# wrk drives POST /v1/chat/completions for N consecutive slices of S seconds at concurrency C
# (defaults: bare, 12 slices of 20 s, c=16), every request's prompt different
# (bench/gateway/soak.lua), on the shared harness's fake upstream; the gateway alone on CPU 0,
# wrk and the upstream on CPU 1. After each slice it prints the requests served so far, the
# slice's requests/s and non-200 answers, and the gateway's RSS, open file descriptors and
# threads (from /proc). The last line is the RSS growth from the end of the first slice
# (caches, connection pools and the allocator's arenas warm) to the end of the last, per
# 100,000 requests: a leak grows with the requests served, the allocator plateaus.
#
# Modes as bench/gateway/xrouter_config.sh: bare (auth off, in-process limits, SQLite ledger),
# full (auth, a budgeted and rate-limited key, Redis limits, PostgreSQL ledger), compact
# (xrouter/compact routes each request over the demo pool). Needs wrk and /tmp/venvs/fake
# (the harness's setup.sh) and the project venv.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODE=bare; SLICES=12; SLICE_S=20; CONC=16
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mode) MODE=$2; shift 2 ;;
    --slices) SLICES=$2; shift 2 ;;
    --slice-seconds) SLICE_S=$2; shift 2 ;;
    --conc) CONC=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $MODE =~ ^(bare|full|compact)$ ]] || { echo "--mode is bare, full or compact" >&2; exit 2; }
OUT=$(mktemp -d /tmp/xrouter-soak.XXXXXX)
source "$HERE/lib.sh"

start_fake_upstream
MODEL=fake-model; KEY=""; PORT=4103
if [[ $MODE == full ]]; then
  PGDB=xrouter_soak
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $PGDB" -qc "CREATE DATABASE $PGDB" postgres
  redis-cli --scan --pattern 'xrbench*' | xargs -r redis-cli del >/dev/null
  export PGDB
fi
[[ $MODE == compact ]] && MODEL=xrouter/compact
MODE=$MODE "$HERE/xrouter_config.sh" "$OUT/gateway.yaml"
taskset -c 0 setsid "$XR" serve --config "$OUT/gateway.yaml" --port $PORT >"$OUT/gateway.log" 2>&1 &
GW=$!
track $GW
wait_ready http://127.0.0.1:$PORT/readyz
if [[ $MODE == full ]]; then
  KEY=$(curl -sf -X POST http://127.0.0.1:$PORT/admin/keys -H 'Authorization: Bearer bench-admin-key' \
    -H 'content-type: application/json' \
    -d '{"alias":"soak","budget_usd":1000000,"budget_period":"monthly","rpm":100000000,"tpm":1000000000}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
fi

# The worker's figures: with one worker `xrouter serve` serves in its own process.
rss_mb() { awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$GW/status"; }
fds() { ls "/proc/$GW/fd" | wc -l; }
threads() { awk '/^Threads/ {print $2}' "/proc/$GW/status"; }
ledger_bytes() {
  if [[ $MODE == full ]]; then
    psql -h 127.0.0.1 -U postgres -tAc "SELECT pg_database_size('$PGDB')" postgres
  else
    stat -c %s "$OUT/bench-ledger.db"
  fi
}
base_bytes=$(ledger_bytes)  # the empty ledger: schema, and PostgreSQL's catalogs

printf '%5s %10s %9s %7s %8s %5s %7s\n' slice requests "req/s" non200 "RSS MB" fds threads
printf '%5s %10s %9s %7s %8s %5s %7s\n' 0 0 - - "$(rss_mb)" "$(fds)" "$(threads)"
total=0; first_rss=""; first_total=0
for i in $(seq 1 "$SLICES"); do
  BENCH_MODEL=$MODEL BENCH_KEY=$KEY taskset -c 1 wrk -t"$CONC" -c"$CONC" -d"${SLICE_S}s" \
    -s "$HERE/soak.lua" "http://127.0.0.1:$PORT" >"$OUT/wrk-$i.txt"
  n=$(awk '/requests in/ {print $1}' "$OUT/wrk-$i.txt")
  total=$((total + n))
  rss=$(rss_mb)
  if [[ $i == 1 ]]; then first_rss=$rss; first_total=$total; fi
  printf '%5s %10s %9s %7s %8s %5s %7s\n' "$i" "$total" \
    "$(awk '/^Requests\/sec/ {printf "%.0f", $2}' "$OUT/wrk-$i.txt")" \
    "$(awk '/^non200/ {print $2}' "$OUT/wrk-$i.txt")" "$rss" "$(fds)" "$(threads)"
done
python3 - "$first_rss" "$rss" "$first_total" "$total" <<'PY'
import sys
first, last, n0, n1 = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
served = n1 - n0
per = (last - first) / served * 1e5 if served else float("nan")
print(f"RSS {first:.1f} -> {last:.1f} MB over the {served:,} requests after the first slice: "
      f"{per:+.2f} MB per 100,000 requests")
PY
# What the ledger keeps per request (rows, indexes, free pages), then drop it: a soak's
# ledger runs to hundreds of MB.
bytes=$(ledger_bytes)
awk -v b="$bytes" -v b0="$base_bytes" -v n="$total" 'BEGIN {printf \
  "ledger %.0f MB after %d requests: %.0f bytes per request\n", b / 1e6, n, (b - b0) / n}'
cleanup
rm -f "$OUT"/bench-ledger.db*
[[ $MODE == full ]] && psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $PGDB" postgres
echo "(mode $MODE, c=$CONC, ${SLICE_S} s slices; logs in $OUT)"
