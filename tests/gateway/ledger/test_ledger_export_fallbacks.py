"""Through a real gateway: what a call that left the model asked for (its circuit kept the
call away, or it failed) says in the ledger and in the response, and what the export makes
of it. A model that was never called is no failure of it, whatever its fallbacks did."""

from __future__ import annotations

import argparse
import secrets
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.ledger.export import read_export
from gateway.ledger.export_cli import add_export_arguments, run_export
from tests.gateway.conftest import Upstream
from tests.support.gateway import Gateway, gateway_config, start_gateway

# Each model asked for, with its one configured fallback. The first is kept away by its
# open circuit; the others are called and fail.
KEPT_AWAY, KEPT_AWAY_FALLBACK = "gemma-2-9b-it", "llama-3.3-70b-instruct"
CALLED, CALLED_FALLBACK = "qwen2.5-7b-instruct", "mixtral-8x7b-instruct-v0.1"
FALLBACKS = {KEPT_AWAY: KEPT_AWAY_FALLBACK, CALLED: CALLED_FALLBACK}
SLOW = "latency=4000"  # a fallback still in flight when the client gives up at 0.5 s

_CALL_COLUMNS = ("model", "status", "error_type", "fallback_from", "fallback_reason")


@pytest.fixture
def gateway(upstream: Upstream, tmp_path: Path) -> Iterator[Gateway]:
    # One failure opens a circuit, for longer than the test runs; no retries, so a fault
    # injected once fails the model's call.
    cfg = gateway_config(
        tmp_path,
        upstream.base_url,
        router={"circuit_breaker": {"failures": 1, "cooldown_s": 300.0}},
    )
    for m in cfg["pool"]:
        m["max_retries"] = 0
        if m["name"] in FALLBACKS:
            m["fallbacks"] = [FALLBACKS[m["name"]]]
    gw = start_gateway(tmp_path, cfg)
    yield gw
    gw.stop()


def ask(
    gw: Gateway, model: str, user: str, *, stream: bool = False, timeout: float = 30
) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Say hello to {user}."}],
        "user": user,
        "stream": stream,
    }
    return httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=timeout)


def open_circuit(gw: Gateway, upstream: Upstream) -> dict[str, Any]:
    """Fail ``KEPT_AWAY``'s one call, so its circuit opens (its fallback answers); the
    response's ``xrouter`` object."""
    upstream.fault(KEPT_AWAY, "status=500")
    r = ask(gw, KEPT_AWAY, f"opener-{secrets.token_hex(3)}")
    assert r.status_code == 200, r.text
    return dict(r.json()["xrouter"])


def logged(gw: Gateway, user: str, timeout_s: float = 10.0) -> tuple[str, int, list[dict]]:
    """The request made for ``user``: its id, status and call rows, once in the ledger."""
    db = gw.config_path.parent / "ledger.db"
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db) as conn:
            req = conn.execute(
                "SELECT request_id, status FROM requests WHERE end_user = ?", (user,)
            ).fetchone()
            rows = conn.execute(
                f"SELECT {', '.join(_CALL_COLUMNS)} FROM calls WHERE request_id = ? ORDER BY seq",
                (req[0] if req else "",),
            ).fetchall()
        if req is not None:
            return req[0], req[1], [dict(zip(_CALL_COLUMNS, r, strict=True)) for r in rows]
        assert time.monotonic() < deadline, f"no ledger row for {user}"
        time.sleep(0.05)


def give_feedback(gw: Gateway, request_id: str, score: float) -> None:
    r = httpx.post(
        f"{gw.base_url}/feedback", json={"request_id": request_id, "score": score}, timeout=30
    )
    assert r.status_code == 200, r.text


async def export(
    gw: Gateway, out: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[str, dict[str, Any]]:
    """``xrouter export`` of the gateway's ledger: its summary line, and the records by id."""
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    url = f"sqlite+aiosqlite:///{gw.config_path.parent / 'ledger.db'}"
    capsys.readouterr()
    assert await run_export(parser.parse_args(["--out", str(out)]), url) == 0
    return capsys.readouterr().out.strip(), {r.id: r for r in read_export(out)}


async def test_a_request_whose_fallbacks_failed_too_is_a_failure_only_of_a_model_called(
    gateway: Gateway,
    upstream: Upstream,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """When every fallback failed as well, the call's row names the fallback that failed
    last, with its error, and the model asked for as ``fallback_from`` (as a row a fallback
    answered does; it used to name the model asked for with the fallback's error). Only
    ``fallback_reason`` tells a model its open circuit kept away from one that was called
    and failed: the export made each such request a score-0 failure of it."""
    open_circuit(gateway, upstream)
    upstream.fault(KEPT_AWAY_FALLBACK, "status=401")  # not counted by its circuit
    r = ask(gateway, KEPT_AWAY, "kept-away")
    assert r.status_code == 502, r.text
    upstream.fault(CALLED, "status=500")
    upstream.fault(CALLED_FALLBACK, "status=401")
    r = ask(gateway, CALLED, "called")
    assert r.status_code == 502, r.text
    assert upstream.stats()["requests"][KEPT_AWAY] == 1  # only the call that opened it

    kept_id, kept_status, kept_calls = logged(gateway, "kept-away")
    called_id, called_status, called_calls = logged(gateway, "called")
    assert kept_status == called_status == 502
    # The same row but for why the call left the model asked for.
    fails = {"status": "error", "error_type": "upstream_4xx"}
    assert kept_calls == [
        {"model": KEPT_AWAY_FALLBACK, **fails, "fallback_from": KEPT_AWAY,
         "fallback_reason": "circuit_open"},
    ]  # fmt: skip
    assert called_calls == [
        {"model": CALLED_FALLBACK, **fails, "fallback_from": CALLED,
         "fallback_reason": "upstream_5xx"},
    ]  # fmt: skip

    summary, by_id = await export(gateway, tmp_path / "out.jsonl", capsys)
    assert kept_id not in by_id  # it says nothing about the model never called
    failed = by_id[called_id].outcomes[CALLED]
    assert (failed.score, (failed.model_extra or {})["failed"]) == (0.0, True)
    assert "skipped 1 requests whose chosen model was never called" in summary


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_fallback_given_up_on_in_flight_says_why_it_was_called(
    gateway: Gateway,
    upstream: Upstream,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    stream: bool,
) -> None:
    """A client that leaves while a fallback is in flight leaves a row naming the fallback
    (it has the request, and bills its prompt) with ``fallback_from``: it says why the call
    left the model asked for, as a row a fallback answered does, so the export tells a model
    its circuit kept away from one that failed."""
    open_circuit(gateway, upstream)
    upstream.fault(KEPT_AWAY_FALLBACK, SLOW)
    with pytest.raises(httpx.ReadTimeout):
        ask(gateway, KEPT_AWAY, "kept-away", stream=stream, timeout=0.5)
    upstream.fault(CALLED, "status=500")
    upstream.fault(CALLED_FALLBACK, SLOW)
    with pytest.raises(httpx.ReadTimeout):
        ask(gateway, CALLED, "called", stream=stream, timeout=0.5)

    kept_id, kept_status, kept_calls = logged(gateway, "kept-away")
    called_id, called_status, called_calls = logged(gateway, "called")
    assert kept_status == called_status == 499
    cut = {"status": "error", "error_type": "cancelled"}
    assert kept_calls == [
        {"model": KEPT_AWAY_FALLBACK, **cut, "fallback_from": KEPT_AWAY,
         "fallback_reason": "circuit_open"},
    ]  # fmt: skip
    assert called_calls == [
        {"model": CALLED_FALLBACK, **cut, "fallback_from": CALLED,
         "fallback_reason": "upstream_5xx"},
    ]  # fmt: skip

    summary, by_id = await export(gateway, tmp_path / "out.jsonl", capsys)
    assert kept_id not in by_id
    failed = by_id[called_id].outcomes[CALLED]
    assert (failed.score, (failed.model_extra or {})["error_type"]) == (0.0, "fell_back")
    assert "skipped 1 requests whose chosen model was never called" in summary


def test_the_response_says_why_a_call_fell_back(gateway: Gateway, upstream: Upstream) -> None:
    """``xrouter.calls`` lists each call's ``fallback_reason`` next to its ``fallback_from``,
    as the ledger and ``/v1/generation`` do; a call that did not fall back has neither."""
    (failed,) = open_circuit(gateway, upstream)["calls"]
    assert (failed["fallback_from"], failed["fallback_reason"]) == (KEPT_AWAY, "upstream_5xx")
    r = ask(gateway, KEPT_AWAY, "kept-away")
    (kept_away,) = r.json()["xrouter"]["calls"]
    assert (kept_away["model"], kept_away["fallback_from"], kept_away["fallback_reason"]) == (
        KEPT_AWAY_FALLBACK,
        KEPT_AWAY,
        "circuit_open",
    )
    (direct,) = ask(gateway, CALLED, "direct").json()["xrouter"]["calls"]
    assert direct["model"] == CALLED and not {"fallback_from", "fallback_reason"} & set(direct)
    # /v1/generation reads the same back from the ledger.
    generation = httpx.get(
        f"{gateway.base_url}/generation", params={"id": r.json()["id"]}, timeout=30
    ).json()["data"]
    assert [c["fallback_reason"] for c in generation["calls"]] == ["circuit_open"]
