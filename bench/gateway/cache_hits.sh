#!/usr/bin/env bash
# What the answer cache does to a worker's throughput: the same chat request through one
# xrouter worker on the shared harness's fake upstream, driven by wrk at the same
# concurrency, three ways —
#   off     the cache disabled (the plain pass-through; the body is store's, whose cache
#           control is then ignored, so that the two rows differ only by the cache);
#   store   the cache on, every request `no_cache` (routed upstream, answer stored): the
#           price of the cache on a miss;
#   hit     the cache on, the same request again: answered from the cache.
#
#   bench/gateway/cache_hits.sh [--duration S] [--conc C] [--backend memory|redis]
#
# Placement as in the shared harness: the gateway alone on CPU 0, wrk and the fake upstream
# on CPU 1. Prints wrk's requests/s and latency percentiles per row. Needs wrk and
# /tmp/venvs/fake (the harness's setup.sh), the project venv, and Redis for --backend redis.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DURATION=15; CONC=16; BACKEND=memory
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --conc) CONC=$2; shift 2 ;;
    --backend) BACKEND=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
OUT=$(mktemp -d /tmp/xrouter-cache-hits.XXXXXX)
source "$HERE/lib.sh"

start_fake_upstream
PROMPT="Say hello in one short sentence. ($(date +%s%N))"  # a question no earlier run stored
PLAIN="{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"$PROMPT\"}],\"max_tokens\":16}"
STORE="{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"$PROMPT\"}],\"max_tokens\":16,\"xrouter\":{\"cache\":{\"no_cache\":true}}}"
URL=http://127.0.0.1:4103

print_header
for cache in off "$BACKEND"; do
  # Each gateway gets a ledger of its own: a second one writing into the first one's
  # grown SQLite file would be slower for that alone.
  mkdir -p "$OUT/$cache"
  CACHE=${cache/off/} MODE=bare "$HERE/xrouter_config.sh" "$OUT/$cache/config.yaml"
  taskset -c 0 setsid "$XR" serve --config "$OUT/$cache/config.yaml" --port 4103 >"$OUT/gateway-$cache.log" 2>&1 &
  gw=$!
  track "$gw"
  wait_ready "$URL/readyz"
  if [[ $cache == off ]]; then
    measure off "$URL" /v1/chat/completions "$STORE" "$DURATION" "$CONC"
  else
    measure store "$URL" /v1/chat/completions "$STORE" "$DURATION" "$CONC"
    measure hit "$URL" /v1/chat/completions "$PLAIN" "$DURATION" "$CONC"
    curl -s "$URL/metrics" | grep '^xrouter_cache_lookups_total' | tr '\n' ' '; echo
  fi
  kill -- -"$gw"; wait "$gw" 2>/dev/null || true
done
echo "(backend: $BACKEND, c=$CONC, ${DURATION} s per row after 5 s of warm-up; logs in $OUT)"
