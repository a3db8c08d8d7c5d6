#!/usr/bin/env bash
# Pass-through overhead of xrouter, measured with the shared wrk harness
# (../shared/bench/gateway/run.sh: same fake upstream, Lua script, body, pinning and
# concurrency levels as its LiteLLM anchor), then a table of every run.
#
#   bench/gateway/run.sh [--litellm] [--full] [--quick] [--out DIR]
#
#   default   xrouter bare: auth off, in-process limits, SQLite ledger (the embedded default)
#   --full    also xrouter with auth, a budgeted and rate-limited key, Redis limits and a
#             PostgreSQL ledger (the production stack)
#   --litellm also LiteLLM proxy (one worker, no database) through the same harness
#   --compact also xrouter/compact end to end (features + policy + the call), demo pool
#   --quick   shorter runs (5 s warm-up, 10 s measured, one repeat) for a smoke check
# Needs: the harness's setup.sh run once (wrk, /tmp/venvs/{fake,litellm}); the project venv.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
HARNESS=${HARNESS:-$ROOT/../shared/bench/gateway}
XR=${XROUTER_BIN:-$ROOT/.venv/bin/xrouter}
OUT=${OUT:-/tmp/xrouter-bench-$(date +%Y%m%d-%H%M%S)}
FULL=0; LITELLM=0; COMPACT=0; TIMING=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --full) FULL=1; shift ;;
    --litellm) LITELLM=1; shift ;;
    --compact) COMPACT=1; shift ;;
    --quick) TIMING=(--warmup 5 --duration 10 --repeat 1); shift ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"

wait_ready() { for _ in $(seq 1 200); do curl -sf "$1/readyz" >/dev/null && return 0; sleep 0.1; done; return 1; }

# 1. bare: the harness starts and pins the gateway itself.
MODE=bare "$HERE/xrouter_config.sh" "$OUT/bare.yaml"
"$HARNESS/run.sh" --gateway-cmd "$XR serve --config $OUT/bare.yaml --port 4100" \
  --gateway-url http://127.0.0.1:4100 --model fake-model --label xrouter-bare --out "$OUT/bare" "${TIMING[@]}"

# 2. full: start it pinned to the SUT CPU ourselves (a key must be created first).
if [[ $FULL == 1 ]]; then
  PGDB=xrouter_bench
  psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $PGDB" -qc "CREATE DATABASE $PGDB" postgres
  redis-cli --scan --pattern 'xrbench*' | xargs -r redis-cli del >/dev/null
  PGDB=$PGDB MODE=full "$HERE/xrouter_config.sh" "$OUT/full.yaml"
  taskset -c 0 setsid "$XR" serve --config "$OUT/full.yaml" --port 4101 >"$OUT/full-gateway.log" 2>&1 &
  GW_PID=$!
  trap 'kill -- -$GW_PID 2>/dev/null || true' EXIT
  wait_ready http://127.0.0.1:4101
  KEY=$(curl -sf -X POST http://127.0.0.1:4101/admin/keys -H 'Authorization: Bearer bench-admin-key' \
    -H 'content-type: application/json' \
    -d '{"alias":"bench","budget_usd":1000000,"budget_period":"monthly","rpm":100000000,"tpm":1000000000}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])')
  "$HARNESS/run.sh" --gateway-url http://127.0.0.1:4101 --gateway-pid "$GW_PID" --api-key "$KEY" \
    --model fake-model --label xrouter-full --skip-direct --out "$OUT/full" "${TIMING[@]}"
  kill -- -"$GW_PID" 2>/dev/null || true
  trap - EXIT
fi

# 3. xrouter/compact: the learned policy decides per request, then the call goes through.
if [[ $COMPACT == 1 ]]; then
  MODE=compact "$HERE/xrouter_config.sh" "$OUT/compact.yaml"
  "$HARNESS/run.sh" --gateway-cmd "$XR serve --config $OUT/compact.yaml --port 4102" \
    --gateway-url http://127.0.0.1:4102 --model xrouter/compact --label xrouter-compact --skip-direct \
    --out "$OUT/compact" "${TIMING[@]}"
fi

# 4. LiteLLM proxy, the anchor.
if [[ $LITELLM == 1 ]]; then
  "$HARNESS/run.sh" --litellm --skip-direct --out "$OUT/litellm" "${TIMING[@]}"
fi

python3 "$HARNESS/summarize.py" $(dirname "$OUT"/*/results.tsv) | tee "$OUT/SUMMARY.md"
echo "results in $OUT"
