"""Circuit breakers in the gateway: a model whose upstream keeps failing is left out of
routing (no more calls, no more waiting on it) until a probe after the cooldown finds it
healthy; the state is a metric."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.redis_server import PrivateRedis

CHEAPEST = "llama-3.2-3b-instruct"  # the demo pool's cheapest model
REDIS_DB14 = "redis://127.0.0.1:6379/14"


@pytest.fixture
def gateway(upstream: Upstream, tmp_path: Path) -> Iterator[Gateway]:
    # The cooldown outlasts what a test checks while the circuit is open, on a loaded machine
    # too (at 1 s a slow run saw it run out mid-test, and its asks probed the model).
    cfg = gateway_config(
        tmp_path, upstream.base_url, router={"circuit_breaker": {"failures": 2, "cooldown_s": 4.0}}
    )
    gw = start_gateway(tmp_path, cfg)
    yield gw
    gw.stop()


def ask(gw: Gateway) -> httpx.Response:
    return httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "xrouter/cheapest", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )


def circuit_gauge(gw: Gateway, model: str) -> float | None:
    for line in httpx.get(f"{gw.url}/metrics").text.splitlines():
        if line.startswith(f'xrouter_circuit_open{{model="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def circuits(gw: Gateway) -> tuple[int, dict[str, str]]:
    """The answering worker's pid and the circuits it has not closed."""
    state = httpx.get(f"{gw.url}/admin/router", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    return state.json()["worker"], state.json()["circuits"]


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def shared_config(
    path: Path, upstream: Upstream, prefix: str, cooldown_s: float = 1.0
) -> dict[str, Any]:
    """Circuits shared through Redis (the tests' database 14, keys under ``prefix``)."""
    return gateway_config(
        path,
        upstream.base_url,
        router={
            "circuit_breaker": {"failures": 2, "cooldown_s": cooldown_s, "sync_interval_s": 0.1}
        },
        limits={"backend": "redis", "redis_url": REDIS_DB14, "key_prefix": prefix},
    )


def test_a_failing_model_is_routed_around_until_a_probe_finds_it_healthy(
    gateway: Gateway, upstream: Upstream
) -> None:
    upstream.fault(CHEAPEST, "status=500", count=1000)
    # Its two attempts (one retry) fail and the loop's next turn asks the next cheapest
    # model; the circuit is now open.
    first = ask(gateway)
    assert first.status_code == 200
    calls = [(c["model"], c["status"]) for c in first.json()["xrouter"]["calls"]]
    assert calls[0] == (CHEAPEST, "error") and calls[1][1] == "ok"
    # The failed call says what it took: both attempts, and their time (not overhead).
    assert first.json()["xrouter"]["calls"][0]["latency_ms"] > 0
    logged = httpx.get(f"{gateway.base_url}/generation", params={"id": first.json()["id"]})
    assert logged.json()["data"]["calls"][0]["attempts"] == 2, logged.text
    assert upstream.stats()["requests"][CHEAPEST] == 2
    assert circuit_gauge(gateway, CHEAPEST) == 1.0
    # Now routing leaves it out: the cheapest healthy model answers on the first turn, and
    # the failing one is not called at all.
    calls_before = upstream.stats()["requests"][CHEAPEST]
    for _ in range(3):
        r = ask(gateway)
        assert r.status_code == 200, r.text
        assert r.json()["model"] != CHEAPEST
        assert [c["model"] for c in r.json()["xrouter"]["calls"]] == [r.json()["model"]]
    assert upstream.stats()["requests"][CHEAPEST] == calls_before
    # A pass-through to it fails at once with a 503 (no fallbacks configured).
    direct = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": CHEAPEST, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert direct.status_code == 503 and direct.json()["error"]["code"] == "upstream_unavailable"
    assert upstream.stats()["requests"][CHEAPEST] == calls_before
    # Operators see it: the admin API and the dashboard name the open circuit.
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    state = httpx.get(f"{gateway.url}/admin/router", headers=admin).json()
    assert state["circuits"] == {CHEAPEST: "open"}
    page = httpx.get(f"{gateway.url}/dashboard", headers=admin).text
    assert f"<td>{CHEAPEST}</td>" in page and "<td>open</td>" in page
    # It recovers; after the cooldown one request probes it, and it is back in the pool.
    upstream.reset()
    wait_for("the cooldown never ran out", lambda: circuits(gateway)[1] == {CHEAPEST: "half_open"})
    probe = ask(gateway)
    assert probe.status_code == 200 and probe.json()["model"] == CHEAPEST
    assert circuit_gauge(gateway, CHEAPEST) == 0.0
    assert ask(gateway).json()["model"] == CHEAPEST
    assert httpx.get(f"{gateway.url}/admin/router", headers=admin).json()["circuits"] == {}


@pytest.mark.redis
def test_replicas_share_an_opening_through_redis(upstream: Upstream, tmp_path: Path) -> None:
    """Two gateways (replicas, or workers: the same sharing) on one Redis: the failures one
    of them sees open the circuit in both, so the other never calls the dead model."""
    prefix = f"xrtest-circuits-{uuid.uuid4().hex[:8]}"
    gateways = []
    for name in ("a", "b"):
        cfg = gateway_config(
            tmp_path / name,
            upstream.base_url,
            router={"circuit_breaker": {"failures": 2, "cooldown_s": 30.0, "sync_interval_s": 0.1}},
            limits={
                "backend": "redis",
                "redis_url": "redis://127.0.0.1:6379/0",
                "key_prefix": prefix,
            },
        )
        (tmp_path / name).mkdir()
        gateways.append(start_gateway(tmp_path / name, cfg))
    a, b = gateways
    try:
        upstream.fault(CHEAPEST, "status=500", count=1000)
        assert ask(a).status_code == 200  # two failed attempts in a, then the next model
        assert upstream.stats()["requests"][CHEAPEST] == 2
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        deadline = time.monotonic() + 5
        while httpx.get(f"{b.url}/admin/router", headers=admin).json()["circuits"] != {
            CHEAPEST: "open"
        }:
            assert time.monotonic() < deadline, "b never adopted a's opening"
            time.sleep(0.05)
        assert circuit_gauge(b, CHEAPEST) == 1.0
        # b has never called the model itself, yet routes around it from its first request.
        for _ in range(3):
            r = ask(b)
            assert r.status_code == 200 and r.json()["model"] != CHEAPEST
        assert upstream.stats()["requests"][CHEAPEST] == 2
        assert redis.Redis().exists(f"{prefix}:circuit:{CHEAPEST}")
    finally:
        for gw in gateways:
            gw.stop()
        redis.Redis().delete(f"{prefix}:circuit:{CHEAPEST}")


def test_a_circuit_whose_cooldown_ran_out_unasked_is_not_reported_open(
    gateway: Gateway, upstream: Upstream
) -> None:
    """xrouter_circuit_open says whether calls are kept away from a model. Once the cooldown
    has run out the next call goes through (the probe), so a model no request has named
    since reads 0, not 1 until some request happens by (an alert on the gauge used to fire
    on a model nothing kept away, or that had recovered). Still failing, it is kept away
    again as soon as a request probes it."""
    upstream.fault(CHEAPEST, "status=500", count=1000)
    assert ask(gateway).status_code == 200
    assert circuit_gauge(gateway, CHEAPEST) == 1.0
    wait_for("the gauge still says open", lambda: circuit_gauge(gateway, CHEAPEST) == 0.0)
    assert circuits(gateway)[1] == {CHEAPEST: "half_open"}
    calls_before = upstream.stats()["requests"][CHEAPEST]
    r = ask(gateway)  # the probe fails, a fallback answers
    assert r.status_code == 200 and r.json()["model"] != CHEAPEST
    assert upstream.stats()["requests"][CHEAPEST] > calls_before
    assert circuit_gauge(gateway, CHEAPEST) == 1.0
    assert circuits(gateway)[1] == {CHEAPEST: "open"}


@pytest.mark.redis
def test_a_probe_answered_in_one_replica_closes_the_circuit_in_the_other(
    upstream: Upstream, tmp_path: Path
) -> None:
    """b opens the circuit, a adopts it; after the cooldown b's probe is answered. a, which
    has not called the model since, closes too within a sync: it used to keep the model
    half-open (one call at a time let through) and open on its gauge until a request of its
    own probed it, since the opening's key had expired with the cooldown before the probe."""
    prefix = f"xrtest-h11-circuits-{uuid.uuid4().hex[:8]}"
    key = f"{prefix}:circuit:{CHEAPEST}"
    gateways = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            gateways.append(
                start_gateway(
                    tmp_path / name,
                    shared_config(tmp_path / name, upstream, prefix, cooldown_s=3.0),
                )
            )
        a, b = gateways
        upstream.fault(CHEAPEST, "status=500", count=2)  # the two attempts that open it
        assert ask(b).status_code == 200
        wait_for("a never adopted b's opening", lambda: circuits(a)[1] == {CHEAPEST: "open"})
        assert circuit_gauge(a, CHEAPEST) == 1.0
        half_open = {CHEAPEST: "half_open"}  # the cooldown is over in both
        wait_for("a's cooldown never ran out", lambda: circuits(a)[1] == half_open)
        wait_for("b's cooldown never ran out", lambda: circuits(b)[1] == half_open)
        probe = ask(b)
        assert probe.status_code == 200 and probe.json()["model"] == CHEAPEST
        assert circuits(b)[1] == {}
        wait_for("a never heard of b's closing", lambda: circuits(a)[1] == {})
        assert circuit_gauge(a, CHEAPEST) == 0.0
        shared = redis.Redis.from_url(REDIS_DB14).get(key)  # the closing, for late readers
        assert isinstance(shared, bytes) and shared.startswith(b"closed:")
        calls = upstream.stats()["requests"][CHEAPEST]
        assert ask(a).json()["model"] == CHEAPEST
        assert upstream.stats()["requests"][CHEAPEST] == calls + 1
    finally:
        for gw in gateways:
            gw.stop()
        redis.Redis.from_url(REDIS_DB14).delete(key)


@pytest.mark.redis
def test_with_several_workers_the_gauge_clears_in_every_worker(
    upstream: Upstream, tmp_path: Path
) -> None:
    """Two workers, the circuit open in both (one opened it, the other adopted it): the
    gauge is the max over the live workers, so each must report the end of the cooldown
    on its own, traffic or not."""
    prefix = f"xrtest-h11-circuits-{uuid.uuid4().hex[:8]}"
    cfg = shared_config(tmp_path, upstream, prefix, cooldown_s=3.0)
    gw = start_gateway(tmp_path, cfg, workers=2)
    try:
        wait_for("a worker never started", lambda: gw.log().count("startup complete") == 2)
        upstream.fault(CHEAPEST, "status=500", count=1000)
        assert ask(gw).status_code == 200
        wait_for(
            "the other worker never adopted the opening",
            lambda: "opened: another worker saw it failing" in gw.log(),
        )
        assert circuit_gauge(gw, CHEAPEST) == 1.0
        wait_for("the gauge still says open", lambda: circuit_gauge(gw, CHEAPEST) == 0.0)
    finally:
        gw.stop()
        redis.Redis.from_url(REDIS_DB14).delete(f"{prefix}:circuit:{CHEAPEST}")


@pytest.mark.redis
def test_when_redis_goes_away_each_gateway_keeps_its_own_breakers(
    upstream: Upstream, tmp_path: Path
) -> None:
    server = PrivateRedis()
    try:
        cfg = gateway_config(
            tmp_path,
            upstream.base_url,
            router={"circuit_breaker": {"failures": 2, "cooldown_s": 30.0, "sync_interval_s": 0.1}},
            # Limits fail open, so requests still go through once Redis is gone.
            limits={
                "backend": "redis",
                "redis_url": server.url,
                "on_store_error": "open",
            },
        )
        gw = start_gateway(tmp_path, cfg)
    finally:
        server.stop()
    try:
        upstream.fault(CHEAPEST, "status=500", count=1000)
        assert ask(gw).status_code == 200
        r = ask(gw)
        assert r.status_code == 200 and r.json()["model"] != CHEAPEST
        assert upstream.stats()["requests"][CHEAPEST] == 2
        deadline = time.monotonic() + 5
        while "cannot share circuit breaker state through Redis" not in gw.log():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "Traceback" not in gw.log()
    finally:
        gw.stop()


def test_streams_cut_mid_answer_open_the_circuit(gateway: Gateway, upstream: Upstream) -> None:
    """Every stream of the model breaks off mid-answer: each ends in an error event (its
    text already reached the client, so no retry), and each is a failed attempt, so the
    circuit opens after two. Success used to be booked at the first chunk, so a model
    cutting every answer short was never routed around."""
    upstream.fault(CHEAPEST, "cut-stream=2", count=1000)
    body = {"model": CHEAPEST, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        with httpx.stream(
            "POST", f"{gateway.base_url}/chat/completions", json=body, timeout=30
        ) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line.startswith("data: {")]
        assert '"error"' in events[-1] and any('"content"' in e for e in events[:-1])
    assert upstream.stats()["requests"][CHEAPEST] == 2
    assert circuit_gauge(gateway, CHEAPEST) == 1.0
    direct = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=30)
    assert direct.status_code == 503 and direct.json()["error"]["code"] == "upstream_unavailable"
    assert upstream.stats()["requests"][CHEAPEST] == 2
