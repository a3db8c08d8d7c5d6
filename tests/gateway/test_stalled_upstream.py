"""An upstream that stalls mid-stream (a chunk, then silence longer than the model's
``timeout_s``): the per-chunk read timeout (the native transport's ``sock_read``) ends the
call, and each API's client gets its own error event to end on — a chat ``error`` chunk and
``[DONE]``, a Responses ``response.failed``, a Messages ``error`` event — with the request
booked as a 504 ``upstream_timeout`` and its call as a ``timeout``, charged for what came."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import apis
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.replay import start_replay_upstream, stop_replay_upstream

MODEL = "llama-3.2-3b-instruct"
PROMPT = "Name three primary colours."
GAP_MS = 4000  # after every delta, against the model's timeout_s of 1 s


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("stalled-upstream")
    proc, base_url = start_replay_upstream(tmp, "--stream-chunk-delay-ms", str(GAP_MS))
    cfg = gateway_config(tmp, base_url)
    cfg["pool"] = [
        {**m, "timeout_s": 1, "max_retries": 0} for m in cfg["pool"] if m["name"] == MODEL
    ]
    cfg["router"] = {**cfg["router"], "default_policy": f"fixed:{MODEL}"}
    gw = start_gateway(tmp, cfg)
    yield gw
    gw.stop()
    stop_replay_upstream(proc)


def body_for(path: str, user: str) -> dict[str, Any]:
    return apis.body_for(path, MODEL, PROMPT, user)


def row_for(gw: Gateway, user: str) -> tuple[Any, ...]:
    row = apis.ledger_row(
        gw,
        "SELECT r.status, r.error_type, c.error_type, c.completion_tokens "
        "FROM requests r JOIN calls c ON c.request_id = r.request_id WHERE r.end_user = ?",
        user,
    )
    if row is None:
        raise AssertionError(f"no ledger row for {user}")
    return row


def events(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[5:])
        for line in text.splitlines()
        if line.startswith("data:") and line[5:].strip() != "[DONE]"
    ]


@pytest.mark.parametrize("path", apis.MODEL_APIS)
def test_an_upstream_that_stalls_mid_stream_ends_in_the_apis_error_event(
    gateway: Gateway, path: str
) -> None:
    user = f"stall-up-{secrets.token_hex(4)}"
    t = time.monotonic()
    r = httpx.post(f"{gateway.url}{path}", json=body_for(path, user), timeout=30)
    took = time.monotonic() - t
    assert r.status_code == 200
    # Ended by the 1 s read timeout after the first delta, not by the upstream's 4 s gap.
    assert took < GAP_MS / 1000
    last = events(r.text)[-1]
    if path == "/v1/chat/completions":
        assert r.text.endswith("data: [DONE]\n\n")
        assert last["error"]["code"] == "upstream_timeout"
    elif path == "/v1/responses":
        assert last["type"] == "response.failed"
        assert last["response"]["error"]["code"] == "server_error"
    else:
        assert last["type"] == "error" and last["error"]["type"] == "timeout_error", last
    status, error_type, call_error, completion_tokens = row_for(gateway, user)
    assert (status, error_type, call_error) == (504, "upstream_timeout", "timeout")
    assert completion_tokens > 0  # the delta that came, estimated
