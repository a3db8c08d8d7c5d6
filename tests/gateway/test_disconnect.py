"""A client that hangs up before its answer starts (a client timeout while the upstream is
slow, streamed or not, on all three APIs) stops the routing: the request is booked as 499
at once, with the call it made, and the upstream call is not waited out."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Upstream
from tests.support import apis
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream

MODEL = "llama-3.2-3b-instruct"
PROMPT = "Name three primary colours."
SLOW_MS = 4000


def body_for(path: str, user: str, stream: bool) -> dict[str, Any]:
    return apis.body_for(path, MODEL, PROMPT, user, stream=stream)


def row_for(gw: Gateway, user: str, timeout_s: float = 10.0) -> tuple[int, float, int]:
    """(status, latency in ms, number of calls) of the request made for ``user``."""
    row = apis.ledger_row(
        gw,
        "SELECT r.status, r.latency_ms, (SELECT count(*) FROM calls c "
        "WHERE c.request_id = r.request_id) FROM requests r WHERE r.end_user = ?",
        user,
        timeout_s,
    )
    if row is None:
        raise AssertionError(f"no ledger row for {user}")
    return row[0], row[1], row[2]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("path", apis.MODEL_APIS)
def test_a_client_that_times_out_before_the_answer_stops_the_routing(
    gateway: Gateway, upstream: Upstream, path: str, stream: bool
) -> None:
    upstream.fault(MODEL, f"latency={SLOW_MS}")
    user = f"gone-{secrets.token_hex(4)}"
    sent = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gateway.url}{path}", json=body_for(path, user, stream), timeout=0.5)
    status, latency_ms, calls = row_for(gateway, user)
    booked_after_s = time.monotonic() - sent
    assert status == 499
    # Booked when the client left, not when the upstream would have answered.
    assert latency_ms < SLOW_MS / 2 and booked_after_s < SLOW_MS / 1000
    assert calls == 1  # the call it started, kept


def test_a_client_that_waits_is_answered_as_before(gateway: Gateway, upstream: Upstream) -> None:
    # The watch reads the connection only for a hang-up: a slow answer to a patient client
    # (streamed too, where Starlette listens for the hang-up as well) still arrives.
    upstream.fault(MODEL, "latency=300", count=2)
    for stream in (False, True):
        user = f"patient-{secrets.token_hex(4)}"
        r = httpx.post(
            f"{gateway.url}/v1/chat/completions", json=body_for("", user, stream), timeout=30
        )
        assert r.status_code == 200 and (r.text.endswith("[DONE]\n\n") if stream else r.json())
        assert row_for(gateway, user)[0] == 200


@pytest.fixture(scope="module")
def flood(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    """A gateway in front of an upstream that streams a very long recorded answer as fast
    as it can (no delay between chunks): relaying never has to wait for the upstream."""
    tmp = tmp_path_factory.mktemp("flood")
    answer = "word " * 150_000
    table = tmp / "table.jsonl"
    record = {"id": "long", "prompt": LONG_PROMPT,
              "outcomes": {MODEL: {"score": 1.0, "cost_usd": 0.05, "prompt_tokens": 10,
                                   "completion_tokens": 150_000, "response": answer}}}  # fmt: skip
    table.write_text(json.dumps(record) + "\n")
    proc, base_url = start_replay_upstream(tmp, "--table", str(table))
    cfg = gateway_config(tmp, base_url)
    cfg["pool"] = [m for m in cfg["pool"] if m["name"] == MODEL]
    cfg["router"] = {**cfg["router"], "default_policy": f"fixed:{MODEL}"}
    gw = start_gateway(tmp, cfg)
    yield gw, replay_root(base_url)
    gw.stop()
    stop_replay_upstream(proc)


LONG_PROMPT = "Say one word, many times."


def test_a_hang_up_mid_stream_is_seen_though_the_upstream_never_pauses(
    flood: tuple[Gateway, str],
) -> None:
    gw, _ = flood
    user = f"flood-{secrets.token_hex(4)}"
    body = {"model": MODEL, "stream": True, "user": user,
            "messages": [{"role": "user", "content": LONG_PROMPT}]}  # fmt: skip
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for i, _line in enumerate(r.iter_lines()):
            if i > 200:
                break
    status, _, _ = row_for(gw, user)
    assert status == 499
    db = gw.config_path.parent / "ledger.db"
    with sqlite3.connect(db) as conn:
        (tokens,) = conn.execute(
            "SELECT c.completion_tokens FROM calls c JOIN requests r USING (request_id) "
            "WHERE r.end_user = ?",
            (user,),
        ).fetchone()
    # Cut when the client left, not read (and charged) to its end.
    assert tokens < 150_000 / 2, tokens
