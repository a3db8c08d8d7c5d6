"""One batch of ledger records into the database, in one transaction.

Requests, calls, feedback and tags go in as multi-row ``INSERT ... ON CONFLICT DO NOTHING`` on
their natural keys, so inserting records that are already in (a replay after a lost
acknowledgement or a crash) stores nothing twice. A batch the database refuses as invalid
is not retried whole: each record is inserted on its own and the ones refused are returned,
so one bad record neither poisons its batch nor a replay. Request and feedback rows are
stamped with the database's clock (``logged_at``) as they go in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import sqlalchemy as sa
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


def _statement(dialect: str, table: sa.Table) -> sa.Insert:
    stmt = insert_ignore(dialect, table)
    if table is schema.requests or table is schema.feedback:
        # Stamped with the database's clock as it goes in: when the row was *logged*, which
        # an incremental export pages by (requests) and measures late feedback by. A
        # replayed row that is already in keeps the stamp of its first insert (ON CONFLICT
        # DO NOTHING leaves it alone).
        stmt = stmt.values(logged_at=schema.ledger_now())
    return stmt


class BatchInserter:
    def __init__(self, engine: AsyncEngine, log_content: ContentMode, timeout_s: float) -> None:
        # Every transaction here writes: take SQLite's write lock at BEGIN.
        self._engine = engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        self._log_content = log_content
        self._timeout_s = timeout_s
        dialect = engine.dialect.name
        self._tables = tuple(
            (_statement(dialect, table), schema.TextFitter(table))
            for table in (schema.requests, schema.calls, schema.feedback, schema.request_tags)
        )

    async def insert(self, records: Sequence[LedgerRecord]) -> list[tuple[LedgerRecord, str]]:
        """Insert ``records``; returns the ones the database refused as invalid, each with
        the reason. Raises when the database is unavailable (nothing refused is known then,
        and the caller keeps the whole batch)."""
        try:
            await self._insert_txn(records)
            return []
        except Exception as exc:
            if not refused_data(exc):
                raise
            first_error = exc
        if len(records) == 1:
            return [(records[0], describe_error(first_error))]
        logger.warning(
            "ledger batch refused (%s); isolating the bad records", describe_error(first_error)
        )
        refused = []
        for record in records:
            try:
                await self._insert_txn([record])
            except Exception as exc:
                if not refused_data(exc):
                    raise
                refused.append((record, describe_error(exc)))
        return refused

    async def _insert_txn(self, records: Sequence[LedgerRecord]) -> None:
        rows_by_table = build_rows(records, self._log_content)
        for (_, fitter), rows in zip(self._tables, rows_by_table, strict=True):
            fitter.fit(rows)
        async with asyncio.timeout(self._timeout_s), self._engine.begin() as conn:
            for (stmt, _), rows in zip(self._tables, rows_by_table, strict=True):
                for i in range(0, len(rows), _EXECUTE_SLICE):
                    await conn.execute(stmt, rows[i : i + _EXECUTE_SLICE])
