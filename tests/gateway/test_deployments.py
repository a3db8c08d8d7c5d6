"""A pool model served in two places: two real replay upstreams behind one pool entry, the
gateway spreading calls between them and carrying on when one fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream

MODEL = "gemma-2-9b-it"
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Upstream]]:
    started = {}
    for name in ("a", "b"):
        proc, base = start_replay_upstream(tmp_path_factory.mktemp(f"replica-{name}"))
        started[name] = (proc, base, httpx.Client(base_url=replay_root(base), timeout=10))
    yield {name: Upstream(base, control) for name, (_, base, control) in started.items()}
    for proc, _, control in started.values():
        control.close()
        stop_replay_upstream(proc)


@pytest.fixture(scope="module")
def gw(
    replicas: dict[str, Upstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("deployments")
    cfg = gateway_config(tmp, replicas["a"].base_url)
    for entry in cfg["pool"]:
        if entry["name"] == MODEL:
            del entry["api_base"]
            entry["max_retries"] = 0  # the other deployment is still tried: one per deployment
            entry["deployments"] = [
                {"api_base": replicas[n].base_url, "name": n} for n in ("a", "b")
            ]
    # Long enough that a failed deployment stays out for the rest of a test.
    cfg["router"]["deployment_cooldown_s"] = 60
    g = start_gateway(tmp, cfg)
    yield g
    g.stop()


@pytest.fixture(autouse=True)
def _reset(replicas: dict[str, Upstream]) -> None:
    for r in replicas.values():
        r.reset()


def served(replicas: dict[str, Upstream]) -> dict[str, int]:
    return {n: int(r.stats()["requests"].get(MODEL, 0)) for n, r in replicas.items()}


def metric(gw: Gateway, deployment: str, outcome: str) -> float:
    for line in httpx.get(f"{gw.url}/metrics").text.splitlines():
        if line.startswith("xrouter_deployment_calls_total{") and (
            f'deployment="{deployment}"' in line and f'outcome="{outcome}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_calls_spread_over_the_deployments(gw: Gateway, replicas: dict[str, Upstream]) -> None:
    c = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    answers = {
        c.chat.completions.create(model=MODEL, messages=QUESTION).choices[0].message.content
        for _ in range(20)
    }
    assert len(answers) == 1  # the same model, wherever it runs
    assert served(replicas) == {"a": 10, "b": 10}  # one at a time: they take turns
    assert metric(gw, "a", "ok") == metric(gw, "b", "ok") == 10


def test_a_failing_deployment_is_retried_elsewhere_and_left_alone(
    gw: Gateway, replicas: dict[str, Upstream]
) -> None:
    replicas["a"].fault(MODEL, "status=503", count=100)
    c = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    attempts, where = [], []
    for _ in range(12):
        r = c.chat.completions.create(model=MODEL, messages=QUESTION)
        logged = httpx.get(f"{gw.base_url}/generation", params={"id": r.id}).json()["data"]
        attempts.append(logged["calls"][0]["attempts"])
        # The ledger and the response both say which deployment served the call.
        where.append(logged["calls"][0]["deployment"])
        assert (r.model_extra or {})["xrouter"]["calls"][0]["deployment"] == where[-1]
    assert set(where) == {"b"}
    # At most one call met the failing deployment (its retry went to the other, at once);
    # after that it cooled down and every call went straight to the healthy one.
    assert served(replicas)["a"] <= 1 and served(replicas)["b"] == 12
    assert sorted(attempts)[-1] <= 2 and attempts.count(1) >= 11
    assert metric(gw, "a", "error") <= 1
    state = httpx.get(
        f"{gw.url}/admin/router", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ).json()
    assert state["deployments_cooling"] == {MODEL: ["a"]}

    # Streams too: a deployment that drops the connection is passed over before the first
    # token. a is healthy again but still cooling down, so b is called first, drops the
    # connection, and the stream comes from a.
    replicas["a"].reset()
    replicas["b"].fault(MODEL, "drop", count=1)
    chunks = list(c.chat.completions.create(model=MODEL, messages=QUESTION, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text and chunks[-1].usage is not None
    assert served(replicas) == {"a": 1, "b": 12 + 1}  # a was reset; b dropped one


# Bug: a 503 on one deployment then a 401 on the other was answered with x-should-retry:
# false, the 401's, so the SDKs never asked again though the first deployment may recover.
# (Last in the module: it leaves both deployments cooling down.)
def test_a_refusal_after_another_deployments_trouble_may_be_retried(
    gw: Gateway, replicas: dict[str, Upstream]
) -> None:
    messages = []
    # Which deployment is called first is the balancer's; the second request calls them in
    # the same order (the first one tried cooled down first), so one of the two ends on
    # the refusal, after the other deployment's 503.
    for refusing, failing in (("a", "b"), ("b", "a")):
        replicas[refusing].fault(MODEL, "status=401", count=1)
        replicas[failing].fault(MODEL, "status=503", count=1)
        r = httpx.post(
            f"{gw.base_url}/chat/completions",
            json={"model": MODEL, "messages": QUESTION},
            timeout=30,
        )
        assert r.status_code == 502, r.text
        assert "x-should-retry" not in r.headers
        messages.append(r.json()["error"]["message"])
    assert served(replicas) == {"a": 2, "b": 2}
    assert sum("401" in m for m in messages) == 1 and sum("503" in m for m in messages) == 1
