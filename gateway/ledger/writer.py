"""The ledger writer: batched, non-blocking, and it never loses a record.

Request handlers call :meth:`LedgerWriter.submit` (fire and forget, O(1)) or await
:meth:`LedgerWriter.submit_durable`. One background task drains the queue every
``flush_interval_ms`` (or at ``flush_rows``) in ONE transaction per batch with multi-row
inserts for requests, calls and feedback.

Durable submits are acknowledged from the local write-ahead journal, not the database: a
dedicated thread (``gateway.ledger.journal_thread``) appends every record that is waiting,
fsyncs once and wakes all their awaiters (group commit), then the records join the normal
batched insert. A database commit
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
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.backoff import DatabaseBackoff, LogThrottle
from gateway.ledger.inserter import BatchInserter
from gateway.ledger.journal_thread import JournalThread, Waiting
from gateway.ledger.records import FeedbackRecord, LedgerRecord
from gateway.ledger.spill import SpillJournal
from gateway.ledger.wal_segments import Retirement, WalSegments
from gateway.settings import LedgerSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")
# (record, its waiter, the WAL segment it is journaled in)
_Item = tuple[LedgerRecord, asyncio.Future[None] | None, int | None]

_ORPHAN_SCAN_INTERVAL_S = 60.0


class LedgerMetricsSink(Protocol):
    """What the writer reports; the gateway implements it with Prometheus."""

    def queue_depth(self, n: int) -> None: ...

    def spilled(self, n: int, reason: str) -> None:
        """``reason``: queue_full | db_error | db_unavailable (circuit breaker open)."""

    def write_error(self, kind: str) -> None:
        """``kind``: db (database unreachable/failing) | data (record rejected) | spill."""

    def flushed(self, n: int) -> None:
        """``n`` records newly committed to the database (live batches and replays). A
        record that was in already (a replay, a resubmission) is not counted again."""


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
        # ONE thread does every journal write: records that found the queue full, durable
        # records (group commit), spills, replays' bookkeeping.
        self._thread = JournalThread(self._journal, settings.log_content)

        self._pending: deque[_Item] = deque()
        self._wal = WalSegments()  # event loop thread only

        self._wake = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._db = DatabaseBackoff()
        self._next_orphan_scan = 0.0
        self._journal_log = LogThrottle(10.0)
        # Journal segments of stopped writers taken over at start(): their records reach
        # the database only now, so whatever was computed from it meanwhile missed them.
        self.adopted_at_start = 0
        # Records that neither the database nor the journal took, held in memory (by
        # identity; they are in the queue meanwhile): a kill -9 now would lose them.
        self._held: set[int] = set()

    # -- public API -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the journal, adopt the journals of dead writers and start flushing. Adopted
        records are replayed in the background (``flush()`` waits for that)."""
        if self._task is not None:
            return
        self._thread.start(self._overflow_done, self._wal_done)
        await self._in_journal(self._journal.open)
        adopted = await self._in_journal(self._journal.adopt_orphans)
        self.adopted_at_start = adopted
        if adopted:
            logger.info("ledger: %d journal segment(s) of stopped writers to replay", adopted)
        self._next_orphan_scan = time.monotonic() + _ORPHAN_SCAN_INTERVAL_S
        self._task = asyncio.create_task(self._run(), name="ledger-writer")
        self._thread.resume()
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
        if self._closed or not self._thread.started:
            # Not started (or closed): only the database path is left.
            self._enqueue(record, fut)
        else:
            self._thread.durable(record, fut)
        await fut

    async def flush(self) -> None:
        """Write everything submitted so far, trying the database even if the breaker is
        open, then replay the journal if the database took it."""
        async with self._flush_lock:
            await self._thread.barrier()
            await self._drain(force=True)
            if self._thread.started and self._needs_replay():
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
        if not self._thread.started:
            if self._pending:
                logger.error("ledger closed before start(): %d records lost", len(self._pending))
            self._closed = True
            return
        await self._thread.barrier()
        async with self._flush_lock:
            await self._drain(force=False)
        sealed = await self._in_journal(self._journal.wal_seal)
        if sealed is not None:
            self._wal_retire(self._wal.seal(sealed))
        await self._in_journal(self._journal.close)  # after the retirements just queued
        self._thread.shutdown()
        self._closed = True
        self._report_depth()

    @property
    def holding(self) -> bool:
        """Whether records are held in memory only, the database and the journal having
        both failed them (a disk full or read-only while the database is down): the
        answers they book went out, and a kill -9 would lose their rows. ``/readyz``
        reports it, so that a load balancer sends the traffic elsewhere until the journal
        or the database takes them (they are first in line for either)."""
        return bool(self._held)

    @property
    def pending(self) -> int:
        """Records submitted and not yet committed or journaled."""
        return len(self._pending) + self._thread.queued

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
            self._thread.overflow(record, fut)
            return
        self._pending.append((record, fut, None))
        if fut is not None or len(self._pending) >= self._settings.flush_rows:
            self._wake.set()

    # What the journal thread reports, on the loop thread.

    def _overflow_done(self, items: list[Waiting], error: BaseException | None) -> None:
        if error is None:
            if items:
                self._metric("spilled", len(items), "queue_full")
                self._resolve(items, None)
        else:
            self._journal_failed([(r, f, None) for r, f in items], error)

    def _wal_done(
        self,
        items: list[Waiting],
        prepared: list[LedgerRecord],
        seq: int | None,
        sealed: int | None,
        error: BaseException | None,
    ) -> None:
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
                written = await self._insert([r for r, _, _ in batch])
            except Exception as exc:
                self._db_failed(exc)
                reason = "db_error"
            else:
                self._db.ok()
                self._release(batch)
                self._metric("flushed", written)
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
                await self._in_journal(self._thread.spill, [r for r, _, _ in to_spill])
            except Exception as exc:
                self._journal_failed(to_spill, exc)
                return False
            self._release(to_spill)
            self._resolve(to_spill, None)
        self._metric("spilled", len(batch), reason)
        return True

    async def _insert(self, records: Sequence[LedgerRecord]) -> int:
        """Insert in one transaction, setting aside the records the database refuses as
        invalid; return how many records the database newly stored (a record already in —
        committed before a crash, or by the batch whose segment is replayed — counts 0).
        Raises when the database is unavailable (the caller spills or stops the replay)."""
        result = await self._inserter.write(records)
        for record, reason in result.refused:
            logger.error("ledger refused %s: %s", _record_id(record), reason)
            self._metric("write_error", "data")
            await self._in_journal(self._journal.reject, [record], reason)
        return result.written

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
                    written = await self._insert(chunk)
                except Exception as exc:
                    # The segment stays; chunks already in are skipped by ON CONFLICT later.
                    self._db_failed(exc)
                    return
                self._db.ok()
                # A replayed segment holds records that did reach the database (a WAL
                # segment's committed ones, a lost acknowledgement, a crash mid-replay):
                # only the ones stored now are counted.
                self._metric("flushed", written)
                if self._pending:
                    # Live traffic goes before the backlog.
                    await self._drain(force=False)
            await self._in_journal(self._journal.remove, segment)
            logger.info("ledger: replayed %d journaled records from %s", len(records), segment.name)

    # -- journal bookkeeping ----------------------------------------------------------

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
        self._held.update(id(r) for r, _, _ in batch)
        self._resolve(batch, LedgerUnavailableError(f"database and journal failed: {exc}"))
        # Back to the head of the queue (without their waiters, who were told).
        self._pending.extendleft((r, None, None) for r, _, _ in reversed(batch))

    def _release(self, batch: Sequence[_Item]) -> None:
        """The batch is committed or journaled: none of it is held any more."""
        if self._held:
            self._held.difference_update(id(r) for r, _, _ in batch)

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
        return await self._thread.run(fn, *args)

    def _in_journal_nowait(self, fn: Callable[..., Any], *args: Any) -> None:
        def failed() -> None:
            logger.exception("ledger journal maintenance failed (%s)", fn.__name__)

        self._thread.run_nowait(fn, *args, on_error=failed)

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


def _record_id(record: LedgerRecord) -> str:
    if isinstance(record, FeedbackRecord):
        return f"feedback {record.feedback_id} for {record.request_id}"
    return f"request {record.request_id}"
