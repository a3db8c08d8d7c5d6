"""One batch of ledger records into the database, in one transaction.

Requests, calls, feedback and tags go in as multi-row ``INSERT ... ON CONFLICT DO NOTHING`` on
their natural keys, so inserting records that are already in (a replay after a lost
acknowledgement or a crash) stores nothing twice. A batch the database refuses as invalid
is not retried whole: each record is inserted on its own and the ones refused are returned,
so one bad record neither poisons its batch nor a replay. Request and feedback rows are
stamped with the database's clock (``logged_at``) as they go in.

Each insert of request and feedback rows reports how many rows it actually stored (a row
``ON CONFLICT DO NOTHING`` skipped is not among them), so the writer counts each record the
database newly took exactly once, however often a replay offers it: SQLite's row count
(summed over an ``executemany``), and on PostgreSQL, whose asyncpg driver reports no row
count for an ``executemany``, the keys ``RETURNING`` gives back for the rows inserted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import schema
from gateway.ledger.migrations import SQLITE_BEGIN_OPTION
from gateway.ledger.records import ContentMode, LedgerRecord, build_rows
from gateway.ledger.schema import insert_ignore
from gateway.ledger.store import describe_error, refused_data

logger = logging.getLogger(__name__)

# Rows bound per execute: binding parameters is CPU work on the event loop, and slices keep
# each stretch short so request handlers are not stalled behind a big batch.
_EXECUTE_SLICE = 100


# The tables holding one row per record, with their natural key: what a record newly
# stored is counted by.
_RECORD_KEYS = {"requests": "request_id", "feedback": "feedback_id"}


def _statement(dialect: Dialect, table: sa.Table) -> sa.Insert:
    stmt = insert_ignore(dialect.name, table)
    if table is schema.requests or table is schema.feedback:
        # Stamped with the database's clock as it goes in: when the row was *logged*, which
        # an incremental export pages by (requests) and measures late feedback by. A
        # replayed row that is already in keeps the stamp of its first insert (ON CONFLICT
        # DO NOTHING leaves it alone).
        stmt = stmt.values(logged_at=schema.ledger_now())
    key = _RECORD_KEYS.get(table.name)
    if key is not None and not dialect.supports_sane_multi_rowcount:
        # Only the rows actually inserted come back: a replayed record already in is not
        # counted as written again. (Where the driver sums an executemany's row count,
        # SQLite's, that count says the same for less work.)
        stmt = stmt.returning(table.c[key])
    return stmt


@dataclass
class Inserted:
    """What one ``BatchInserter.write`` did: how many records (request and feedback rows)
    the database newly stored — records already in, skipped by ``ON CONFLICT DO NOTHING``,
    are not counted — and the records it refused as invalid, each with the reason."""

    written: int = 0
    refused: list[tuple[LedgerRecord, str]] = field(default_factory=list)


class BatchInserter:
    def __init__(self, engine: AsyncEngine, log_content: ContentMode, timeout_s: float) -> None:
        # Every transaction here writes: take SQLite's write lock at BEGIN.
        self._engine = engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        self._log_content = log_content
        self._timeout_s = timeout_s
        tables = (schema.requests, schema.calls, schema.feedback, schema.request_tags)
        self._tables = tuple(
            (_statement(engine.dialect, table), schema.TextFitter(table)) for table in tables
        )
        # Which statements' stored rows are records (counted as written).
        self._counted = tuple(table.name in _RECORD_KEYS for table in tables)

    async def insert(self, records: Sequence[LedgerRecord]) -> list[tuple[LedgerRecord, str]]:
        """Insert ``records``; returns the ones the database refused as invalid, each with
        the reason. Raises when the database is unavailable (nothing refused is known then,
        and the caller keeps the whole batch)."""
        return (await self.write(records)).refused

    async def write(self, records: Sequence[LedgerRecord]) -> Inserted:
        """Insert ``records``; returns how many the database newly stored and the ones it
        refused as invalid. Raises as ``insert`` does."""
        try:
            return Inserted(written=await self._insert_txn(records))
        except Exception as exc:
            if not refused_data(exc):
                raise
            first_error = exc
        if len(records) == 1:
            return Inserted(refused=[(records[0], describe_error(first_error))])
        logger.warning(
            "ledger batch refused (%s); isolating the bad records", describe_error(first_error)
        )
        result = Inserted()
        for record in records:
            try:
                result.written += await self._insert_txn([record])
            except Exception as exc:
                if not refused_data(exc):
                    raise
                result.refused.append((record, describe_error(exc)))
        return result

    async def _insert_txn(self, records: Sequence[LedgerRecord]) -> int:
        """One transaction; returns the number of request and feedback rows it stored."""
        rows_by_table = build_rows(records, self._log_content)
        for (_, fitter), rows in zip(self._tables, rows_by_table, strict=True):
            fitter.fit(rows)
        written = 0
        async with asyncio.timeout(self._timeout_s), self._engine.begin() as conn:
            for (stmt, _), counted, rows in zip(
                self._tables, self._counted, rows_by_table, strict=True
            ):
                for i in range(0, len(rows), _EXECUTE_SLICE):
                    result = await conn.execute(stmt, rows[i : i + _EXECUTE_SLICE])
                    if not counted:
                        continue
                    # (A driver that knew no count would say -1: none counted, never less.)
                    written += len(result.all()) if result.returns_rows else max(result.rowcount, 0)
        return written
