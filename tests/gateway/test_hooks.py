"""Bookkeeping that must outlive a cancelled request: a settle or a ledger row started in a
``finally`` block while the client hangs up still completes, and shutdown waits for it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.hooks import Bookkeeping, KeyBudgetGuard, RequestHooks, RequestLog
from gateway.ledger import schema
from gateway.ledger.store import open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.limits import KeyLimits
from gateway.limits.memory import MemoryLimitStore
from gateway.limits.redis_store import RedisLimitStore
from gateway.principal import Principal
from gateway.settings import LedgerSettings
from router.policy import ToolCall
from tests.support.services import REDIS_URL, need_redis


async def test_a_step_completes_when_its_caller_is_cancelled() -> None:
    book = Bookkeeping()
    started, release = asyncio.Event(), asyncio.Event()
    done: list[str] = []

    async def settle() -> None:
        started.set()
        await release.wait()  # e.g. a first-use script load on the Redis connection
        done.append("settled")

    async def request() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await book.run(settle())

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    task.cancel()  # the client went away
    await started.wait()
    # The ASGI server keeps cancelling the response task while its finally runs.
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == []
    release.set()
    await book.drain()
    assert done == ["settled"]


async def test_drain_waits_for_every_started_step_and_errors_reach_their_caller() -> None:
    book = Bookkeeping()
    order: list[int] = []

    async def step(i: int, delay: float) -> None:
        await asyncio.sleep(delay)
        order.append(i)

    async def failing() -> None:
        raise RuntimeError("store down")

    runs = [asyncio.create_task(book.run(step(i, 0.01 * (3 - i)))) for i in range(3)]
    broken = asyncio.create_task(book.run(failing()))
    await asyncio.sleep(0)  # every caller has handed its step over
    await book.drain()
    assert sorted(order) == [0, 1, 2]
    await asyncio.gather(*runs)
    # The caller that awaited the failing step sees its error; drain itself does not raise.
    with pytest.raises(RuntimeError, match="store down"):
        await broken


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_a_hold_taken_while_its_request_is_cancelled_is_released(backend: str) -> None:
    """The client leaves while the store takes a call's hold: the loop never learns the hold
    was taken, so it settled nothing and the hold kept the key's budget until it expired
    (request_timeout_s + 60 s) — a key with budget to spare refused with 429s meanwhile."""
    if backend == "redis":
        need_redis()
        store: MemoryLimitStore | RedisLimitStore = RedisLimitStore(
            REDIS_URL, key_prefix=f"xrtest-hold-{id(object())}"
        )
    else:
        store = MemoryLimitStore()
    limits = KeyLimits("k", budget_micros=100_000)
    book = Bookkeeping()
    guard = KeyBudgetGuard(store, limits, "req", bookkeeping=book)
    try:
        # Connected before the race, so the reserve's command goes out at its first step.
        assert await guard.reserve(ToolCall("warm", "m"), 1) is None
        await guard.settle(ToolCall("warm", "m"), 1, 0)
        for i in range(5):
            task = asyncio.create_task(guard.reserve(ToolCall(f"c{i}", "m"), 30_000))
            await asyncio.sleep(0)  # the reserve is under way
            task.cancel()  # the client went away
            with pytest.raises(asyncio.CancelledError):
                await task
        await book.drain()
        state = await store.spent(limits)
        assert (state.spent, state.reserved) == (0, 0)
    finally:
        await store.aclose()


class _ReleaseFails(MemoryLimitStore):
    """A store whose slot release fails with an error of its own (not an outage), as a bug
    or an unexpected reply would."""

    async def release_slot(self, limits: KeyLimits, request_id: str) -> None:
        raise RuntimeError("unexpected reply")


async def test_a_failing_step_before_the_ledger_row_does_not_lose_the_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The slot release, the token correction and the metrics run before the row is
    submitted: one that raised skipped the submit, and the answered, paid-for request had
    no row at all."""
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    engine = await open_ledger_engine(url)
    writer = LedgerWriter(engine, LedgerSettings(url=url, spill_dir=str(tmp_path / "spill")))
    await writer.start()
    try:
        hooks = RequestHooks(limits=_ReleaseFails(), ledger=writer)
        limits = KeyLimits(key_id="k1", max_parallel=1)
        rlog = RequestLog(
            request_id="req-1",
            created_at=time.time(),
            principal=Principal(key_id="k1", limits=limits),
            t0=time.perf_counter(),
            status=200,
            slot_held=True,
        )
        await hooks.finish(rlog, None)
        await writer.flush()
        async with engine.connect() as conn:
            ids = (await conn.execute(sa.select(schema.requests.c.request_id))).scalars().all()
        assert ids == ["req-1"]
        assert "could not release its slot for request req-1" in caplog.text
    finally:
        await writer.close()
        await engine.dispose()
