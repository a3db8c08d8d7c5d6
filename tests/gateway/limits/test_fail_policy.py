"""FailPolicyStore: what on_store_error does when the backend is down (real unreachable Redis)."""

from __future__ import annotations

import pytest

from gateway.limits import (
    STORE_UNAVAILABLE,
    FailPolicyStore,
    KeyLimits,
    LimitStoreUnavailable,
    MemoryLimitStore,
    build_limit_store,
)
from gateway.limits.redis_store import RedisLimitStore
from gateway.settings import LimitsSettings

KEY = KeyLimits("k", budget_micros=100, budget_period="daily", rpm=1, tpm=100, max_parallel=1)


def down_store(port: int) -> RedisLimitStore:
    return RedisLimitStore(f"redis://127.0.0.1:{port}/0", key_prefix="xrtest-down")


async def test_closed_refuses_admission_but_not_bookkeeping(closed_port: int) -> None:
    events: list[str] = []
    store = FailPolicyStore(down_store(closed_port), "closed", events.append)
    try:
        with pytest.raises(LimitStoreUnavailable):
            await store.check_rate(KEY, 10)
        with pytest.raises(LimitStoreUnavailable):
            await store.reserve(KEY, None, 10, "r")
        with pytest.raises(LimitStoreUnavailable):
            await store.acquire_slot(KEY, "r")
        # the upstream already answered: settling must not turn the response into an error
        await store.settle(KEY, "r", 10, 7)
        await store.release(KEY, "r", 10)
        await store.add_tokens(KEY, 5)
        await store.release_slot(KEY, "r")
        with pytest.raises(LimitStoreUnavailable):
            await store.spent(KEY)
        assert events == [STORE_UNAVAILABLE] * 7
        assert await store.ping() is False
    finally:
        await store.aclose()


async def test_open_lets_requests_through_and_counts(closed_port: int) -> None:
    events: list[str] = []
    store = FailPolicyStore(down_store(closed_port), "open", events.append)
    try:
        rate = await store.check_rate(KEY, 10)
        assert rate.allowed and rate.headers() == {}
        assert (await store.reserve(KEY, 5, 10, "r")).ok
        assert (await store.acquire_slot(KEY, "r")).ok
        await store.settle(KEY, "r", 10, 7)
        assert events == [STORE_UNAVAILABLE] * 4
        with pytest.raises(LimitStoreUnavailable):
            await store.spent(KEY)
    finally:
        await store.aclose()


async def test_broken_event_hook_does_not_break_the_request(closed_port: int) -> None:
    def hook(event: str) -> None:
        raise RuntimeError("metrics exploded")

    store = FailPolicyStore(down_store(closed_port), "open", hook)
    try:
        assert (await store.check_rate(KEY, 1)).allowed
    finally:
        await store.aclose()


async def test_healthy_store_passes_through_without_events() -> None:
    events: list[str] = []
    store = FailPolicyStore(MemoryLimitStore(), "open", events.append)
    assert (await store.check_rate(KEY, 10, now=1000.0)).allowed
    limited = await store.check_rate(KEY, 10, now=1001.0)
    assert not limited.allowed and limited.limit == "rpm"
    assert not (await store.reserve(KEY, None, 101, "r", now=1000.0)).ok
    assert events == []


def test_invalid_mode_rejected() -> None:
    with pytest.raises(ValueError):
        FailPolicyStore(MemoryLimitStore(), "sideways")  # type: ignore[arg-type]


async def test_build_from_settings() -> None:
    store = build_limit_store(LimitsSettings(), hold_ttl_s=60)
    assert isinstance(store.inner, MemoryLimitStore) and store.on_error == "closed"
    assert store.inner.hold_ttl_s == 60
    settings = LimitsSettings(backend="redis", on_store_error="open", key_prefix="xrtest-build")
    redis_store = build_limit_store(settings)
    try:
        assert isinstance(redis_store.inner, RedisLimitStore)
        assert redis_store.on_error == "open" and redis_store.inner.key_prefix == "xrtest-build"
    finally:
        await redis_store.aclose()
