"""``xrouter_ledger_rows_total`` counts the records the database newly stored, once each:
a replay of journal segments holding records that are in already (a WAL segment partly
committed before an outage or a queue overflow, a dead writer's WAL after ``kill -9``) and a
resubmitted record are stored once (``ON CONFLICT DO NOTHING``) and counted once. Measured
with the gateway's Prometheus metrics in a fresh registry, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.inserter import BatchInserter
from gateway.ledger.records import LedgerRecord
from gateway.ledger.store import open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.metrics import GatewayMetrics
from gateway.settings import LedgerSettings

from .factories import count, make_feedback, make_request, pg_admin, pg_url, request_ids
from .test_ledger_durable import N, run_child_and_kill

Settings = Callable[..., LedgerSettings]


def prometheus() -> tuple[CollectorRegistry, GatewayMetrics]:
    registry = CollectorRegistry()
    return registry, GatewayMetrics(registry, models=["a", "b"], policies=["llm"])


def rows_total(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("xrouter_ledger_rows_total")


async def stored(engine: AsyncEngine) -> int:
    return await count(engine, "requests") + await count(engine, "feedback")


def journal_files(spill_dir: Path) -> list[str]:
    return sorted(p.name for p in spill_dir.glob("*.jsonl") if not p.name.startswith("rejected"))


async def test_the_inserter_reports_the_records_it_newly_stored(engine: AsyncEngine) -> None:
    inserter = BatchInserter(engine, "none", timeout_s=10)
    batch: list[LedgerRecord] = [
        make_request("a", models=("m1", "m2")),
        make_request("b"),
        make_feedback("a", 1.0),
    ]
    assert (await inserter.write(batch)).written == 3  # calls are not records
    assert (await inserter.write(batch)).written == 0  # a replay of records already in
    more = [make_request("b"), make_request("c"), make_request("c")]
    assert (await inserter.write(more)).written == 1
    # Refused records are isolated: the others are counted, the refused one is not.
    bad = make_request("bad")
    bad.policy = None  # type: ignore[assignment]  # violates NOT NULL
    result = await inserter.write([make_request("d"), bad, make_request("a")])
    assert (result.written, [r.request_id for r, _ in result.refused]) == (1, ["bad"])
    assert await stored(engine) == 5


async def test_resubmitted_records_are_counted_once(
    engine: AsyncEngine, make_settings: Settings
) -> None:
    registry, metrics = prometheus()
    writer = LedgerWriter(engine, make_settings(), metrics)
    await writer.start()
    try:
        fb = make_feedback("d1", 0.5)
        for _ in range(2):  # twice in one batch
            writer.submit(make_request("d1", models=("a", "b")))
            writer.submit(fb)
        await writer.flush()
        writer.submit(make_request("d1", models=("a", "b")))  # again in a later batch
        writer.submit(fb)
        await writer.flush()
    finally:
        await writer.close()
    assert await stored(engine) == 2
    assert rows_total(registry) == 2


async def test_a_partly_committed_wal_segment_replayed_is_counted_once(
    engine: AsyncEngine, make_settings: Settings, spill_dir: Path
) -> None:
    # Durable records are journaled in one WAL segment; a queue of 5 takes 5 of them to the
    # database, the others stay in the segment only, so the whole segment (the 5 committed
    # records included) is replayed.
    registry, metrics = prometheus()
    writer = LedgerWriter(engine, make_settings(queue_size=5, flush_rows=1000), metrics)
    await writer.start()
    try:
        await asyncio.gather(*(writer.submit_durable(make_request(f"w{i:02d}")) for i in range(20)))
        await writer.flush()
        assert await request_ids(engine) == [f"w{i:02d}" for i in range(20)]
        assert journal_files(spill_dir) == []
    finally:
        await writer.close()
    assert rows_total(registry) == 20


async def test_a_restart_replaying_a_killed_writers_journal_counts_only_new_records(
    ledger_url: str, engine: AsyncEngine, spill_dir: Path
) -> None:
    # The child commits half of its durable records, journals the rest and is killed: its
    # WAL holds both halves (the committed half's segment was never retired).
    await run_child_and_kill(ledger_url, spill_dir, "db_up")
    before = await stored(engine)
    assert before == N // 2

    registry, metrics = prometheus()
    writer = LedgerWriter(engine, LedgerSettings(url=ledger_url, spill_dir=str(spill_dir)), metrics)
    await writer.start()
    try:
        await writer.flush()
        assert journal_files(spill_dir) == []
    finally:
        await writer.close()
    assert await stored(engine) == N + 1  # every request and the feedback, none twice
    assert rows_total(registry) == N + 1 - before


@pytest.mark.postgres
async def test_a_database_outage_replay_counts_each_record_once(
    pg_scratch: Callable[[str], str], spill_dir: Path
) -> None:
    name = pg_scratch("rows")
    await pg_admin(f'CREATE DATABASE "{name}"')
    url = pg_url(name)
    engine = await open_ledger_engine(url)
    registry, metrics = prometheus()
    settings = LedgerSettings(url=url, spill_dir=str(spill_dir), flush_interval_ms=60_000)
    writer = LedgerWriter(engine, settings, metrics)
    await writer.start()
    try:
        # Committed, but their WAL segment stays open (it is retired whole).
        for i in range(10):
            await writer.submit_durable(make_request(f"o{i:02d}"))
        await writer.flush()
        assert rows_total(registry) == 10

        # The database goes away: the next durable records (same WAL segment) and plain
        # ones cannot be committed.
        await pg_admin(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            f'ALTER DATABASE "{name}" RENAME TO "{name}_away"',
        )
        for i in range(10, 20):
            await writer.submit_durable(make_request(f"o{i:02d}"))
        for i in range(20, 25):
            writer.submit(make_request(f"o{i:02d}"))
        await writer.flush()
        assert rows_total(registry) == 10

        # It comes back: the journal (the committed ten included) is replayed.
        await pg_admin(f'ALTER DATABASE "{name}_away" RENAME TO "{name}"')
        await writer.flush()
        assert await request_ids(engine) == [f"o{i:02d}" for i in range(25)]
        assert journal_files(spill_dir) == []
    finally:
        await writer.close()
        await engine.dispose()
    assert rows_total(registry) == 25
