"""The ledger's journal thread.

Every write to the local journal (spill segments and write-ahead segments) happens on ONE
dedicated thread, which serializes them without locks and keeps file I/O off the event
loop. Two kinds of records wait for it:

- *overflow*: records that found the writer's queue full, spilled instead of queued;
- *durable*: records whose submitter waits until they survive a ``kill -9``.

Each kind is written in groups: the thread takes everything that arrived while it was busy,
appends it at once and (for durable records) fsyncs once — group commit — then reports
back on the event loop thread. The ``*_scheduled`` flags are only touched on the loop
thread, so a group is never scheduled twice nor forgotten.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from gateway.ledger.records import ContentMode, LedgerRecord, RequestRecord, apply_content_policy
from gateway.ledger.spill import SpillJournal

T = TypeVar("T")
# (record, its waiter)
Waiting = tuple[LedgerRecord, asyncio.Future[None] | None]
# What the thread reports for a group of overflowed records: the group, and the error that
# kept it from the journal, if any.
OverflowDone = Callable[[list[Waiting], BaseException | None], None]
# For a group of durable records: the group, the records as journaled (content policy
# applied), the WAL segment they are in and the segment the append sealed (None when the
# append failed), and the error.
DurableDone = Callable[
    [list[Waiting], list[LedgerRecord], int | None, int | None, BaseException | None], None
]


class JournalThread:
    def __init__(self, journal: SpillJournal, log_content: ContentMode) -> None:
        self.journal = journal
        self._mode = log_content
        self._exec: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_overflow: OverflowDone | None = None
        self._on_durable: DurableDone | None = None
        self._overflow: deque[Waiting] = deque()
        self._overflow_scheduled = False
        self._durable: deque[Waiting] = deque()
        self._durable_scheduled = False

    @property
    def started(self) -> bool:
        return self._exec is not None

    @property
    def queued(self) -> int:
        """Records waiting for the thread."""
        return len(self._overflow) + len(self._durable)

    def start(self, on_overflow: OverflowDone, on_durable: DurableDone) -> None:
        """Start the thread. Records queued before now wait for ``resume`` (the journal is
        opened first, on the thread)."""
        self._loop = asyncio.get_running_loop()
        self._on_overflow, self._on_durable = on_overflow, on_durable
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-journal")

    def resume(self) -> None:
        """Write the records queued before ``start``."""
        if self._overflow:
            self._schedule_overflow()
        if self._durable:
            self._schedule_durable()

    def shutdown(self) -> None:
        if self._exec is not None:
            self._exec.shutdown(wait=False)

    def overflow(self, record: LedgerRecord, fut: asyncio.Future[None] | None) -> None:
        self._overflow.append((record, fut))
        self._schedule_overflow()

    def durable(self, record: LedgerRecord, fut: asyncio.Future[None]) -> None:
        self._durable.append((record, fut))
        self._schedule_durable()

    async def barrier(self) -> None:
        """Wait until the thread has handled every overflowed or durable record."""
        if self._exec is None:
            return
        while (
            self._overflow or self._overflow_scheduled or self._durable or self._durable_scheduled
        ):
            await self.run(_noop)
            await asyncio.sleep(0)  # let the *_done callbacks queued by the thread run

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the thread, after what is already queued there."""
        assert self._exec is not None, "LedgerWriter.start() was not called"
        return await asyncio.get_running_loop().run_in_executor(self._exec, fn, *args)

    def run_nowait(self, fn: Callable[..., Any], *args: Any, on_error: Callable[[], None]) -> None:
        """Queue ``fn`` on the thread without waiting for it; ``on_error`` (called in the
        thread, inside the except block) reports a failure."""
        assert self._exec is not None

        def run() -> None:
            try:
                fn(*args)
            except Exception:
                on_error()

        self._exec.submit(run)

    def spill(self, records: Iterable[LedgerRecord]) -> None:
        """(thread) Append to the spill journal, the content policy applied first: raw text
        never reaches the disk unless the operator logs content in full."""
        self.journal.append(self._policy(r) for r in records)

    def _policy(self, record: LedgerRecord) -> LedgerRecord:
        return (
            apply_content_policy(record, self._mode)
            if isinstance(record, RequestRecord)
            else record
        )

    # -- overflow ----------------------------------------------------------------------

    def _schedule_overflow(self) -> None:
        if self._overflow_scheduled or self._exec is None:
            return
        self._overflow_scheduled = True
        self._exec.submit(self._overflow_in_thread)

    def _overflow_in_thread(self) -> None:
        items = _pop_all(self._overflow)
        error: BaseException | None = None
        try:
            self.spill(r for r, _ in items)
        except BaseException as exc:
            error = exc
        self._call_soon(self._overflow_done, items, error)

    def _overflow_done(self, items: list[Waiting], error: BaseException | None) -> None:
        self._overflow_scheduled = False
        assert self._on_overflow is not None
        self._on_overflow(items, error)
        if self._overflow:
            self._schedule_overflow()

    # -- durable ------------------------------------------------------------------------

    def _schedule_durable(self) -> None:
        if self._durable_scheduled or self._exec is None:
            return
        self._durable_scheduled = True
        self._exec.submit(self._durable_in_thread)

    def _durable_in_thread(self) -> None:
        items = _pop_all(self._durable)
        prepared: list[LedgerRecord] = [r for r, _ in items]
        try:
            prepared = [self._policy(r) for r in prepared]
            seq, sealed = self.journal.wal_append(prepared)
        except BaseException as exc:
            # Whatever failed, the loop must hear back: a group never reported would leave
            # _durable_scheduled set, and every later durable submit (and close) waiting
            # forever.
            self._call_soon(self._durable_done, items, prepared, None, None, exc)
            return
        self._call_soon(self._durable_done, items, prepared, seq, sealed, None)

    def _durable_done(
        self,
        items: list[Waiting],
        prepared: list[LedgerRecord],
        seq: int | None,
        sealed: int | None,
        error: BaseException | None,
    ) -> None:
        self._durable_scheduled = False
        assert self._on_durable is not None
        self._on_durable(items, prepared, seq, sealed, error)
        if self._durable:
            self._schedule_durable()

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)


def _noop() -> None:
    return None


def _pop_all(queue: deque[Waiting]) -> list[Waiting]:
    """(journal thread) Take everything queued so far; deque pops are thread-safe."""
    items: list[Waiting] = []
    while True:
        try:
            items.append(queue.popleft())
        except IndexError:
            return items
