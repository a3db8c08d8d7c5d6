#!/usr/bin/env bash
# Write an xrouter config for the shared gateway harness: one pool model, "fake-model", on
# the harness's fake upstream. MODE=bare: auth off, in-process limits, SQLite ledger.
# MODE=full: auth on with a key that has a budget and rpm/tpm limits, Redis limits,
# PostgreSQL ledger (database $PGDB). MODE=compact: as bare, but the pool is the eight demo
# models (all answered by the fake upstream), so xrouter/compact can route with the packaged
# checkpoint. CACHE=memory|redis turns the answer cache on with that backend.
set -euo pipefail
out=$1; mode=${MODE:-bare}; dir=$(dirname "$out")
upstream=${UPSTREAM_BASE:-http://127.0.0.1:18000/v1}
if [[ $mode == full ]]; then
  auth="auth: {enabled: true, admin_key: bench-admin-key}"
  ledger="ledger: {url: 'postgresql+asyncpg://postgres@127.0.0.1:5432/${PGDB:-xrouter_bench}', spill_dir: '$dir/spill'}"
  limits="limits: {backend: redis, redis_url: 'redis://127.0.0.1:6379/0', key_prefix: 'xrbench'}"
else
  auth="auth: {enabled: false}"
  ledger="ledger: {url: 'sqlite+aiosqlite:///$dir/bench-ledger.db', spill_dir: '$dir/spill'}"
  limits="limits: {backend: memory}"
fi
if [[ $mode == compact ]]; then
  pool="pool:"
  for m in llama-3.2-3b-instruct gemma-2-9b-it mistral-small-24b-instruct-2501-bf16 qwen2.5-7b-instruct \
           llama-3.1-8b-instruct mixtral-8x7b-instruct-v0.1 llama-3.3-70b-instruct mixtral-8x22b-instruct-v0.1; do
    pool+=$'\n'"  - {name: $m, model: openai/$m, api_base: '$upstream'}"
  done
else
  pool="pool:
  - name: fake-model
    model: openai/fake-model
    api_base: $upstream
    price: {input: 0.1, output: 0.3}"
fi
cache="cache: {enabled: false}"
if [[ -n ${CACHE:-} ]]; then
  cache="cache: {enabled: true, backend: $CACHE, redis_url: 'redis://127.0.0.1:6379/0', key_prefix: 'xrbench-cache'}"
fi
cat > "$out" <<YAML
server: {log_level: warning}
$auth
$ledger
$limits
$cache
router: {watch_files: false}
$pool
YAML
