"""Content retention on SQLite and PostgreSQL: old requests lose their prompt and answer and
keep everything else."""

from __future__ import annotations

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
from gateway.ledger.retention import ContentRetention, drop_content
from gateway.ledger.schema import requests
from gateway.ledger.spend import spend_report
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
    task = ContentRetention(engine, days=1, interval_s=3600, metrics=metrics, clock=lambda: NOW)
    assert await task.run_once() == 2
    assert await task.run_once() == 0
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
    task = ContentRetention(down, days=1, interval_s=3600, clock=lambda: NOW)
    try:
        with caplog.at_level(logging.ERROR, logger="gateway.ledger.retention"):
            assert await task.run_once() == 0
            assert await task.run_once() == 0
        assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    finally:
        await down.dispose()
