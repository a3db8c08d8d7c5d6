#!/usr/bin/env bash
# Make sure the local Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432, trust auth) that
# the integration tests use are running; start them the way this machine's image does.
set -uo pipefail
if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
  echo "starting redis" >&2
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log || echo "could not start redis" >&2
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "starting postgresql" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || echo "could not start postgresql" >&2
fi
for _ in $(seq 1 30); do
  pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && exit 0
  sleep 1
done
echo "warning: redis or postgresql is not reachable; their tests will fail or skip" >&2
