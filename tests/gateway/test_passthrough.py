"""A pool model named as the request's model: that model, with its configured fallbacks,
held to the request's allow-list (``xrouter.models``) as routed requests are."""

from __future__ import annotations

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


def ask(gw: Gateway, **extra: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    return httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)


def test_a_failing_model_falls_back_as_configured(gw: Gateway, upstream: Upstream) -> None:
    upstream.fault(MODEL, "status=503", count=2)  # both of its attempts
    r = ask(gw)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == FALLBACK
    (call,) = r.json()["xrouter"]["calls"]
    assert call["model"] == FALLBACK and call["fallback_from"] == MODEL
    assert upstream.stats()["requests"] == {MODEL: 2, FALLBACK: 1}


def test_the_allow_list_holds_for_the_model_and_its_fallbacks(
    gw: Gateway, upstream: Upstream
) -> None:
    # The named model left out: refused, as a routed request with nothing allowed is.
    r = ask(gw, xrouter={"models": [FALLBACK]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "no_allowed_models"
    r = ask(gw, xrouter={"models": [MODEL, "no-such-model"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "xrouter.models"
    # Its fallback left out: the model's failure is the answer.
    upstream.fault(MODEL, "status=503", count=2)
    r = ask(gw, xrouter={"models": [MODEL]})
    assert r.status_code == 502 and upstream.stats()["requests"] == {MODEL: 2}
