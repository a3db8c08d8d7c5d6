"""The answer cache as the chat service drives it: tickets, the request's controls, sizes,
metrics (a fresh registry per test) and a failing backend that is backed off."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.cache import AnswerCache, CachedAnswer, MemoryBackend, RedisBackend, service
from gateway.metrics import GatewayMetrics
from gateway.schemas import CacheControls
from gateway.settings import CacheSettings

DATA: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def answer(text: str = "hello", created_at: float | None = None) -> CachedAnswer:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
    }
    return CachedAnswer("req-1", created_at or time.time(), "m", [choice], {}, 1_000)


def make(**settings: Any) -> tuple[AnswerCache, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, models=["m"], policies=["passthrough"])
    s = CacheSettings(enabled=True, **settings)
    return AnswerCache(s, MemoryBackend(s.max_entries, s.max_bytes), metrics), registry


def ticket(cache: AnswerCache, controls: CacheControls | None = None, key_id: str = "k") -> Any:
    return cache.ticket(
        DATA, key_id=key_id, policy="passthrough", checkpoint=None, controls=controls
    )


async def settle() -> None:
    await asyncio.sleep(0.01)  # stores run in the background


def lookups(registry: CollectorRegistry, result: str) -> float:
    return registry.get_sample_value("xrouter_cache_lookups_total", {"result": result}) or 0.0


async def test_an_answer_stored_is_found_by_the_same_question_only() -> None:
    cache, registry = make()
    t = ticket(cache)
    assert await cache.lookup(t) is None and t.result == "miss"
    stored = answer()
    cache.store(t, stored)
    await settle()
    again = ticket(cache)
    assert await cache.lookup(again) == stored and again.result == "hit"
    assert await cache.lookup(ticket(cache, key_id="other")) is None  # scope: per key
    assert (lookups(registry, "hit"), lookups(registry, "miss")) == (1, 2)
    assert registry.get_sample_value("xrouter_cache_stores_total", {"result": "stored"}) == 1


async def test_global_scope_shares_answers_between_keys() -> None:
    cache, _ = make(scope="global")
    cache.store(ticket(cache, key_id="a"), answer())
    await settle()
    assert await cache.lookup(ticket(cache, key_id="b")) is not None


async def test_the_request_s_controls() -> None:
    cache, registry = make(ttl_s=60)
    t = ticket(cache, CacheControls(no_store=True))
    cache.store(t, answer())
    await settle()
    assert await cache.lookup(ticket(cache)) is None  # nothing was stored

    cache.store(ticket(cache), answer("old"))
    await settle()
    t = ticket(cache, CacheControls(no_cache=True))
    assert await cache.lookup(t) is None and t.result == "bypass"
    cache.store(t, answer("fresh"))  # a bypassing request still refreshes the entry
    await settle()
    found = await cache.lookup(ticket(cache))
    assert found is not None and found.message["content"] == "fresh"
    assert lookups(registry, "bypass") == 1

    # max_age_s: only answers younger than that.
    cache.store(ticket(cache, CacheControls(no_cache=True)), answer(created_at=time.time() - 30))
    await settle()
    assert await cache.lookup(ticket(cache, CacheControls(max_age_s=60))) is not None
    assert await cache.lookup(ticket(cache, CacheControls(max_age_s=10))) is None


async def test_a_client_ttl_shortens_the_configured_one_never_lengthens_it() -> None:
    cache, _ = make(ttl_s=0.05)
    cache.store(ticket(cache, CacheControls(ttl_s=3600)), answer())
    await settle()
    assert await cache.lookup(ticket(cache)) is not None
    await asyncio.sleep(0.06)
    assert await cache.lookup(ticket(cache)) is None

    cache, _ = make(ttl_s=60)
    cache.store(ticket(cache, CacheControls(ttl_s=0.03)), answer())
    await settle()
    await asyncio.sleep(0.04)
    assert await cache.lookup(ticket(cache)) is None


async def test_an_answer_larger_than_max_entry_bytes_is_not_stored() -> None:
    cache, registry = make(max_entry_bytes=1024)
    cache.store(ticket(cache), answer("x" * 2000))
    await settle()
    assert await cache.lookup(ticket(cache)) is None
    assert registry.get_sample_value("xrouter_cache_stores_total", {"result": "too_large"}) == 1


async def test_a_failing_backend_is_backed_off(
    monkeypatch: pytest.MonkeyPatch, silent_redis_url: str
) -> None:
    """One lookup pays the timeout; the next ones skip the backend until the backoff ends."""
    monkeypatch.setattr(service, "_BACKOFF_S", 0.3)
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, models=["m"], policies=["passthrough"])
    s = CacheSettings(enabled=True, backend="redis", timeout_ms=100)
    backend = RedisBackend(silent_redis_url, prefix="x", timeout_s=0.1)
    cache = AnswerCache(s, backend, metrics)
    try:

        async def timed() -> float:
            t0 = time.perf_counter()
            t = ticket(cache)
            assert await cache.lookup(t) is None and t.result == "error"
            return time.perf_counter() - t0

        assert await timed() >= 0.09
        assert await timed() < 0.02  # backed off: the backend is not asked
        cache.store(ticket(cache), answer())  # nor for stores
        assert registry.get_sample_value("xrouter_cache_stores_total", {"result": "error"}) == 1
        await asyncio.sleep(0.35)
        assert await timed() >= 0.09  # the backoff is over: asked (and failing) again
        assert lookups(registry, "error") == 3
    finally:
        await cache.aclose()


async def test_an_answer_the_caller_rejects_is_a_miss() -> None:
    cache, registry = make()
    cache.store(ticket(cache), answer())
    await settle()
    t = ticket(cache)
    assert await cache.lookup(t, lambda a: a.model != "m") is None and t.result == "miss"
    assert await cache.lookup(ticket(cache), lambda a: True) is not None
    assert (lookups(registry, "miss"), lookups(registry, "hit")) == (1, 1)
