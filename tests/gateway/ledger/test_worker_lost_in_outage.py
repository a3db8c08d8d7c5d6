"""A worker of several that dies while the ledger database is down: the others serve on."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import Upstream
from tests.support.gateway import gateway_config, start_gateway
from tests.support.tcp_proxy import ThreadedTcpProxy

pytestmark = pytest.mark.postgres

BODY = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "hi"}]}


def _until(check: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def _workers(supervisor: int) -> list[int]:
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return [
        int(pid)
        for pid in children
        if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def test_a_worker_lost_during_a_database_outage_does_not_stop_the_others(
    upstream: Upstream, proxied_pg: tuple[ThreadedTcpProxy, str], tmp_path: Path
) -> None:
    # uvicorn's supervisor stops the whole server when a worker fails to start, and a new
    # worker cannot open the ledger while PostgreSQL is down: one worker killed during an
    # outage (the OOM killer, say) took the healthy one down with it, and serve exited 0.
    proxy, url = proxied_pg
    gw = start_gateway(
        tmp_path, gateway_config(tmp_path, upstream.base_url, ledger={"url": url}), workers=2
    )
    try:
        # Both started (one answering /readyz is what start_gateway waits for): a worker of
        # the first start that fails to start still stops serve, as with one worker.
        assert _until(lambda: gw.log().count("Application startup complete") == 2)
        assert httpx.post(f"{gw.base_url}/chat/completions", json=BODY, timeout=30).is_success
        proxy.cut()
        os.kill(_workers(gw.proc.pid)[0], signal.SIGKILL)
        assert _until(lambda: "failed to start" in gw.log()), gw.log()[-3000:]
        assert gw.proc.poll() is None, gw.log()[-3000:]
        for _ in range(4):  # the other worker still answers, its rows journaled
            got = httpx.post(f"{gw.base_url}/chat/completions", json=BODY, timeout=30)
            assert got.status_code == 200, got.text
        started = gw.log().count("Application startup complete")
        proxy.restore()
        # The replacement, tried again, starts once the database is back.
        assert _until(lambda: gw.log().count("Application startup complete") > started)
    finally:
        gw.stop(timeout_s=60)
    assert gw.proc.returncode == 0, gw.log()[-3000:]
