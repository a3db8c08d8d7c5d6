"""BatchInserter on SQLite and PostgreSQL: one transaction per batch, nothing stored twice,
refused records returned with their reason while the rest of the batch is stored, and an
unavailable database raised rather than reported as refusals."""

from __future__ import annotations

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.inserter import BatchInserter
from gateway.ledger.records import LedgerRecord
from gateway.ledger.store import create_ledger_engine, refused_data

from .factories import count, make_feedback, make_request, request_ids


async def test_a_batch_is_stored_once_however_often_it_is_inserted(engine: AsyncEngine) -> None:
    inserter = BatchInserter(engine, "none", timeout_s=10)
    batch: list[LedgerRecord] = [
        make_request("a", models=("m1", "m2")),
        make_request("b"),
        make_feedback("a", 1.0),
    ]
    assert await inserter.insert(batch) == []
    assert await inserter.insert(batch) == []  # a replay of records already in
    assert await request_ids(engine) == ["a", "b"]
    assert await count(engine, "calls") == 3
    assert await count(engine, "feedback") == 1


async def test_refused_records_are_returned_and_the_rest_stored(engine: AsyncEngine) -> None:
    inserter = BatchInserter(engine, "none", timeout_s=10)
    bad = make_request("bad")
    bad.policy = None  # type: ignore[assignment]  # violates NOT NULL
    refused = await inserter.insert([make_request("good-1"), bad, make_request("good-2")])
    assert [(r.request_id, bool(reason)) for r, reason in refused] == [("bad", True)]
    assert await request_ids(engine) == ["good-1", "good-2"]


async def test_an_unreachable_database_raises() -> None:
    # Nothing listens on port 1: no record can be judged, so none may be reported as
    # refused (the writer would set it aside for good instead of spilling and replaying it).
    engine = create_ledger_engine("postgresql+asyncpg://postgres@127.0.0.1:1/none")
    try:
        # The socket's refusal, raised as the driver's connection error (SQLSTATE 08006),
        # which the writer retries: not data the database refused.
        with pytest.raises(sa_exc.DBAPIError, match="cannot reach the database") as exc:
            await BatchInserter(engine, "none", timeout_s=5).insert([make_request("a")])
        assert not refused_data(exc.value)
    finally:
        await engine.dispose()
