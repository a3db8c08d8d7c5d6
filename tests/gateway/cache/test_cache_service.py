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
    # Not coalescing: each miss below would wait coalesce_wait_s for the first, which leads.
    cache, registry = make(ttl_s=60, coalesce_wait_s=0)
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
    # TTLs of tenths of a second, not hundredths: a loaded machine's stall must not age
    # the entry out before the first lookup.
    cache, _ = make(ttl_s=0.5)
    cache.store(ticket(cache, CacheControls(ttl_s=3600)), answer())
    await settle()
    assert await cache.lookup(ticket(cache)) is not None
    await asyncio.sleep(0.6)
    assert await cache.lookup(ticket(cache)) is None

    cache, _ = make(ttl_s=60)
    cache.store(ticket(cache, CacheControls(ttl_s=0.3)), answer())
    await settle()
    await asyncio.sleep(0.4)
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
    # A timeout of half a second, so that "not asked" (well under it) and "asked" (all of
    # it) stay apart through a loaded machine's stalls.
    monkeypatch.setattr(service, "_BACKOFF_S", 1.5)
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, models=["m"], policies=["passthrough"])
    s = CacheSettings(enabled=True, backend="redis", timeout_ms=500)
    backend = RedisBackend(silent_redis_url, prefix="x", timeout_s=0.5)
    cache = AnswerCache(s, backend, metrics)
    try:

        async def timed() -> float:
            t0 = time.perf_counter()
            t = ticket(cache)
            assert await cache.lookup(t) is None and t.result == "error"
            elapsed = time.perf_counter() - t0
            t.end()  # the request is over (else the next one would wait for its answer)
            return elapsed

        assert await timed() >= 0.45
        assert await timed() < 0.3  # backed off: the backend is not asked
        cache.store(ticket(cache), answer())  # nor for stores
        assert registry.get_sample_value("xrouter_cache_stores_total", {"result": "error"}) == 1
        await asyncio.sleep(1.6)
        assert await timed() >= 0.45  # the backoff is over: asked (and failing) again
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


# Coalescing: identical requests that arrive together share the first one's answer.


async def test_identical_requests_in_flight_wait_for_the_first_one_s_answer() -> None:
    cache, registry = make()
    leader = ticket(cache)
    assert await cache.lookup(leader) is None and leader.result == "miss"
    followers = [ticket(cache) for _ in range(3)]
    waiting = [asyncio.create_task(cache.lookup(t)) for t in followers]
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiting)  # they wait rather than route

    cache.store(leader, answer("bought once"))
    found = await asyncio.gather(*waiting)
    assert [a.choices[0]["message"]["content"] for a in found if a] == ["bought once"] * 3
    assert {t.result for t in followers} == {"coalesced"}
    assert (lookups(registry, "coalesced"), lookups(registry, "miss")) == (3, 1)
    leader.end()  # after its answer was handed over: changes nothing
    # A follower's answer is not stored again; later requests are plain hits.
    await settle()
    later = ticket(cache)
    assert await cache.lookup(later) is not None and later.result == "hit"
    await cache.aclose()


async def test_a_leader_without_an_answer_to_share_releases_its_followers() -> None:
    cache, registry = make()
    leader = ticket(cache)
    await cache.lookup(leader)
    follower = ticket(cache)
    waiting = asyncio.create_task(cache.lookup(follower))
    await asyncio.sleep(0.01)
    leader.end()  # an error, a fallback, a client that hung up: nothing stored
    assert await waiting is None and follower.result == "miss"
    assert follower.flight is None  # it routes for itself, leading no one
    # The flight is over: the next identical request leads a new one.
    nxt = ticket(cache)
    assert await cache.lookup(nxt) is None and nxt.flight is not None
    assert lookups(registry, "coalesced") == 0
    await cache.aclose()


async def test_a_leader_whose_client_left_hands_the_lead_to_one_follower() -> None:
    """Its client hung up (a timeout, then a retry): one follower buys the answer, the others
    wait for that one instead of all buying it at once."""
    cache, registry = make()
    leader = ticket(cache)
    await cache.lookup(leader)
    followers = [ticket(cache) for _ in range(3)]
    waiting = [asyncio.create_task(cache.lookup(t)) for t in followers]
    await asyncio.sleep(0.01)
    leader.end(client_left=True)
    await asyncio.sleep(0.01)
    done = [w for w in waiting if w.done()]
    assert len(done) == 1 and await done[0] is None  # the new leader routes
    (heir,) = [t for t, w in zip(followers, waiting, strict=True) if w.done()]
    assert heir.result == "miss" and heir.flight is not None
    cache.store(heir, answer("bought by the heir"))
    rest = [await w for w in waiting if w is not done[0]]
    assert [a.choices[0]["message"]["content"] for a in rest if a] == ["bought by the heir"] * 2
    assert (lookups(registry, "coalesced"), lookups(registry, "miss")) == (2, 2)
    await cache.aclose()

    # A follower that may not lead (its answer would not be stored) waits for the heir
    # too; when the heir's client leaves as well and no one is left who may lead, it
    # routes for itself.
    cache, _ = make()
    leader = ticket(cache)
    await cache.lookup(leader)
    streamed = ticket(cache)
    follower = asyncio.create_task(cache.lookup(streamed, may_lead=False))
    await asyncio.sleep(0.01)
    heir = ticket(cache)
    inheriting = asyncio.create_task(cache.lookup(heir))
    await asyncio.sleep(0.01)
    leader.end(client_left=True)
    assert await inheriting is None and heir.flight is not None
    await asyncio.sleep(0.01)
    assert not follower.done()
    heir.end(client_left=True)
    assert await follower is None and streamed.flight is None
    await cache.aclose()


async def test_a_follower_finds_the_answer_of_an_heir_that_already_landed() -> None:
    cache, _ = make()
    leader = ticket(cache)
    await cache.lookup(leader)
    heir, follower = ticket(cache), ticket(cache)
    inheriting = asyncio.create_task(cache.lookup(heir))
    await asyncio.sleep(0.01)
    waiting = asyncio.create_task(cache.lookup(follower))
    await asyncio.sleep(0.01)
    # The lead passes and the heir's answer lands before the follower wakes up: it is
    # served that answer, not sent to buy another.
    leader.end(client_left=True)
    assert heir.flight is not None
    cache.store(heir, answer("the heir's"))
    found = await waiting
    assert found is not None and found.choices[0]["message"]["content"] == "the heir's"
    assert follower.result == "coalesced" and follower.flight is None
    await inheriting
    await cache.aclose()


async def test_a_hand_off_never_stretches_a_follower_s_wait() -> None:
    cache, _ = make(coalesce_wait_s=10)
    leader = ticket(cache)
    await cache.lookup(leader)
    heir = ticket(cache)
    inheriting = asyncio.create_task(cache.lookup(heir))
    await asyncio.sleep(0.01)
    t0 = time.monotonic()
    patient = ticket(cache)
    waiting = asyncio.create_task(cache.lookup(patient, max_wait_s=0.3))
    await asyncio.sleep(0.2)  # a wait stretched by the hand-off would end at 0.5 s
    leader.end(client_left=True)
    assert await inheriting is None and heir.flight is not None
    # ``patient`` now waits for the heir's answer, until 0.3 s after it arrived — not 0.3 s
    # after the hand-off, nor the heir's own 10 s.
    assert await waiting is None and patient.result == "miss"
    assert 0.29 <= time.monotonic() - t0 < 0.45
    heir.end()
    await cache.aclose()


async def test_a_follower_waits_at_most_coalesce_wait_s_and_a_stale_leader_is_replaced() -> None:
    cache, _ = make(coalesce_wait_s=0.3)
    stuck = ticket(cache)
    await cache.lookup(stuck)  # leads, and never ends
    t0 = time.monotonic()
    follower = ticket(cache)
    assert await cache.lookup(follower) is None and follower.result == "miss"
    assert 0.29 <= time.monotonic() - t0 < 2.0
    # Past the wait, the stuck leader no longer holds anyone up: a new request leads.
    nxt = ticket(cache)
    t0 = time.monotonic()
    assert await cache.lookup(nxt) is None and nxt.flight is not None
    assert time.monotonic() - t0 < 0.2  # not another 0.3 s wait
    stuck.end()  # the old flight ending does not end the new one
    waiting = asyncio.create_task(cache.lookup(ticket(cache)))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    cache.store(nxt, answer())
    assert await waiting is not None
    await cache.aclose()


async def test_who_does_not_lead() -> None:
    cache, _ = make()
    # A request whose answer will not be stored keeps no one waiting.
    for t, may_lead in (
        (ticket(cache, CacheControls(no_store=True)), True),
        (ticket(cache), False),
    ):
        assert await cache.lookup(t, may_lead=may_lead) is None and t.flight is None
    # A request that bypasses the cache neither leads nor follows.
    leader = ticket(cache)
    await cache.lookup(leader)
    bypass = ticket(cache, CacheControls(no_cache=True))
    assert await asyncio.wait_for(cache.lookup(bypass), 1.0) is None
    assert bypass.result == "bypass" and bypass.flight is None
    leader.end()
    # Coalescing off: every miss routes for itself.
    cache, _ = make(coalesce_wait_s=0)
    first = ticket(cache)
    await cache.lookup(first)
    assert first.flight is None
    assert await asyncio.wait_for(cache.lookup(ticket(cache)), 1.0) is None
    await cache.aclose()


async def test_a_follower_that_gives_up_leaves_the_answer_to_the_others() -> None:
    cache, _ = make()
    leader = ticket(cache)
    await cache.lookup(leader)
    quitter = asyncio.create_task(cache.lookup(ticket(cache)))
    stayer = ticket(cache)
    staying = asyncio.create_task(cache.lookup(stayer))
    await asyncio.sleep(0.01)
    quitter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await quitter
    cache.store(leader, answer())
    assert await staying is not None and stayer.result == "coalesced"
    await cache.aclose()


async def test_a_coalesced_answer_the_caller_rejects_is_a_miss() -> None:
    cache, _ = make()
    leader = ticket(cache)
    await cache.lookup(leader)
    follower = ticket(cache)
    waiting = asyncio.create_task(cache.lookup(follower, lambda a: a.model != "m"))
    await asyncio.sleep(0.01)
    cache.store(leader, answer())
    assert await waiting is None and follower.result == "miss"
    await cache.aclose()
