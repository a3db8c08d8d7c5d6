"""Gateway end-to-end fixtures: a replay upstream and an ``xrouter serve`` process, both
real subprocesses on loopback, shared by a module and reset between tests."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from router.outcomes import OutcomeRecord, load_outcome_table
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream

DEMO_TABLE = Path(__file__).resolve().parents[2] / "router" / "assets" / "demo_outcomes.jsonl"


@dataclass
class Upstream:
    base_url: str
    control: httpx.Client

    def fault(self, model: str, fault: str, count: int = 1) -> None:
        self.control.post(
            "/_replay/faults", json={"model": model, "fault": fault, "count": count}
        ).raise_for_status()

    def stats(self) -> dict:
        return self.control.get("/_replay/stats").json()

    def reset(self) -> None:
        self.control.delete("/_replay/faults").raise_for_status()
        self.control.post("/_replay/reset").raise_for_status()

    def abandoned_streams(self, expected: int = 1, timeout_s: float = 5.0) -> dict:
        """The upstream's stats once ``expected`` streams were abandoned (the gateway sees a
        client's hang-up and closes its call a moment later), or at ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.stats()["streams_abandoned"] < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.stats()


def longest_answer(table: list[OutcomeRecord], model: str) -> OutcomeRecord:
    """The record with ``model``'s longest recorded answer: the stream that lasts longest."""
    return max(
        (r for r in table if model in r.outcomes),
        key=lambda r: len(r.outcomes[model].response or ""),
    )


def abandon_stream(base_url: str, model: str, text: str, key: str | None = None) -> str:
    """Start a streamed request, read it up to its first chunk of answer text and hang up;
    the request id. (Hanging up after the first event alone races the gateway: that event
    carries only the role, and whether any text was relayed before the hang-up is seen
    would depend on timing.)"""
    headers = {"Authorization": f"Bearer {key}"} if key else None
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": text}]}
    with httpx.stream(
        "POST", f"{base_url}/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        assert r.status_code == 200
        request_id = r.headers["x-xrouter-request-id"]
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line.removeprefix("data: ")).get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                break
        else:
            raise AssertionError("the stream ended before any answer text")
    return request_id


def hang_up_at(base_url: str, path: str, body: dict, event: str) -> str:
    """Stream ``body`` to ``path`` and hang up at the first ``event:`` line named ``event``
    (an API's first text delta); the request id."""
    with httpx.stream("POST", f"{base_url}{path}", json=body, timeout=30) as r:
        assert r.status_code == 200
        request_id = r.headers["x-xrouter-request-id"]
        for line in r.iter_lines():
            if line == f"event: {event}":
                break
        else:
            raise AssertionError(f"the stream ended before any {event} event")
    return request_id


def ledger_rows(
    gw: Gateway, request_id: str, timeout_s: float = 5.0
) -> tuple[tuple[int, int, int], list[tuple[str, int, int, int, str | None]]]:
    """The request's ledger row (status, stream, total cost) and its calls (model, cost,
    prompt and completion tokens, error type), read from the gateway's SQLite ledger once
    the writer has flushed them."""
    db = gw.config_path.parent / "ledger.db"
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db) as conn:
            req = conn.execute(
                "SELECT status, stream, total_cost_micros FROM requests WHERE request_id = ?",
                (request_id,),
            ).fetchone()
            calls = conn.execute(
                "SELECT model, cost_micros, prompt_tokens, completion_tokens, error_type "
                "FROM calls WHERE request_id = ? ORDER BY seq",
                (request_id,),
            ).fetchall()
        if req is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert req is not None, f"no ledger row for {request_id}"
    return tuple(req), [tuple(c) for c in calls]


@pytest.fixture(scope="session")
def demo_table() -> list[OutcomeRecord]:
    return load_outcome_table(DEMO_TABLE)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    # A small per-chunk delay keeps streams in flight long enough to abandon one mid-way.
    proc, base_url = start_replay_upstream(
        tmp_path_factory.mktemp("upstream"), "--stream-chunk-delay-ms", "3"
    )
    with httpx.Client(base_url=replay_root(base_url), timeout=10) as control:
        yield Upstream(base_url, control)
    stop_replay_upstream(proc)


@pytest.fixture(scope="module")
def gateway(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("gateway")
    cfg = gateway_config(tmp, upstream.base_url, server={"max_body_bytes": 65536})
    gw = start_gateway(tmp, cfg)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def secured(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """The module's gateway with authentication on (admin key ``ADMIN_KEY``)."""
    tmp = tmp_path_factory.mktemp("secured")
    gw = start_gateway(tmp, gateway_config(tmp, upstream.base_url, auth={"enabled": True}))
    yield gw
    gw.stop()


@pytest.fixture(autouse=True)
def _clean_upstream(request: pytest.FixtureRequest) -> None:
    if "upstream" in request.fixturenames:
        request.getfixturevalue("upstream").reset()
