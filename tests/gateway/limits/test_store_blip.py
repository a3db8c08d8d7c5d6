"""A short Redis outage loses no bookkeeping: settles and slot releases that failed while
Redis was down (killed with ``kill -9``, restarted from its AOF) are sent again once it
answers, and a settle whose reply was lost is never counted twice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.errors import APIError
from gateway.hooks import (
    LIMITS_UNAVAILABLE,
    Bookkeeping,
    KeyBudgetGuard,
    RequestHooks,
    RequestLog,
)
from gateway.limits import STORE_UNAVAILABLE, FailPolicyStore, KeyLimits
from gateway.limits.redis_store import RedisLimitStore
from gateway.principal import Principal
from router.policy import RouteContext, ToolCall
from router.pool import ModelPool
from tests.gateway.limits.redis_blips import ReplyCutter
from tests.support.redis_server import PrivateRedis

pytestmark = pytest.mark.redis

KEY = KeyLimits("blip", budget_micros=500, budget_period="total", max_parallel=2)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    redis_server = PrivateRedis(tmp_path)
    yield redis_server
    redis_server.kill()


async def settled(store: FailPolicyStore, timeout_s: float = 15.0) -> None:
    """Wait until the store has no bookkeeping left to send again."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.05)):
        if not store.pending_writes or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert store.pending_writes == 0


async def test_settles_and_slot_releases_that_fail_during_a_blip_land_when_redis_is_back(
    server: PrivateRedis,
) -> None:
    events: list[str] = []
    store = FailPolicyStore(
        RedisLimitStore(server.url, key_prefix="xrtest-blip", hold_ttl_s=60),
        "closed",
        events.append,
    )
    try:
        for rid in ("r1", "r2"):
            assert (await store.acquire_slot(KEY, rid)).ok
            assert (await store.reserve(KEY, None, 200, rid)).ok
        assert not (await store.acquire_slot(KEY, "r3")).ok  # max_parallel 2

        server.kill()  # just as the two requests finish
        await store.settle(KEY, "r1", 200, 42)
        await store.settle(KEY, "r2", 200, 40)
        await store.release_slot(KEY, "r1")
        await store.release_slot(KEY, "r2")
        await asyncio.sleep(0.5)  # the writes failed (connection lost or refused)...
        assert store.pending_writes == 4 and events
        server.start()  # ...and Redis comes back from its AOF, holds and slots included

        await settled(store)
        state = await store.spent(KEY)
        assert (state.spent, state.reserved) == (82, 0)
        assert server.client().zcard("xrtest-blip:{blip}:slots") == 0
        assert (await store.acquire_slot(KEY, "r3")).ok
        assert (await store.acquire_slot(KEY, "r4")).ok
        assert store.spend_writes_lost() == 0
        # The budget left is what the ledger would say: 500 - 82, not 500 or 500 - 400.
        assert (await store.reserve(KEY, None, 418, "r3")).ok
        assert not (await store.reserve(KEY, None, 1, "r4")).ok
    finally:
        await store.aclose()


async def test_a_settle_whose_reply_was_lost_is_sent_again_but_counted_once(
    server: PrivateRedis,
) -> None:
    """Redis runs the settle, the connection drops before the reply: the store cannot tell
    whether it ran, sends it again, and the settle's marker makes the second run a no-op."""
    proxy = ReplyCutter(server.port)
    await proxy.start()
    events: list[str] = []
    store = FailPolicyStore(
        RedisLimitStore(proxy.url, key_prefix="xrtest-blip", hold_ttl_s=60),
        "closed",
        events.append,
    )
    try:
        assert (await store.reserve(KEY, 300, 100, "r1")).ok
        assert (await store.reserve(KEY, 300, 100, "r2")).ok
        await store.settle(KEY, "r1", 100, 10)  # loads the script, applied normally
        assert (await store.spent(KEY)).spent == 10

        proxy.cut = True
        await store.settle(KEY, "r2", 100, 70)
        for _ in range(200):
            if events:
                break
            await asyncio.sleep(0.01)
        assert events == [STORE_UNAVAILABLE] and proxy.replies_cut == 1
        assert server.client().get("xrtest-blip:{blip}:b:spent:total") == "80"  # it ran
        proxy.cut = False

        await settled(store)
        state = await store.spent(KEY)
        assert (state.spent, state.reserved) == (80, 0)  # not 150: applied once
        # The per-request cap's spend too.
        assert server.client().get("xrtest-blip:{blip}:b:req:r2") == "70"
    finally:
        await store.aclose()
        await proxy.aclose()


async def test_a_write_given_up_is_counted_for_the_budget_sync(server: PrivateRedis) -> None:
    """Past its deadline (the hold TTL) a settle is no longer resent: its spend is counted as
    lost, so ``BudgetSync`` recounts the key from the ledger. A release given up is not."""
    store = FailPolicyStore(
        RedisLimitStore(server.url, key_prefix="xrtest-blip", hold_ttl_s=0.5), "open"
    )
    try:
        assert (await store.reserve(KEY, None, 100, "r1")).ok
        assert (await store.reserve(KEY, None, 100, "r2")).ok
        server.kill()
        await store.settle(KEY, "r1", 100, 30)
        await store.release(KEY, "r2", 100)
        await store.release_slot(KEY, "r2")
        await settled(store)  # given up while Redis stayed down
        assert store.spend_writes_lost() == 1
    finally:
        await store.aclose()


@pytest.fixture
async def cutter(server: PrivateRedis) -> AsyncIterator[tuple[ReplyCutter, FailPolicyStore]]:
    proxy = ReplyCutter(server.port)
    await proxy.start()
    store = FailPolicyStore(RedisLimitStore(proxy.url, key_prefix="xrtest-blip"), "closed")
    yield proxy, store
    await store.aclose()
    await proxy.aclose()


LOST = KeyLimits("blip", budget_micros=500, budget_period="total", max_parallel=1)


async def test_a_slot_whose_reply_was_lost_is_given_back(
    server: PrivateRedis, cutter: tuple[ReplyCutter, FailPolicyStore]
) -> None:
    """Redis takes a request's slot, the reply is lost: the request is refused with a 503
    (``on_store_error: closed``) and the slot it never learnt it had is released. Before, a
    key at ``max_parallel: 1`` was refused with 429s until the slot's TTL
    (request_timeout_s + 60 s)."""
    proxy, store = cutter
    hooks = RequestHooks(limits=store)
    ctx = RouteContext("r", [{"role": "user", "content": "hi"}], ModelPool([]), 0.0)
    who = Principal(key_id="blip", alias="blip", limits=LOST)

    async def admit(request_id: str) -> RequestLog:
        rlog = RequestLog(request_id, time.time(), who, time.perf_counter())
        await hooks.admit(rlog, ctx)
        return rlog

    await admit("warm")  # loads the scripts
    await store.release_slot(LOST, "warm")
    proxy.cut = True
    with pytest.raises(APIError) as refused:
        await admit("lost")
    assert refused.value.status == 503 and proxy.replies_cut == 1
    proxy.cut = False

    await hooks.bookkeeping.drain()
    await settled(store)
    assert server.client().zcard("xrtest-blip:{blip}:slots") == 0
    assert (await admit("next")).slot_held  # not a 429 parallel_limit_exceeded


async def test_a_hold_whose_reply_was_lost_is_given_back(
    server: PrivateRedis, cutter: tuple[ReplyCutter, FailPolicyStore]
) -> None:
    """The same for a call's budget hold: the call is not made, and the hold, which kept the
    key's budget until it expired, is released."""
    proxy, store = cutter
    guard = KeyBudgetGuard(store, LOST, "r", bookkeeping=Bookkeeping())
    assert await guard.reserve(ToolCall("warm", "m"), 1) is None  # loads the script
    await guard.settle(ToolCall("warm", "m"), 1, 0)
    proxy.cut = True
    refusal = await guard.reserve(ToolCall("c1", "m"), 400)
    assert refusal is not None and refusal.startswith(LIMITS_UNAVAILABLE)
    assert proxy.replies_cut == 1
    assert server.client().get("xrtest-blip:{blip}:b:reserved") == "400"  # it was taken
    proxy.cut = False

    await guard.bookkeeping.drain()
    await settled(store)
    state = await store.spent(LOST)
    assert (state.spent, state.reserved) == (0, 0)
    assert (await store.reserve(LOST, None, 500, "next")).ok  # the whole budget is free
