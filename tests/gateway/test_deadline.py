from __future__ import annotations

import asyncio
import time

import pytest

from gateway.deadline import Deadline, DeadlineExceeded


async def test_an_answer_in_time_is_returned() -> None:
    async def quick() -> int:
        return 7

    assert await Deadline(1).run(quick()) == 7


async def test_a_call_past_its_time_is_given_up_without_waiting_for_it_to_unwind() -> None:
    unwound = asyncio.Event()

    async def hung() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.5)  # a slow unwinding, as asyncpg's cancel request
            unwound.set()

    deadline = Deadline(0.05)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"no answer in 0\.05 s"):
        await deadline.run(hung())
    assert time.monotonic() - t0 < 0.4
    assert deadline.unwinding == 1 and not unwound.is_set()
    await asyncio.wait_for(unwound.wait(), 5)
    await asyncio.sleep(0)
    assert deadline.unwinding == 0


async def test_a_timeout_inside_the_call_is_its_own_error() -> None:
    async def times_out() -> None:
        raise TimeoutError("the call's own")

    with pytest.raises(TimeoutError, match="the call's own") as exc:
        await Deadline(1).run(times_out())
    assert not isinstance(exc.value, DeadlineExceeded)


async def test_the_callers_cancellation_cancels_the_call() -> None:
    cancelled = asyncio.Event()

    async def hung() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    deadline = Deadline(30)
    caller = asyncio.ensure_future(deadline.run(hung()))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(cancelled.wait(), 5)


def test_the_bound_is_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadline(0)
