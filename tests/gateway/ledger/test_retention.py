"""Ledger retention on SQLite and PostgreSQL: old requests lose their prompt and answer and
keep everything else; older ones go whole, except a lifetime-budgeted key's."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.ledger.export import export_ledger
from gateway.ledger.inserter import BatchInserter
from gateway.ledger.keys import KeyRepository
from gateway.ledger.retention import LedgerRetention, RetentionRun, delete_requests, drop_content
from gateway.ledger.schema import calls, feedback, request_tags, requests
from gateway.ledger.spend import budget_spend, spend_report
from gateway.ledger.writer import LedgerWriter
from gateway.metrics import GatewayMetrics
from gateway.settings import LedgerSettings

from .factories import make_feedback, make_request

NOW = datetime(2025, 6, 30, 12, 0, tzinfo=UTC)
DAY = 86400.0


async def load(engine: AsyncEngine, settings: LedgerSettings, ages_days: list[float]) -> None:
    writer = LedgerWriter(engine, settings)
    await writer.start()
    for i, age in enumerate(ages_days):
        rid = f"r{i:02d}"
        writer.submit(make_request(rid, created_at=NOW.timestamp() - age * DAY))
        writer.submit(make_feedback(rid, 0.5 + i / 100, created_at=NOW.timestamp()))
    await writer.close()


async def contents(engine: AsyncEngine) -> dict[str, bool]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(requests.c.request_id, requests.c.content))
        return {rid: content is not None for rid, content in rows}


async def test_old_content_is_dropped_in_batches_and_nothing_else_changes(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    ages = [45, 40.5, 31, 30.01, 29.99, 10, 0.5, 33, 60, 90, 35]  # 8 older than 30 days
    await load(engine, make_settings(log_content="full"), ages)
    report_before = await spend_report(engine, ["key", "policy", "day"])
    cutoff = NOW - timedelta(days=30)

    assert await drop_content(engine, cutoff, batch=4) == 8  # two full batches, an empty one
    kept = await contents(engine)
    assert kept == {f"r{i:02d}": age < 30 for i, age in enumerate(ages)}
    assert await drop_content(engine, cutoff, batch=4) == 0  # nothing left to drop
    # Costs, tokens, decisions and feedback are all still there.
    assert await spend_report(engine, ["key", "policy", "day"]) == report_before
    out = tmp_path / "export.jsonl"
    assert await export_ledger(engine, out, "jsonl") == len(ages)
    logged = {r["id"]: r["content_logged"] for r in map(json.loads, out.read_text().splitlines())}
    assert logged == {f"r{i:02d}": "full" if age < 30 else "none" for i, age in enumerate(ages)}
    with pytest.raises(ValueError):
        await drop_content(engine, cutoff, batch=0)


async def test_the_retention_task_counts_what_it_dropped(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    await load(engine, make_settings(log_content="hash"), [2.0, 0.5, 3.0])
    metrics = GatewayMetrics(CollectorRegistry(), models=["m"], policies=["compact"])
    task = LedgerRetention(
        engine, content_days=1, interval_s=3600, metrics=metrics, clock=lambda: NOW
    )
    assert await task.run_once() == RetentionRun(content_dropped=2)
    assert await task.run_once() == RetentionRun()
    value = metrics.registry.get_sample_value("xrouter_ledger_content_dropped_total")
    assert value == 2
    assert await contents(engine) == {"r00": False, "r01": True, "r02": False}


async def test_a_database_that_is_down_is_logged_once_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = create_async_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{port}/none")
    task = LedgerRetention(
        down, content_days=1, request_days=40, interval_s=3600, clock=lambda: NOW
    )
    try:
        with caplog.at_level(logging.ERROR, logger="gateway.ledger.retention"):
            assert await task.run_once() == RetentionRun()
            assert await task.run_once() == RetentionRun()
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    finally:
        await down.dispose()


async def ids_in(engine: AsyncEngine, table: sa.Table) -> set[str]:
    async with engine.connect() as conn:
        return {rid for (rid,) in await conn.execute(sa.select(table.c.request_id))}


async def test_old_requests_go_whole_except_a_lifetime_budgeted_keys(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    """Requests older than the cutoff are deleted with their calls, feedback and tags, a
    batch at a time; younger ones and every request of a key whose budget runs for its
    lifetime stay (that budget is restored from all of them), as does its spend."""
    keys = KeyRepository(engine)
    lifetime, _ = await keys.create("lifetime", budget_usd=10, budget_period="total")
    monthly, _ = await keys.create("monthly", budget_usd=10, budget_period="monthly")
    unbudgeted, _ = await keys.create("unbudgeted")
    plan = {  # request id: (key, age in days)
        "old-monthly": (monthly.key_id, 50),
        "old-unbudgeted": (unbudgeted.key_id, 40.5),
        "old-anonymous": (None, 45),
        "old-anonymous-2": (None, 90),
        "old-lifetime": (lifetime.key_id, 400),
        "new-monthly": (monthly.key_id, 10),
        "new-lifetime": (lifetime.key_id, 5),
        "new-anonymous": (None, 39.9),
    }
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for rid, (key_id, age) in plan.items():
        record = make_request(rid, created_at=NOW.timestamp() - age * DAY, key_id=key_id)
        record.tags = ["team-a", "exp-1"]
        writer.submit(record)
        writer.submit(make_feedback(rid, 0.5, created_at=NOW.timestamp()))
    await writer.close()
    lifetime_spend = await budget_spend(engine, [lifetime.key_id])
    assert await ids_in(engine, calls) == set(plan)  # every request has its calls

    cutoff = NOW - timedelta(days=40)
    assert await delete_requests(engine, cutoff, batch=2) == 4  # two full batches, one empty
    kept = {"old-lifetime", "new-monthly", "new-lifetime", "new-anonymous"}
    for table in (requests, calls, feedback, request_tags):
        assert await ids_in(engine, table) == kept, table.name
    assert await budget_spend(engine, [lifetime.key_id]) == lifetime_spend
    assert await delete_requests(engine, cutoff) == 0


def both_steps(engine: AsyncEngine) -> tuple[LedgerRetention, GatewayMetrics]:
    """A task that deletes requests older than 40 days and clears content older than 30,
    and the metrics it counts in."""
    metrics = GatewayMetrics(CollectorRegistry(), models=[], policies=[])
    task = LedgerRetention(
        engine,
        content_days=30,
        request_days=40,
        interval_s=3600,
        metrics=metrics,
        clock=lambda: NOW,
    )
    return task, metrics


async def test_the_retention_task_deletes_old_requests_and_counts_them(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    await load(engine, make_settings(log_content="full"), [50, 35, 1])  # r00, r01, r02
    task, metrics = both_steps(engine)
    # r00 is deleted (not cleared first), r01 loses its content, r02 keeps both.
    assert await task.run_once() == RetentionRun(content_dropped=1, requests_deleted=1)
    assert await contents(engine) == {"r01": False, "r02": True}
    assert metrics.registry.get_sample_value("xrouter_ledger_requests_deleted_total") == 1
    assert await task.run_once() == RetentionRun()


async def test_a_deletion_is_counted_though_the_content_step_then_fails(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    """The database refuses the content step's UPDATE (a trigger: a real refusal, as a
    permission or a lock timeout would be) after the old requests were deleted: the
    deletion stands, so it is counted; the failure is logged as an outage."""
    await load(engine, make_settings(log_content="full"), [50, 35, 1])  # r00, r01, r02
    frozen = {
        "sqlite": [
            "CREATE TRIGGER frozen BEFORE UPDATE ON requests "
            "BEGIN SELECT RAISE(ABORT, 'requests are frozen'); END"
        ],
        "postgresql": [
            "CREATE FUNCTION frozen() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'requests are frozen'; END $$",
            "CREATE TRIGGER frozen BEFORE UPDATE ON requests "
            "FOR EACH ROW EXECUTE FUNCTION frozen()",
        ],
    }[engine.dialect.name]
    async with engine.begin() as conn:
        for statement in frozen:
            await conn.execute(sa.text(statement))
    task, metrics = both_steps(engine)
    assert await task.run_once() == RetentionRun(requests_deleted=1)
    assert await contents(engine) == {"r01": True, "r02": True}  # r01 kept its content
    assert metrics.registry.get_sample_value("xrouter_ledger_requests_deleted_total") == 1
    assert metrics.registry.get_sample_value("xrouter_ledger_content_dropped_total") == 0


def test_request_retention_must_keep_a_whole_month() -> None:
    """The budgets of the current day, week or month are restored from the ledger's rows:
    a retention shorter than the longest period could lose part of one."""
    with pytest.raises(ValueError, match="request_retention_days"):
        LedgerSettings(request_retention_days=31)
    assert LedgerSettings(request_retention_days=32).request_retention_days == 32


async def test_a_deletion_waits_for_the_ledger_writer_instead_of_failing(
    engine: AsyncEngine,
) -> None:
    """Batches deleted while the gateway's writer inserts: on SQLite a batch that had read
    its ids could not wait for the write lock and failed with "database is locked" (found
    by bench/ledger_retention.py); it takes the lock at BEGIN now."""
    inserter = BatchInserter(engine, "none", timeout_s=30)
    old = NOW.timestamp() - 50 * DAY
    await inserter.insert(
        [make_request(f"old{i:05d}", created_at=old, key_id=None) for i in range(3000)]
    )
    stop = asyncio.Event()

    async def write() -> int:
        n = 0
        while not stop.is_set():
            await inserter.insert([make_request(f"new{n:05d}-{j}", key_id=None) for j in range(20)])
            n += 1
            await asyncio.sleep(0)
        return n

    writer = asyncio.create_task(write())
    try:
        deleted = await delete_requests(engine, NOW - timedelta(days=40), batch=50)
    finally:
        stop.set()
        batches = await writer
    assert deleted == 3000 and batches > 0
