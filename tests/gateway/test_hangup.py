"""SIGHUP to ``xrouter serve``, as a closed terminal sends it to every process of the group:
the requests in flight finish and keep their ledger rows, with one worker or several."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import Upstream
from tests.support.gateway import gateway_config, start_gateway

MODEL = "gemma-2-9b-it"


def _send(url: str, stream: bool, got: dict[int, tuple[int, str, str]], n: int) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"hi {n} [[replay:latency=2500]]"}],
        "stream": stream,
    }
    try:
        with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60) as r:
            got[n] = (r.status_code, r.headers.get("x-request-id", ""), r.read().decode())
    except httpx.HTTPError as exc:  # cut without an answer: what the hangup did
        got[n] = (0, "", repr(exc))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_hangup_lets_the_requests_in_flight_finish_with_their_rows(
    upstream: Upstream, tmp_path: Path, workers: int
) -> None:
    # uvicorn's server handles SIGINT and SIGTERM only: a SIGHUP killed one worker on the
    # spot, and reached each of several workers (the supervisor replaces them one at a
    # time on SIGHUP, gracefully) with the same effect. The requests in flight were cut with
    # no answer and no ledger row, and their budget holds left to expire.
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url), workers=workers)
    try:
        before = upstream.stats()["requests"].get(MODEL, 0)
        got: dict[int, tuple[int, str, str]] = {}
        clients = [
            threading.Thread(target=_send, args=(gw.base_url, n % 2 == 0, got, n)) for n in range(4)
        ]
        for t in clients:
            t.start()
        deadline = time.monotonic() + 30
        while upstream.stats()["requests"].get(MODEL, 0) < before + 4:
            assert time.monotonic() < deadline, upstream.stats()
            time.sleep(0.05)
        os.killpg(gw.proc.pid, signal.SIGHUP)
        for t in clients:
            t.join(60)
        assert [status for status, _, _ in got.values()] == [200] * 4, got
        assert all("[DONE]" in text for n, (_, _, text) in got.items() if n % 2 == 0), got
        if workers == 1:
            gw.proc.wait(30)  # stopped, as on SIGTERM
        else:  # the supervisor restarted its workers and serves on
            body = {"model": MODEL, "messages": [{"role": "user", "content": "again"}]}
            again = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
            assert again.status_code == 200, again.text
    finally:
        gw.stop()
    with sqlite3.connect(tmp_path / "ledger.db") as db:
        rows = {rid for (rid,) in db.execute("SELECT request_id FROM requests WHERE status = 200")}
    assert {rid for _, rid, _ in got.values()} <= rows
