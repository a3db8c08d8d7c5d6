"""The gateway runs on a read-only root filesystem with only /tmp writable — what the Helm
chart's ``readOnlyRootFilesystem: true`` asks of it: two workers (multiprocess metrics in
/tmp), PostgreSQL ledger with its journal and spill files in /tmp, Redis limits, a request
that reaches the replay upstream and is written to the ledger.

The filesystem is made read-only in a private mount namespace (``unshare -m``, which needs
root: this machine's CI runs as root), the way a container runtime does it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import requests_in
from tests.gateway.ledger.factories import pg_url
from tests.support.gateway import DEMO_MODELS, free_port
from tests.support.replay import start_replay_upstream, stop_replay_upstream

REPO = Path(__file__).resolve().parents[2]
ADMIN = "sk-admin-ro-test"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or not Path("/mnt").is_dir(),
    reason="needs root, unshare(1) and /mnt for a private read-only mount namespace",
)


def test_serves_with_only_tmp_writable(tmp_path: Path, pg_database: str) -> None:
    proc, base = start_replay_upstream(tmp_path)
    try:
        port = free_port()
        config = {
            "server": {"workers": 2},
            "auth": {"enabled": True, "admin_key": ADMIN},
            "ledger": {
                "url": pg_url(pg_database),
                "spill_dir": "/tmp/xrouter/spill",
            },
            "limits": {"backend": "redis", "redis_url": "redis://127.0.0.1:6379/6"},
            "pool": [{"name": m, "model": f"openai/{m}", "api_base": base} for m in DEMO_MODELS],
        }
        # Inside the namespace: / read-only, a fresh tmpfs on /tmp, then the gateway from
        # the (read-only) checkout, driven by the real openai client.
        script = textwrap.dedent(
            f"""
            set -e
            mount --bind / / && mount -o remount,bind,ro /
            # A checkout under /tmp (a CI runner's) would vanish under the tmpfs: keep a
            # read-only view of it aside and put it back at its path.
            mount --bind {REPO} /mnt
            mount -t tmpfs tmpfs /tmp
            mkdir -p {REPO} && mount --bind /mnt {REPO}
            if touch {Path(__file__).resolve().parent}/probe 2>/dev/null; then
              echo "root is writable"; exit 3
            fi
            printf '%s' "$XROUTER_TEST_CONFIG" > /tmp/config.yaml
            cd /
            {sys.executable} -m gateway.cli serve --config /tmp/config.yaml --port {port} \\
              > /tmp/gateway.log 2>&1 &
            gw=$!
            {sys.executable} -c "$XROUTER_TEST_CLIENT" || {{ cat /tmp/gateway.log; kill $gw; exit 4; }}
            kill -TERM $gw; wait $gw || true
            if grep -E "Read-only file system|Traceback" /tmp/gateway.log; then exit 5; fi
            echo SERVED
            """
        )
        client = textwrap.dedent(
            f"""
            import time, httpx, openai
            url = "http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                raise SystemExit("not ready")
            made = httpx.post(url + "/admin/keys", json={{"alias": "ro"}},
                              headers={{"Authorization": "Bearer {ADMIN}"}})
            made.raise_for_status()
            c = openai.OpenAI(base_url=url + "/v1", api_key=made.json()["key"], max_retries=0)
            out = c.chat.completions.create(
                model="xrouter", messages=[{{"role": "user", "content": "hello"}}])
            assert out.choices[0].message.content
            stream = c.chat.completions.create(
                model="xrouter", stream=True, messages=[{{"role": "user", "content": "hi"}}])
            assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
            assert "xrouter_requests_total" in httpx.get(url + "/metrics").text
            """
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "XROUTER_TEST_CONFIG": yaml.safe_dump(config),
            "XROUTER_TEST_CLIENT": client,
        }
        res = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0 and "SERVED" in res.stdout, res.stdout + res.stderr
    finally:
        stop_replay_upstream(proc)

    # Both requests were drained to PostgreSQL on the graceful shutdown.
    assert requests_in(pg_database) == 2
