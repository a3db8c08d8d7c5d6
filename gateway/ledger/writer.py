"""The ledger writer: batched, non-blocking, and it never loses a record.

Request handlers call :meth:`LedgerWriter.submit` (fire and forget, O(1)) or await
:meth:`LedgerWriter.submit_durable`. One background task drains the queue every
``flush_interval_ms`` (or at ``flush_rows``) in ONE transaction per batch with multi-row
inserts for requests, calls and feedback.

Durable submits are acknowledged from the local write-ahead journal, not the database: a
dedicated thread appends every record that is waiting, fsyncs once and wakes all their
awaiters (group commit), then the records join the normal batched insert. A database commit
costs 1-16 ms (more under contention between workers, or when PostgreSQL is slow); an
fsync'ed append costs about one fsync whatever the database is doing, and the database
keeps getting large efficient batches. A WAL segment is deleted once all its records are
committed; after a crash the next writer replays it (duplicates are skipped, see below).
If the journal itself fails, durable records fall back to waiting for the database commit.

When the database fails, the batch goes to the spill journal (never dropped) and a small
circuit breaker sends the following batches straight there until a retry is due; once the
database answers again the journal is replayed. Inserts are ``ON CONFLICT DO NOTHING`` on
natural keys (request_id; request_id + seq for calls; feedback_id), so a replay of records
that did reach the database (a commit whose acknowledgement was lost, a crash mid-replay)
stores nothing twice. Records the database rejects as invalid are isolated and set aside in
a ``rejected-*.jsonl`` file instead of poisoning the batch or the replay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.backoff import DatabaseBackoff, LogThrottle
from gateway.ledger.inserter import BatchInserter
from gateway.ledger.records import (
    FeedbackRecord,
    LedgerRecord,
    RequestRecord,
    apply_content_policy,
)
from gateway.ledger.spill import SpillJournal
from gateway.ledger.wal_segments import Retirement, WalSegments
from gateway.settings import LedgerSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")
# (record, its waiter, the WAL segment it is journaled in)
_Item = tuple[LedgerRecord, asyncio.Future[None] | None, int | None]
_Waiting = tuple[LedgerRecord, asyncio.Future[None] | None]

_ORPHAN_SCAN_INTERVAL_S = 60.0


class LedgerMetricsSink(Protocol):
    """What the writer reports; the gateway implements it with Prometheus."""

    def queue_depth(self, n: int) -> None: ...

    def spilled(self, n: int, reason: str) -> None:
        """``reason``: queue_full | db_error | db_unavailable (circuit breaker open)."""

    def write_error(self, kind: str) -> None:
        """``kind``: db (database unreachable/failing) | data (record rejected) | spill."""

    def flushed(self, n: int) -> None:
        """``n`` records committed to the database (live batches and replays)."""


class LedgerUnavailableError(RuntimeError):
    """A durable record could be neither committed nor journaled (database AND disk failed).
    The record is still held in memory and retried."""


class LedgerWriter:
    def __init__(
        self,
        engine: AsyncEngine,
        settings: LedgerSettings,
        metrics: LedgerMetricsSink | None = None,
        *,
        db_timeout_s: float = 10.0,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._inserter = BatchInserter(engine, settings.log_content, db_timeout_s)
        self._journal = SpillJournal(settings.spill_dir, wal_fsync=settings.journal_fsync)

        self._pending: deque[_Item] = deque()
        # Records that found the queue full, waiting for the journal thread.
        self._overflow: deque[_Waiting] = deque()
        self._overflow_scheduled = False
        # Durable records waiting for the journal thread's next group commit.
        self._wal_in: deque[_Waiting] = deque()
        self._wal_scheduled = False
        self._wal = WalSegments()  # event loop thread only

        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        # ONE thread does every journal write, which serializes them without locks.
        self._journal_exec: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._closed = False
        self._db = DatabaseBackoff()
        self._next_orphan_scan = 0.0
        self._journal_log = LogThrottle(10.0)
        # Journal segments of stopped writers taken over at start(): their records reach
        # the database only now, so whatever was computed from it meanwhile missed them.
        self.adopted_at_start = 0

    # -- public API -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the journal, adopt the journals of dead writers and start flushing. Adopted
        records are replayed in the background (``flush()`` waits for that)."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._journal_exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-journal")
        await self._in_journal(self._journal.open)
        adopted = await self._in_journal(self._journal.adopt_orphans)
        self.adopted_at_start = adopted
        if adopted:
            logger.info("ledger: %d journal segment(s) of stopped writers to replay", adopted)
        self._next_orphan_scan = time.monotonic() + _ORPHAN_SCAN_INTERVAL_S
        self._task = asyncio.create_task(self._run(), name="ledger-writer")
        if self._overflow:
            self._schedule_overflow()
        if self._wal_in:
            self._schedule_wal()
        self._wake.set()

    def submit(self, record: LedgerRecord) -> None:
        """Queue a record for the next batch. Never blocks and never raises; a full queue
        sends the record to the spill journal (written by the journal thread)."""
        try:
            self._enqueue(record, None)
        except Exception:
            logger.exception("ledger: failed to queue a record")

    async def submit_durable(self, record: LedgerRecord) -> None:
        """Return once the record survives a ``kill -9`` of this process: fsync'ed to the
        journal (the usual path) or committed to the database. Raises
        ``LedgerUnavailableError`` only when both failed (the record is kept in memory)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed or self._journal_exec is None:
            # Not started (or closed): only the database path is left.
            self._enqueue(record, fut)
        else:
            self._wal_in.append((record, fut))
            self._schedule_wal()
        await fut

    async def flush(self) -> None:
        """Write everything submitted so far, trying the database even if the breaker is
        open, then replay the journal if the database took it."""
        async with self._flush_lock:
            await self._journal_barrier()
            await self._drain(force=True)
            if self._journal_exec is not None and self._needs_replay():
                await self._replay(force=True)

    async def close(self) -> None:
        """Drain everything (to the database, or the journal if it is down), finish journal
        writes and release the journal. Idempotent."""
        if self._closed or self._closing:
            return
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._journal_exec is None:
            if self._pending:
                logger.error("ledger closed before start(): %d records lost", len(self._pending))
            self._closed = True
            return
        await self._journal_barrier()
        async with self._flush_lock:
            await self._drain(force=False)
        sealed = await self._in_journal(self._journal.wal_seal)
        if sealed is not None:
            self._wal_retire(self._wal.seal(sealed))
        await self._in_journal(self._journal.close)  # after the retirements just queued
        self._journal_exec.shutdown(wait=False)
        self._closed = True
        self._report_depth()

    @property
    def pending(self) -> int:
        """Records submitted and not yet committed or journaled."""
        return len(self._pending) + len(self._overflow) + len(self._wal_in)

    # -- queueing ---------------------------------------------------------------------

    def _enqueue(self, record: LedgerRecord, fut: asyncio.Future[None] | None) -> None:
        if self._closed:
            # A caller bug (submitting after shutdown): there is no journal left to write to.
            logger.error("ledger writer is closed; %s dropped", _record_id(record))
            self._metric("write_error", "closed")
            if fut is not None:
                fut.set_exception(LedgerUnavailableError("ledger writer is closed"))
            return
        if len(self._pending) >= self._settings.queue_size:
            self._overflow.append((record, fut))
            self._schedule_overflow()
            return
        self._pending.append((record, fut, None))
        if fut is not None or len(self._pending) >= self._settings.flush_rows:
            self._wake.set()

    # The journal thread reports back with call_soon_threadsafe; the *_scheduled flags are
    # only touched on the loop thread, so a batch can't be scheduled twice or forgotten.

    def _schedule_overflow(self) -> None:
        if self._overflow_scheduled or self._journal_exec is None:
            return
        self._overflow_scheduled = True
        self._journal_exec.submit(self._overflow_in_thread)

    def _overflow_in_thread(self) -> None:
        items = _pop_all(self._overflow)
        error: BaseException | None = None
        try:
            self._spill_sync([r for r, _ in items])
        except BaseException as exc:
            error = exc
        self._call_soon(self._overflow_done, items, error)

    def _overflow_done(self, items: list[_Waiting], error: BaseException | None) -> None:
        self._overflow_scheduled = False
        if error is None:
            if items:
                self._metric("spilled", len(items), "queue_full")
                self._resolve(items, None)
        else:
            self._journal_failed([(r, f, None) for r, f in items], error)
        if self._overflow:
            self._schedule_overflow()

    def _schedule_wal(self) -> None:
        if self._wal_scheduled or self._journal_exec is None:
            return
        self._wal_scheduled = True
        self._journal_exec.submit(self._wal_in_thread)

    def _wal_in_thread(self) -> None:
        items = _pop_all(self._wal_in)
        mode = self._settings.log_content
        prepared: list[LedgerRecord] = [r for r, _ in items]
        try:
            prepared = [
                apply_content_policy(r, mode) if isinstance(r, RequestRecord) else r
                for r in prepared
            ]
            seq, sealed = self._journal.wal_append(prepared)
        except BaseException as exc:
            # Whatever failed, the loop must hear back: a batch never reported would leave
            # _wal_scheduled set, and every later durable submit (and close) waiting forever.
            self._call_soon(self._wal_done, items, prepared, None, None, exc)
            return
        self._call_soon(self._wal_done, items, prepared, seq, sealed, None)

    def _wal_done(
        self,
        items: list[_Waiting],
        prepared: list[LedgerRecord],
        seq: int | None,
        sealed: int | None,
        error: BaseException | None,
    ) -> None:
        self._wal_scheduled = False
        if error is not None or seq is None:
            if self._journal_log.ready():
                logger.error("ledger journal append failed (%r); waiting for the database", error)
            self._metric("write_error", "spill")
            # Fall back to the database path: the waiters resolve on commit.
            self._pending.extend((r, f, None) for r, (_, f) in zip(prepared, items, strict=True))
            self._wake.set()
        else:
            self._resolve(items, None)
            # Journaled records are safe: if the queue is full they stay in the journal
            # only and are replayed later, instead of growing the queue.
            room = max(self._settings.queue_size - len(self._pending), 0)
            queued = prepared[:room]
            self._pending.extend((r, None, seq) for r in queued)
            self._wal.appended(seq, len(queued), len(prepared) - len(queued))
            if len(queued) < len(prepared):
                self._metric("spilled", len(prepared) - len(queued), "queue_full")
            if len(self._pending) >= self._settings.flush_rows:
                self._wake.set()
            if sealed is not None:
                self._wal_retire(self._wal.seal(sealed))
        if self._wal_in:
            self._schedule_wal()

    # -- the flusher ------------------------------------------------------------------

    async def _run(self) -> None:
        interval = self._settings.flush_interval_ms / 1000.0
        while True:
            if not self._wake.is_set():
                try:
                    async with asyncio.timeout(interval):
                        await self._wake.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            progress = True
            try:
                async with self._flush_lock:
                    progress = await self._drain(force=False)
                    if not self._closing and self._needs_replay() and self._db.ready():
                        await self._replay(force=False)
                    if not self._closing and time.monotonic() >= self._next_orphan_scan:
                        self._next_orphan_scan = time.monotonic() + _ORPHAN_SCAN_INTERVAL_S
                        await self._in_journal(self._journal.adopt_orphans)
            except Exception:
                # The flusher must outlive a bug in one cycle, or the queue only grows.
                logger.exception("ledger flush cycle failed")
            self._report_depth()
            if self._closing and (not self._pending or not progress):
                return

    async def _drain(self, force: bool) -> bool:
        """Write the queue in batches of ``flush_rows``; False if a batch could be neither
        committed nor journaled (it is back at the head of the queue)."""
        while self._pending:
            n = min(len(self._pending), self._settings.flush_rows)
            batch = [self._pending.popleft() for _ in range(n)]
            if not await self._write_batch(batch, force):
                return False
        return True

    async def _write_batch(self, batch: list[_Item], force: bool) -> bool:
        if force or self._db.ready():
            try:
                await self._insert([r for r, _, _ in batch])
            except Exception as exc:
                self._db_failed(exc)
                reason = "db_error"
            else:
                self._db.ok()
                self._metric("flushed", len(batch))
                self._resolve(batch, None)
                self._wal_retire(self._wal.settle((seq for _, _, seq in batch), committed=True))
                return True
        else:
            reason = "db_unavailable"
        # Records from the WAL are on disk already: their segment will be replayed.
        self._wal_retire(self._wal.settle((seq for _, _, seq in batch), committed=False))
        to_spill = [item for item in batch if item[2] is None]
        if to_spill:
            try:
                await self._in_journal(self._spill_sync, [r for r, _, _ in to_spill])
            except Exception as exc:
                self._journal_failed(to_spill, exc)
                return False
            self._resolve(to_spill, None)
        self._metric("spilled", len(batch), reason)
        return True

    async def _insert(self, records: Sequence[LedgerRecord]) -> None:
        """Insert in one transaction, setting aside the records the database refuses as
        invalid. Raises when the database is unavailable (the caller spills or stops the
        replay)."""
        for record, reason in await self._inserter.insert(records):
            logger.error("ledger refused %s: %s", _record_id(record), reason)
            self._metric("write_error", "data")
            await self._in_journal(self._journal.reject, [record], reason)

    # -- replay -----------------------------------------------------------------------

    def _needs_replay(self) -> bool:
        return self._journal.has_data or self._wal.current_dirty

    async def _replay(self, force: bool) -> None:
        """Insert the sealed spill segments, deleting each once it is fully in."""
        if not (force or self._db.ready()):
            return
        if self._wal.current_dirty:
            # The open WAL segment has records that failed to commit: seal it so it joins
            # this replay instead of waiting for the next rotation.
            sealed = await self._in_journal(self._journal.wal_seal)
            self._wal.current = None
            if sealed is not None:
                self._wal_retire(self._wal.seal(sealed))
        segments = await self._in_journal(self._journal.seal)
        step = self._settings.flush_rows
        for segment in segments:
            records = await asyncio.to_thread(SpillJournal.read, segment)
            for i in range(0, len(records), step):
                if self._closing:
                    # Shutting down: a journal of hours of traffic would hold the graceful
                    # shutdown (and the deploy) for as long. What is not in yet stays in
                    # the segment for the next writer; the chunks already in are skipped
                    # by ON CONFLICT when it replays them.
                    logger.info(
                        "ledger: shutting down mid-replay; the next start replays the rest of %s",
                        segment.name,
                    )
                    return
                chunk = records[i : i + step]
                try:
                    await self._insert(chunk)
                except Exception as exc:
                    # The segment stays; chunks already in are skipped by ON CONFLICT later.
                    self._db_failed(exc)
                    return
                self._db.ok()
                self._metric("flushed", len(chunk))
                if self._pending:
                    # Live traffic goes before the backlog.
                    await self._drain(force=False)
            await self._in_journal(self._journal.remove, segment)
            logger.info("ledger: replayed %d journaled records from %s", len(records), segment.name)

    # -- journal bookkeeping ----------------------------------------------------------

    def _spill_sync(self, records: Sequence[LedgerRecord]) -> None:
        """(journal thread) Apply the content policy first: raw text never reaches the disk
        unless the operator logs content in full."""
        mode = self._settings.log_content
        self._journal.append(
            apply_content_policy(r, mode) if isinstance(r, RequestRecord) else r for r in records
        )

    def _wal_retire(self, retirements: list[Retirement]) -> None:
        """Delete the WAL segments whose records are all committed; hand the others to the
        replay."""
        for seq, action in retirements:
            if action == "replay":
                self._in_journal_nowait(self._journal.wal_to_spill, seq)
            else:
                self._in_journal_nowait(self._journal.wal_remove, seq)

    def _journal_failed(self, batch: Sequence[_Item], exc: BaseException) -> None:
        logger.error(
            "ledger: journal write failed (%s); keeping %d records in memory", exc, len(batch)
        )
        self._metric("write_error", "spill")
        self._resolve(batch, LedgerUnavailableError(f"database and journal failed: {exc}"))
        # Back to the head of the queue (without their waiters, who were told).
        self._pending.extendleft((r, None, None) for r, _, _ in reversed(batch))

    async def _journal_barrier(self) -> None:
        """Wait until the journal thread has handled every overflowed or durable record."""
        if self._journal_exec is None:
            return
        while self._overflow or self._overflow_scheduled or self._wal_in or self._wal_scheduled:
            await self._in_journal(_noop)
            await asyncio.sleep(0)  # let the *_done callbacks queued by the thread run

    @staticmethod
    def _resolve(batch: Sequence[tuple[Any, ...]], error: BaseException | None) -> None:
        for item in batch:
            fut = item[1]
            if fut is None or fut.done():
                continue  # no waiter, or the waiter was cancelled
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    async def _in_journal(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._journal_exec is not None, "LedgerWriter.start() was not called"
        return await asyncio.get_running_loop().run_in_executor(self._journal_exec, fn, *args)

    def _in_journal_nowait(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._journal_exec is not None

        def run() -> None:
            try:
                fn(*args)
            except Exception:
                logger.exception("ledger journal maintenance failed (%s)", fn.__name__)

        self._journal_exec.submit(run)

    def _call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    # -- database failures and metrics --------------------------------------------------

    def _db_failed(self, exc: BaseException) -> None:
        self._db.failed(exc)
        self._metric("write_error", "db")

    def _report_depth(self) -> None:
        self._metric("queue_depth", self.pending)

    def _metric(self, name: str, *args: Any) -> None:
        if self._metrics is None:
            return
        try:
            getattr(self._metrics, name)(*args)
        except Exception:
            logger.exception("ledger metrics sink failed in %s", name)


def _noop() -> None:
    return None


def _pop_all(queue: deque[_Waiting]) -> list[_Waiting]:
    """(journal thread) Take everything queued so far; deque pops are thread-safe."""
    items: list[_Waiting] = []
    while True:
        try:
            items.append(queue.popleft())
        except IndexError:
            return items


def _record_id(record: LedgerRecord) -> str:
    if isinstance(record, FeedbackRecord):
        return f"feedback {record.feedback_id} for {record.request_id}"
    return f"request {record.request_id}"
