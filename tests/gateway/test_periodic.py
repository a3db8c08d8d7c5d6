"""The gateway's repeated background work: steps on a schedule, outages logged once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.periodic import OutageLog, Periodic


async def test_a_step_runs_every_interval_until_closed() -> None:
    runs: list[float] = []
    enough = asyncio.Event()

    async def step() -> None:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) >= 6:
            enough.set()

    later = Periodic("later", 0.02, step)
    now = Periodic("now", 0.02, step, first_now=True)
    now.start()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(runs) == 1  # first_now: at once
    later.start()
    async with asyncio.timeout(5):
        await enough.wait()  # both keep running
    await now.aclose()
    await later.aclose()
    count = len(runs)
    await asyncio.sleep(0.05)
    assert len(runs) == count  # closed: nothing more runs
    await now.aclose()  # idempotent


def test_an_outage_is_logged_when_it_starts_changes_and_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("tests.periodic")
    outage = OutageLog(log, "syncing failed", "syncing works again")
    with caplog.at_level(logging.INFO, logger="tests.periodic"):
        outage.recovered()  # nothing to end
        for _ in range(3):
            outage.failed(ConnectionRefusedError("refused"))
        outage.failed(TimeoutError("slow"))
        outage.recovered()
        outage.recovered()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "syncing failed: ConnectionRefusedError: refused",
        "syncing failed: TimeoutError: slow",
        "syncing works again",
    ]
