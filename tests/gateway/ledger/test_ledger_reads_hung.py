"""Admin and client reads of a ledger database that hangs (a network partition, a stopped
server keeping its sockets open) are a 503 after ``ledger.read_timeout_s``, not a call held
until TCP gives up; model requests are answered meanwhile (their rows wait in the journal).
The database is the session's PostgreSQL behind a loopback proxy the test freezes."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, gateway_config, start_gateway
from tests.support.tcp_proxy import ThreadedTcpProxy

pytestmark = pytest.mark.postgres

MODEL = "gemma-2-9b-it"


def test_reads_of_a_hung_database_are_given_up_as_503(
    upstream: Upstream, proxied_pg: tuple[ThreadedTcpProxy, str], tmp_path: Path
) -> None:
    proxy, url = proxied_pg
    cfg = gateway_config(tmp_path, upstream.base_url, ledger={"url": url, "read_timeout_s": 1})
    gw = start_gateway(tmp_path, cfg)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        first = client.chat.completions.create(model=MODEL, messages=messages).id
        assert httpx.get(f"{gw.url}/admin/spend", headers=admin).status_code == 200

        proxy.freeze()
        answered = client.chat.completions.create(model=MODEL, messages=messages).id
        reads = {
            "spend": ("/admin/spend", {}),
            "keys": ("/admin/keys", {}),
            "generation": ("/v1/generation", {"id": first}),
            "dashboard": ("/dashboard", {}),
        }
        for name, (path, params) in reads.items():
            t0 = time.monotonic()
            r = httpx.get(f"{gw.url}{path}", params=params, headers=admin, timeout=30)
            took = time.monotonic() - t0
            assert r.status_code == 503, (name, r.status_code, r.text[:200])
            assert r.json()["error"]["code"] == "database_unavailable", name
            assert r.headers["retry-after"] == "1", name  # an outage, not a refusal
            assert took < 10, (name, took)  # 1 s, and a flush's own bound at most
        r = httpx.post(
            f"{gw.url}/v1/feedback", json={"request_id": answered, "score": 1}, timeout=30
        )
        assert (r.status_code, r.json()["error"]["code"]) == (503, "database_unavailable")

        proxy.restore()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = httpx.get(f"{gw.url}/v1/generation", params={"id": answered}, timeout=30)
            if r.status_code == 200:
                break
            time.sleep(0.2)
        assert r.status_code == 200, r.text[:200]  # the row the hang held back
        spend = httpx.get(f"{gw.url}/admin/spend", headers=admin, timeout=30)
        assert spend.status_code == 200
    finally:
        gw.stop()
