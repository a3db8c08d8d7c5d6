"""The retention task's queries on a ledger of months: each run must read the rows it
changes, not every old row the ledger holds. Asserted on the database's own query plans
(SQLite's ``EXPLAIN QUERY PLAN``; PostgreSQL's ``EXPLAIN`` with sequential scans priced
out, as on a large table), for the statements the task really executes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.inserter import BatchInserter
from gateway.ledger.keys import KeyRepository
from gateway.ledger.retention import delete_requests, drop_content

from .factories import make_request

NOW = datetime(2025, 6, 30, 12, 0, tzinfo=UTC)
DAY = 86400.0


async def executed(
    engine: AsyncEngine, step: Callable[[], Awaitable[Any]], verb: str
) -> list[tuple[str, Any]]:
    """The statements starting with ``verb`` that ``step`` executes, with their parameters."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, params: Any, *rest: Any) -> None:
        if statement.lstrip().upper().startswith(verb):
            seen.append((statement, params))

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        await step()
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
    return seen


async def plan(engine: AsyncEngine, statement: str, params: Any) -> str:
    """The database's plan for ``statement``, as text."""
    async with engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        assert raw is not None
        if engine.dialect.name == "sqlite":
            cursor = await raw.execute(f"EXPLAIN QUERY PLAN {statement}", params)
            return "\n".join(str(row[3]) for row in await cursor.fetchall())
        async with raw.transaction():
            # A test ledger is a few pages, which a sequential scan always wins; on a ledger
            # of months it loses, and this makes the planner see it so.
            await raw.execute("SET LOCAL enable_seqscan = off")
            rows = await raw.fetch(f"EXPLAIN {statement}", *params)
        return "\n".join(str(row[0]) for row in rows)


async def test_dropping_content_reads_only_the_requests_that_still_have_some(
    engine: AsyncEngine,
) -> None:
    """``drop_content`` picked its batch by ``created_at`` alone, then checked each row for
    content: every run read every request older than the cutoff — all of them cleared
    already, or never logged with content (``log_content: none``) — inside a write
    transaction, which on SQLite held the ledger writer off for the whole scan (0.15 s on
    a ledger of a million requests, an insert waiting 188 ms behind it, every run, growing
    with the ledger; ``bench/ledger_scale.py``). The partial index of the requests that
    hold content (migration 17) makes it read only those."""
    old = NOW.timestamp() - 50 * DAY
    await BatchInserter(engine, "none", timeout_s=30).insert(
        [make_request(f"r{i:03d}", created_at=old) for i in range(50)]
    )
    await BatchInserter(engine, "full", timeout_s=30).insert(
        [make_request(f"c{i:03d}", created_at=old) for i in range(5)]
    )

    dropped: list[int] = []

    async def drop() -> None:
        dropped.append(await drop_content(engine, NOW - timedelta(days=30)))

    updates = await executed(engine, drop, "UPDATE")
    assert dropped == [5] and len(updates) == 1  # one batch
    statement, params = updates[0]
    assert "ix_requests_content_created_at" in await plan(engine, statement, params)


async def test_each_deletion_batch_starts_where_the_last_one_ended(engine: AsyncEngine) -> None:
    """A lifetime-budgeted key's requests stay whatever their age, so they pile up among
    the old ones: each batch of ``delete_requests`` picked its requests from the oldest
    on, reading all those kept rows again, under the write lock — a backlog of N batches
    read them N times. A batch now starts at the age where the last one ended."""
    lifetime, _ = await KeyRepository(engine).create(
        "lifetime", budget_usd=1, budget_period="total"
    )
    old = NOW.timestamp() - 50 * DAY
    records = []
    for i in range(60):  # kept and deletable requests, interleaved in age
        key = lifetime.key_id if i % 2 else None
        records.append(make_request(f"r{i:03d}", created_at=old + i, key_id=key))
    await BatchInserter(engine, "none", timeout_s=30).insert(records)

    deleted: list[int] = []

    async def delete() -> None:
        deleted.append(await delete_requests(engine, NOW - timedelta(days=40), batch=10))

    picks = [
        (statement, params)
        for statement, params in await executed(engine, delete, "SELECT")
        if "LIMIT" in statement.upper()
    ]
    assert deleted == [30] and len(picks) == 4  # three full batches, then an empty one
    for statement, params in picks[1:]:
        assert "created_at >=" in statement
        if engine.dialect.name == "sqlite":
            # The index range is bounded below, not read from the oldest row on.
            assert "created_at>? AND created_at<?" in await plan(engine, statement, params)
