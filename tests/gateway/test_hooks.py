"""Bookkeeping that must outlive a cancelled request: a settle or a ledger row started in a
``finally`` block while the client hangs up still completes, and shutdown waits for it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.hooks import Bookkeeping


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
