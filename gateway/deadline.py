"""A time bound on a call to the ledger database that gives up without waiting for the call
to unwind.

Not ``asyncio.timeout``: that waits for the cancelled call to finish unwinding, and
cancelling a query asyncpg has sent opens a second connection to ask the server to cancel
it — to a hung server (a network partition, a stopped server keeping its sockets open),
seconds more. The unwinding goes on in the background instead, held here so that it is not
collected mid-way, and its failure is not logged as news.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlineExceeded(TimeoutError):
    """The bounded call had not answered in time (not a timeout raised inside it)."""


class Deadline:
    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self._abandoned: set[asyncio.Future[Any]] = set()

    async def run(self, call: Awaitable[T]) -> T:
        """``call``'s result, or :class:`DeadlineExceeded` once it has taken ``timeout_s``."""
        task = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        except asyncio.CancelledError:  # the caller's own cancellation (a client hang-up)
            self._abandon(task)
            raise
        if task in done:
            return task.result()
        self._abandon(task)
        raise DeadlineExceeded(f"no answer in {self.timeout_s:g} s")

    @property
    def unwinding(self) -> int:
        """How many calls given up on are still unwinding."""
        return len(self._abandoned)

    def _abandon(self, task: asyncio.Future[Any]) -> None:
        task.cancel()
        self._abandoned.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an abandoned call's failure is not news
