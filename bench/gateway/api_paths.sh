#!/usr/bin/env bash
# The same request through the three API shapes: POST /v1/chat/completions, POST
# /v1/responses and POST /v1/messages (the last two translated to a chat request and back),
# one worker on the shared harness's fake upstream, each driven by wrk at the same
# concurrency.
#
#   bench/gateway/api_paths.sh [--duration S] [--conc C] [--stream]
#
# Placement as in the shared harness: the gateway alone on CPU 0, wrk and the fake upstream
# on CPU 1. Prints requests/s and wrk's latency percentiles per path (wrk's own figures, with
# its coordinated-omission correction: compare the rows, not with run.sh's raw ones).
# Needs wrk and /tmp/venvs/fake (the harness's setup.sh), and the project venv.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
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
source "$HERE/lib.sh"

start_fake_upstream
MODE=bare "$HERE/xrouter_config.sh" "$OUT/bare.yaml"
taskset -c 0 setsid "$XR" serve --config "$OUT/bare.yaml" --port 4102 >"$OUT/gateway.log" 2>&1 &
track $!
wait_ready http://127.0.0.1:4102/readyz

PROMPT="Say hello in one short sentence."
CHAT="{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"$PROMPT\"}],\"max_tokens\":16,\"stream\":$STREAM}"
RESP="{\"model\":\"fake-model\",\"input\":\"$PROMPT\",\"max_output_tokens\":16,\"stream\":$STREAM}"
MSGS="{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"$PROMPT\"}],\"max_tokens\":16,\"stream\":$STREAM}"
print_header path
measure /v1/chat/completions http://127.0.0.1:4102 /v1/chat/completions "$CHAT" "$DURATION" "$CONC"
measure /v1/responses http://127.0.0.1:4102 /v1/responses "$RESP" "$DURATION" "$CONC"
measure /v1/messages http://127.0.0.1:4102 /v1/messages "$MSGS" "$DURATION" "$CONC"
echo "(stream: $STREAM, c=$CONC, ${DURATION} s per path after 5 s of warm-up; logs in $OUT)"
