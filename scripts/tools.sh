#!/usr/bin/env bash
# Command-line tools the tests drive besides Python packages: promtool (Prometheus' rule
# checker and rule unit-tester, for deploy/prometheus). Taken from Debian's `prometheus`
# package without installing it (no service, no root): the .deb is downloaded and only the
# promtool binary is extracted into the virtualenv's bin/.
set -euo pipefail
VENV="${1:-.venv}"
dest="$VENV/bin/promtool"
if [ -x "$dest" ]; then
  exit 0
fi
if command -v promtool >/dev/null 2>&1; then
  ln -sf "$(command -v promtool)" "$dest"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for attempt in 1 2 3; do
  if (cd "$work" && apt-get download -q prometheus >/dev/null 2>&1); then
    break
  fi
  [ "$attempt" = 3 ] && { echo "tools.sh: cannot download Debian's prometheus package" >&2; exit 1; }
  sleep $((attempt * 5))
done
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
install -m 0755 "$work/root/usr/bin/promtool" "$dest"
"$dest" --version | head -1 >&2
