"""Which deployment a call goes to: least busy first, ties rotated, failures cooled down."""

from __future__ import annotations

from collections import Counter

from pricing import load_default_catalog
from router.pool import ModelPool, PoolModel, PoolModelConfig
from router.providers.balance import DeploymentBalancer

MODEL = "gemma-2-9b-it"


def model(*names: str, concurrency: dict[str, int] | None = None) -> PoolModel:
    deployments = [
        {"api_base": f"http://{n}/v1", "name": n, "max_concurrency": (concurrency or {}).get(n)}
        for n in names
    ]
    cfg = PoolModelConfig.model_validate(
        {"name": MODEL, "model": f"openai/{MODEL}", "deployments": deployments}
    )
    return ModelPool.from_configs([cfg], load_default_catalog())[MODEL]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_pool_spreads_calls_evenly() -> None:
    b = DeploymentBalancer()
    m = model("a", "b", "c")
    picks = Counter(b.pick(m).deployment for _ in range(300))
    assert picks == {"a": 100, "b": 100, "c": 100}


def test_the_least_busy_deployment_goes_first_relative_to_its_capacity() -> None:
    b = DeploymentBalancer()
    m = model("small", "big", concurrency={"small": 2, "big": 8})
    held = []
    for _ in range(10):  # ten calls in flight at once
        t = b.pick(m)
        b.started(t)
        held.append(t.deployment)
    # Filled in proportion to capacity: 2 of 10 to small, 8 to big.
    assert Counter(held) == {"small": 2, "big": 8}
    for name in held:
        b.finished(next(t for t in m.targets if t.deployment == name))
    assert Counter(b.pick(m).deployment for _ in range(10)) == {"small": 5, "big": 5}


def test_a_failed_deployment_cools_down_and_comes_back() -> None:
    clock = Clock()
    b = DeploymentBalancer(cooldown_s=5.0, clock=clock)
    m = model("a", "b")
    a = next(t for t in m.targets if t.deployment == "a")
    b.failed(a)
    assert {b.pick(m).deployment for _ in range(20)} == {"b"}
    assert b.cooling() == {MODEL: ["a"]}
    clock.now += 5.0
    assert {b.pick(m).deployment for _ in range(20)} == {"a", "b"}
    assert b.cooling() == {}
    # Every deployment cooling: the one whose cooldown ends first.
    b.failed(a)
    clock.now += 1
    b.failed(next(t for t in m.targets if t.deployment == "b"))
    assert b.pick(m).deployment == "a"
    b.succeeded(a)  # a success ends the cooldown at once
    assert b.cooling() == {MODEL: ["b"]}


def test_a_retry_goes_to_a_deployment_not_tried_yet() -> None:
    b = DeploymentBalancer()
    m = model("a", "b", "c")
    assert b.pick(m, tried={"a", "b"}).deployment == "c"
    # All tried: any of them again (the call's retries outnumber the deployments).
    assert b.pick(m, tried={"a", "b", "c"}).deployment in {"a", "b", "c"}


def test_a_single_deployment_model_is_called_as_itself() -> None:
    cfg = PoolModelConfig(name=MODEL, model=f"openai/{MODEL}", api_base="http://x/v1")
    m = ModelPool.from_configs([cfg], load_default_catalog())[MODEL]
    b = DeploymentBalancer()
    assert b.pick(m) is m and b.pick(m, tried={None}) is m
    b.failed(m)  # nothing to cool down: the model's circuit breaker handles it
    assert b.cooling() == {}


def test_a_deployment_the_call_gave_up_on_is_not_picked_again() -> None:
    clock = Clock()
    b = DeploymentBalancer(cooldown_s=5.0, clock=clock)
    m = model("a", "b")
    a, bb = m.targets
    b.failed(a)
    clock.now += 1
    b.failed(bb)
    # Both tried and cooling: "a"'s cooldown ends first, but the call gave up on it (its key
    # was refused), so the retry goes to "b".
    assert b.pick(m, tried={"a", "b"}).deployment == "a"
    assert b.pick(m, tried={"a", "b"}, skip={"a"}).deployment == "b"
    assert b.pick(m, tried={"a"}, skip={"a"}).deployment == "b"
    # Given up on every one: any of them (the caller stops before asking).
    assert b.pick(m, tried={"a", "b"}, skip={"a", "b"}).deployment in {"a", "b"}


def test_a_deployment_cools_down_as_long_as_its_retry_after_asked() -> None:
    clock = Clock()
    b = DeploymentBalancer(cooldown_s=5.0, clock=clock)
    m = model("a", "b")
    a = m.targets[0]
    b.failed(a, wait_s=30.0)
    clock.now += 20
    assert b.cooling() == {MODEL: ["a"]}
    clock.now += 10
    assert b.cooling() == {}
    b.failed(a, wait_s=1.0)  # never shorter than the cooldown
    clock.now += 4
    assert b.cooling() == {MODEL: ["a"]}
