"""Background work the gateway repeats (budget checks, content retention): a task that runs a
step every interval until closed, and the log of a step that keeps failing — one line when
an outage starts (or its error changes), one when it ends, not one per attempt."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any


class Periodic:
    """Runs ``step`` every ``interval_s`` in a task of its own (first after one interval, or
    at once with ``first_now``) until ``aclose``. ``step`` handles its own failures."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        step: Callable[[], Awaitable[Any]],
        *,
        first_now: bool = False,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self._step = step
        self._first_now = first_now
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        if not self._first_now:
            await asyncio.sleep(self.interval_s)
        while True:
            await self._step()
            await asyncio.sleep(self.interval_s)


class OutageLog:
    """``failed(exc)`` logs ``failing`` with the error's one-line description when it differs
    from the last one; ``recovered()`` logs ``recovered`` once after a failure."""

    def __init__(self, log: logging.Logger, failing: str, recovered: str) -> None:
        self._log = log
        self._failing = failing
        self._recovered = recovered
        self.error: str | None = None  # the last failure's description, while failing

    def failed(self, exc: BaseException) -> None:
        from gateway.ledger.store import describe_error  # parameter-free, one line

        message = describe_error(exc)
        if message != self.error:
            self._log.error("%s: %s", self._failing, message)
        self.error = message

    def recovered(self) -> None:
        if self.error is not None:
            self._log.info(self._recovered)
            self.error = None
