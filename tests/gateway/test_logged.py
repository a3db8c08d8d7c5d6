"""``/v1/feedback`` and ``/v1/generation`` right after the answer, when another worker of
the same gateway answered it: its row is still in that worker's queue."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, gateway_config, start_gateway

MODEL = "gemma-2-9b-it"


def test_a_request_another_worker_answered_a_moment_ago_is_found(
    upstream: Upstream, tmp_path: Path
) -> None:
    # A long flush interval: a row written by the other worker waits for it in its queue.
    cfg = gateway_config(tmp_path, upstream.base_url)
    cfg["ledger"]["flush_interval_ms"] = 400
    gw = start_gateway(tmp_path, cfg, workers=2)
    try:
        statuses = []
        for i in range(12):
            # A new connection per call: the kernel spreads them over both workers.
            r = httpx.post(
                f"{gw.base_url}/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": f"hi {i}"}]},
                headers={"connection": "close"},
            )
            assert r.status_code == 200, r.text
            rid = r.headers["x-request-id"]
            fb = httpx.post(
                f"{gw.base_url}/feedback",
                json={"request_id": rid, "score": 1},
                headers={"connection": "close"},
            )
            gen = httpx.get(
                f"{gw.base_url}/generation", params={"id": rid}, headers={"connection": "close"}
            )
            statuses.append((fb.status_code, gen.status_code))
        assert statuses == [(200, 200)] * 12
        # An id no worker answered is still a 404 (after the other workers' flush interval).
        r = httpx.get(f"{gw.base_url}/generation", params={"id": "0" * 32})
        assert r.status_code == 404 and r.json()["error"]["code"] == "request_not_found"
    finally:
        gw.stop()


def test_another_key_s_request_is_looked_for_as_an_unknown_one_is(
    upstream: Upstream, tmp_path: Path
) -> None:
    """Its 404 comes no sooner than an unknown id's: how long the answer took must not say
    that the id exists (it waits out the same flush interval, 400 ms here, as a lower
    bound, not a speed target)."""
    cfg = gateway_config(tmp_path, upstream.base_url, auth={"enabled": True})
    cfg["ledger"]["flush_interval_ms"] = 400
    gw = start_gateway(tmp_path, cfg)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        keys = [
            httpx.post(f"{gw.url}/admin/keys", json={"alias": a}, headers=admin).json()["key"]
            for a in ("a", "b")
        ]
        r = httpx.post(
            f"{gw.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {keys[0]}"},
        )
        rid = r.headers["x-request-id"]
        owner = {"Authorization": f"Bearer {keys[0]}"}
        other = {"Authorization": f"Bearer {keys[1]}"}
        assert httpx.get(f"{gw.base_url}/generation", params={"id": rid}, headers=owner).is_success
        for request_id in (rid, "f" * 32):
            started = time.monotonic()
            got = httpx.get(f"{gw.base_url}/generation", params={"id": request_id}, headers=other)
            assert got.status_code == 404 and time.monotonic() - started >= 0.4
    finally:
        gw.stop()
