"""Every answer of the gateway says ``X-Content-Type-Options: nosniff``: errors echo what the
client sent, and a browser must not sniff such a body into HTML."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.gateway.conftest import Upstream
from tests.support.gateway import Gateway, gateway_config, start_gateway

CHAT = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "nosniff check"}]}


def nosniff(r: httpx.Response) -> bool:
    return r.headers.get_list("x-content-type-options") == ["nosniff"]


def test_answers_and_errors_of_every_kind_are_not_sniffed(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        answers = [
            client.get("/healthz"),
            client.get("/v1/models"),
            client.get("/metrics"),
            client.post("/v1/chat/completions", json=CHAT),
            # Errors that echo the request: an unknown path, an unknown model, a bad body.
            client.get("/<b>not-here</b>"),
            client.post("/v1/chat/completions", json={**CHAT, "model": "<b>nope</b>"}),
            client.post("/v1/chat/completions", content=b"{not json"),
            client.delete("/v1/models"),
        ]
        with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as s:
            s.read()
            answers.append(s)
    assert [r.status_code for r in answers] == [200, 200, 200, 200, 404, 404, 400, 405, 200]
    assert [nosniff(r) for r in answers] == [True] * len(answers)


def test_refusals_before_routing_and_cors_preflights_are_not_sniffed_either(
    upstream: Upstream, tmp_path: Path
) -> None:
    origin = "https://app.example"
    cfg = gateway_config(
        tmp_path, upstream.base_url, auth={"enabled": True}, server={"cors_allow_origins": [origin]}
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        refused = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
        preflight = httpx.options(
            f"{gw.url}/v1/chat/completions",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        )
        assert refused.status_code == 401 and preflight.status_code == 200
        assert nosniff(refused) and nosniff(preflight)
    finally:
        gw.stop()
