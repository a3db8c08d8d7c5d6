#!/usr/bin/env bash
# The same request through both API shapes: POST /v1/chat/completions and POST
# /v1/responses (which the gateway translates to a chat request and back), one worker on the
# shared harness's fake upstream, each driven by wrk at the same concurrency.
#
#   bench/gateway/api_paths.sh [--duration S] [--conc C] [--stream]
#
# Placement as in the shared harness: the gateway alone on CPU 0, wrk and the fake upstream
# on CPU 1. Prints requests/s and wrk's latency percentiles per path (wrk's own figures, with
# its coordinated-omission correction: compare the two rows, not with run.sh's raw ones).
# Needs wrk and /tmp/venvs/fake (the harness's setup.sh), and the project venv.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
HARNESS=${HARNESS:-$ROOT/../shared/bench/gateway}
XR=${XROUTER_BIN:-$ROOT/.venv/bin/xrouter}
DURATION=15; CONC=16; STREAM=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --conc) CONC=$2; shift 2 ;;
    --stream) STREAM=true; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
OUT=$(mktemp -d /tmp/xrouter-api-paths.XXXXXX)
pids=()
# Stop both and wait for them, so that a run right after this one finds its ports free.
cleanup() { for p in "${pids[@]}"; do kill -- -"$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_ready() { for _ in $(seq 1 200); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; return 1; }

taskset -c 1 setsid /tmp/venvs/fake/bin/python "$HARNESS/fake_upstream.py" --port 18000 \
  >"$OUT/fake.log" 2>&1 &
pids+=($!)
MODE=bare "$HERE/xrouter_config.sh" "$OUT/bare.yaml"
taskset -c 0 setsid "$XR" serve --config "$OUT/bare.yaml" --port 4102 >"$OUT/gateway.log" 2>&1 &
pids+=($!)
wait_ready http://127.0.0.1:4102/readyz

PROMPT="Say hello in one short sentence."
CHAT="{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"$PROMPT\"}],\"max_tokens\":16,\"stream\":$STREAM}"
RESP="{\"model\":\"fake-model\",\"input\":\"$PROMPT\",\"max_output_tokens\":16,\"stream\":$STREAM}"
printf '%-22s %10s %9s %9s %9s %7s\n' path "req/s" p50 p90 p99 non200
for spec in "/v1/chat/completions|$CHAT" "/v1/responses|$RESP"; do
  path=${spec%%|*}; body=${spec#*|}
  curl -sf -o /dev/null -H 'content-type: application/json' -d "$body" "http://127.0.0.1:4102$path"
  for phase in warmup measure; do
    d=$([[ $phase == warmup ]] && echo 5 || echo "$DURATION")
    BENCH_PATH=$path BENCH_BODY=$body taskset -c 1 wrk -t"$CONC" -c"$CONC" -d"${d}s" --latency \
      -s "$HERE/post.lua" http://127.0.0.1:4102 >"$OUT/wrk-$phase.txt"
  done
  rps=$(awk '/^Requests\/sec/ {print $2}' "$OUT/wrk-measure.txt")
  pct() { awk -v p="$1" '$1 == p {print $2}' "$OUT/wrk-measure.txt"; }
  printf '%-22s %10s %9s %9s %9s %7s\n' "$path" "$rps" "$(pct 50%)" "$(pct 90%)" "$(pct 99%)" \
    "$(awk '/^non200/ {print $2}' "$OUT/wrk-measure.txt")"
done
echo "(stream: $STREAM, c=$CONC, ${DURATION} s per path after 5 s of warm-up; logs in $OUT)"
