"""A pool model named as the request's model: that model, with its configured fallbacks,
held to the request's allow-list (``xrouter.models``) as routed requests are."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Upstream
from tests.support.gateway import Gateway, gateway_config, start_gateway

MODEL = "gemma-2-9b-it"
FALLBACK = "llama-3.2-3b-instruct"


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("passthrough")
    cfg = gateway_config(tmp, upstream.base_url)
    for m in cfg["pool"]:
        if m["name"] == MODEL:
            m["fallbacks"] = [FALLBACK]
    g = start_gateway(tmp, cfg)
    yield g
    g.stop()


def ask(gw: Gateway, name: str = MODEL, **extra: Any) -> httpx.Response:
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)


# A model asked for by name, and the fixed policy on it: the same model, the same fallbacks
# and limits, never another model standing in under the policy's name.
NAMES = pytest.mark.parametrize("name", [MODEL, f"xrouter/fixed:{MODEL}"])


@NAMES
def test_a_failing_model_falls_back_as_configured(
    gw: Gateway, upstream: Upstream, name: str
) -> None:
    upstream.fault(MODEL, "status=503", count=2)  # both of its attempts
    r = ask(gw, name)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == FALLBACK
    (call,) = r.json()["xrouter"]["calls"]
    assert call["model"] == FALLBACK and call["fallback_from"] == MODEL
    assert upstream.stats()["requests"] == {MODEL: 2, FALLBACK: 1}


@NAMES
def test_a_streamed_answer_names_the_fallback_that_gave_it(
    gw: Gateway, upstream: Upstream, name: str
) -> None:
    # The header and every chunk named the model that failed before its first chunk, while
    # the unstreamed answer, the calls and the ledger named the fallback.
    upstream.fault(MODEL, "status=503", count=2)
    body = {
        "model": name,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{gw.base_url}/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["x-xrouter-model"] == FALLBACK
        chunks = [
            json.loads(line[len("data: ") :])
            for line in r.iter_lines()
            if line.startswith("data: {")
        ]
    assert chunks and {c["model"] for c in chunks} == {FALLBACK}
    assert upstream.stats()["requests"] == {MODEL: 2, FALLBACK: 1}


@NAMES
def test_the_allow_list_holds_for_the_model_and_its_fallbacks(
    gw: Gateway, upstream: Upstream, name: str
) -> None:
    # The named model left out: refused, as a routed request with nothing allowed is.
    r = ask(gw, name, xrouter={"models": [FALLBACK]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "no_allowed_models"
    r = ask(gw, name, xrouter={"models": [MODEL, "no-such-model"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "xrouter.models"
    # Its fallback left out: the model's failure is the answer.
    upstream.fault(MODEL, "status=503", count=2)
    r = ask(gw, name, xrouter={"models": [MODEL]})
    assert r.status_code == 502 and upstream.stats()["requests"] == {MODEL: 2}


@NAMES
def test_a_cost_cap_the_model_would_exceed_is_refused(
    gw: Gateway, upstream: Upstream, name: str
) -> None:
    # A cap below the model's worst case (4,000 output tokens at $0.10/M is $0.0004) but
    # above a cheaper model's ($0.06/M: $0.00024): no call, and no cheaper model in its place.
    r = ask(gw, name, max_tokens=4000, xrouter={"max_cost_usd": 0.0003})
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "request_budget_exceeded"
    assert upstream.stats()["requests"] == {}


def test_a_fixed_default_policy_is_reported_by_its_name(upstream: Upstream, tmp_path: Path) -> None:
    """A gateway whose default policy is ``fixed:<model>`` reports its traffic under that
    name in metrics, as the ledger and spend reports name it, not as ``other``."""
    model = "gemma-2-9b-it"
    cfg = gateway_config(
        tmp_path,
        upstream.base_url,
        router={"watch_files": False, "default_policy": f"fixed:{model}"},
    )
    g = start_gateway(tmp_path, cfg)
    try:
        for name in ("xrouter", f"xrouter/fixed:{model}"):
            r = httpx.post(
                f"{g.base_url}/chat/completions",
                json={"model": name, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 200, r.text
            assert r.json()["xrouter"]["policy"] == f"fixed:{model}"
        scraped = httpx.get(f"{g.url}/metrics").text
        requests = [
            line for line in scraped.splitlines() if line.startswith("xrouter_requests_total{")
        ]
        assert any(
            f'policy="fixed:{model}"' in line and line.endswith(" 2.0") for line in requests
        ), requests
        assert not any('policy="other"' in line for line in requests), requests
    finally:
        g.stop()
