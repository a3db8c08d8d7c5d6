"""A gateway whose Redis goes away with ``limits.on_store_error: closed`` (the default):
every request that needs the store is a 503 ``limits_unavailable``, in the OpenAI error
shape, with its ledger row, and no hold or traceback left behind."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import Upstream, ledger_rows
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.redis_server import PrivateRedis

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
MODEL = "llama-3.2-3b-instruct"


@contextmanager
def gateway_on_private_redis(
    upstream: Upstream, tmp_path: Path
) -> Iterator[tuple[PrivateRedis, Gateway]]:
    """A gateway with auth on whose limit store is a Redis of its own (to stop at will),
    ``on_store_error: closed``; both stopped afterwards."""
    server = PrivateRedis()
    cfg = gateway_config(
        tmp_path,
        upstream.base_url,
        auth={"enabled": True},
        limits={"backend": "redis", "redis_url": server.url, "on_store_error": "closed"},
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        yield server, gw
    finally:
        server.stop()
        gw.stop()


@pytest.mark.redis
def test_requests_are_refused_with_503_and_logged_when_the_limit_store_is_down(
    upstream: Upstream, tmp_path: Path
) -> None:
    with gateway_on_private_redis(upstream, tmp_path) as (server, gw):
        keys = {}
        # A budget alone needs the store only for its holds; a rate limit, at admission.
        for name, fields in (("budget", {"budget_usd": 5.0}), ("rate", {"rpm": 100})):
            r = httpx.post(
                f"{gw.url}/admin/keys",
                json={"alias": f"{name}-{secrets.token_hex(3)}", **fields},
                headers=ADMIN,
            )
            assert r.status_code == 201, r.text
            keys[name] = r.json()["key"]
        server.stop()

        for name, key in keys.items():
            for model in (MODEL, "xrouter"):
                r = httpx.post(
                    f"{gw.base_url}/chat/completions",
                    json={"model": model, "messages": [{"role": "user", "content": "Hi"}]},
                    headers={"Authorization": f"Bearer {key}"},
                    timeout=30,
                )
                assert r.status_code == 503, (name, model, r.text)
                error = r.json()["error"]
                assert (error["code"], error["type"]) == ("limits_unavailable", "server_error")
                assert r.headers["retry-after"] == "1", r.headers  # an outage: come back
                request_id = r.headers["x-xrouter-request-id"]
                (status, _, cost), calls = ledger_rows(gw, request_id)
                assert (status, cost) == (503, 0), name
                # No downstream call was made without a hold on the budget.
                assert all(c[1] == 0 for c in calls)
        assert upstream.stats()["requests"].get(MODEL, 0) == 0
        # The operator's views still answer: a key's spend comes from the ledger meanwhile.
        r = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN)
        assert r.status_code == 200, r.text
        budget = next(k for k in r.json()["data"] if k["budget_usd"] == 5.0)
        assert (budget["spent_usd"], budget["remaining_usd"]) == (0.0, 5.0)
        assert httpx.get(f"{gw.url}/dashboard", headers=ADMIN).status_code == 200
        assert "Traceback" not in gw.log()


@pytest.mark.redis
def test_a_key_reads_its_spend_from_the_ledger_while_the_store_is_down(
    upstream: Upstream, tmp_path: Path
) -> None:
    """``GET /v1/key`` answers as the admin's list does during a Redis outage (it was a 503):
    the period's spend as the ledger has it, the store's figure before the outage."""
    with gateway_on_private_redis(upstream, tmp_path) as (server, gw):
        r = httpx.post(
            f"{gw.url}/admin/keys",
            json={
                "alias": f"b-{secrets.token_hex(3)}",
                "budget_usd": 5.0,
                "budget_period": "daily",
            },
            headers=ADMIN,
        )
        key = {"Authorization": f"Bearer {r.json()['key']}"}
        r = httpx.post(
            f"{gw.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
            headers=key,
            timeout=30,
        )
        assert r.status_code == 200, r.text
        ledger_rows(gw, r.headers["x-xrouter-request-id"])  # written
        before = httpx.get(f"{gw.base_url}/key", headers=key).json()["data"]
        assert before["spent_usd"] > 0
        server.stop()

        r = httpx.get(f"{gw.base_url}/key", headers=key)
        assert r.status_code == 200, r.text
        during = r.json()["data"]
        assert during["spent_usd"] == pytest.approx(before["spent_usd"])
        assert during["remaining_usd"] == pytest.approx(5.0 - before["spent_usd"])
        assert (during["period_start"], during["resets_at"]) == (
            before["period_start"],
            before["resets_at"],
        )
        assert "Traceback" not in gw.log()
