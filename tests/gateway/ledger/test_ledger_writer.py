from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import schema
from gateway.ledger.records import RequestRecord, messages_sha256
from gateway.ledger.store import create_ledger_engine, open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings

from .factories import RecordingSink, count, make_feedback, make_request, request_ids

Settings = Callable[..., LedgerSettings]


def journal_files(spill_dir: Path) -> list[str]:
    return sorted(p.name for p in spill_dir.glob("*.jsonl") if not p.name.startswith("rejected"))


def dir_listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def rejected_ids(spill_dir: Path) -> list[str]:
    return [
        json.loads(line)["record"]["request_id"]
        for f in spill_dir.glob("rejected-*.jsonl")
        for line in f.read_text().splitlines()
    ]


async def wait_for(predicate: Callable[[], Any], limit_s: float = 5.0) -> None:
    """Poll until ``predicate()`` is true (the background flusher is what is tested)."""
    for _ in range(int(limit_s / 0.01)):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def test_a_full_batch_is_flushed_in_one_transaction(
    engine: AsyncEngine, make_settings: Settings, sink: RecordingSink
) -> None:
    commits: list[int] = []
    event.listen(engine.sync_engine, "commit", lambda conn: commits.append(1))
    writer = LedgerWriter(engine, make_settings(flush_rows=10), sink)
    await writer.start()
    try:
        for i in range(10):
            writer.submit(make_request(f"r{i:03d}", router_cost=7, models=("a", "b")))
        # flush_rows reached: the flusher runs without waiting for the (60 s) interval.
        await wait_for(lambda: _has(engine, "requests", 10))
        assert len(commits) == 1
        assert await count(engine, "calls") == 30
        assert sink.flushed_total == 10

        for i in range(10, 15):
            writer.submit(make_request(f"r{i:03d}"))
        await asyncio.sleep(0.2)
        assert await count(engine, "requests") == 10  # below flush_rows, before the interval
        await writer.flush()
        assert await count(engine, "requests") == 15
        assert len(commits) == 2
    finally:
        await writer.close()


async def _has(engine: AsyncEngine, table: str, n: int) -> bool:
    return await count(engine, table) >= n


async def test_the_interval_flushes_a_partial_batch(
    engine: AsyncEngine, make_settings: Settings
) -> None:
    writer = LedgerWriter(engine, make_settings(flush_interval_ms=20))
    await writer.start()
    try:
        writer.submit(make_request("only-one"))
        writer.submit(make_feedback("only-one", 0.75))
        await wait_for(lambda: _has(engine, "feedback", 1))
        assert await request_ids(engine) == ["only-one"]
    finally:
        await writer.close()


async def test_rows_hold_what_was_submitted(engine: AsyncEngine, make_settings: Settings) -> None:
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    rec = make_request("exact", router_cost=123, models=("m1", "m2"), call_costs=(1000, 2345))
    rec.calls[2].fallback_from = "m1"
    rec.calls[2].attempts = 2
    writer.submit(rec)
    await writer.close()
    async with engine.connect() as conn:
        row = (await conn.execute(sa.select(schema.requests))).one()._mapping
        calls = (await conn.execute(sa.select(schema.calls).order_by(schema.calls.c.seq))).all()
    assert row["total_cost_micros"] == 123 + 1000 + 2345
    assert (row["router_cost_micros"], row["downstream_cost_micros"]) == (123, 3345)
    assert row["created_at"].timestamp() == pytest.approx(rec.created_at, abs=1e-5)
    assert row["decision"] == rec.decision
    assert row["stream"] is False
    assert [(c.role, c.model, c.cost_micros, c.seq) for c in calls] == [
        ("router", "xrouter-router", 123, 0),
        ("downstream", "m1", 1000, 1),
        ("downstream", "m2", 2345, 2),
    ]
    assert (calls[2].fallback_from, calls[2].attempts) == ("m1", 2)
    assert sum(c.cost_micros for c in calls) == row["total_cost_micros"]


@pytest.mark.parametrize("mode", ["none", "hash", "full"])
async def test_log_content_decides_what_is_stored(
    engine: AsyncEngine, make_settings: Settings, spill_dir: Path, mode: str
) -> None:
    writer = LedgerWriter(engine, make_settings(log_content=mode))
    await writer.start()
    rec = make_request("c1", response_text="the secret answer")
    messages = list(rec.messages or [])
    writer.submit(rec)
    await writer.close()
    async with engine.connect() as conn:
        content = (await conn.execute(sa.select(schema.requests.c.content))).scalar_one()
    if mode == "none":
        assert content is None
    elif mode == "hash":
        assert content == {
            "prompt_sha256": messages_sha256(messages),
            "response_sha256": hashlib.sha256(b"the secret answer").hexdigest(),
        }
    else:
        assert content == {"messages": messages, "response": "the secret answer"}


async def test_duplicates_are_stored_once(engine: AsyncEngine, make_settings: Settings) -> None:
    writer = LedgerWriter(engine, make_settings())
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
        assert (await count(engine, "requests"), await count(engine, "calls")) == (1, 2)
        assert await count(engine, "feedback") == 1
    finally:
        await writer.close()


async def test_database_down_spills_and_replays_without_loss_or_duplicates(
    backend: str,
    tmp_path: Path,
    spill_dir: Path,
    sink: RecordingSink,
    request: pytest.FixtureRequest,
) -> None:
    # A database that does not exist yet: a SQLite file in a missing directory, or a
    # PostgreSQL database that has not been created.
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path}/later/ledger.db"
    else:
        from .factories import pg_admin, pg_url

        name = request.getfixturevalue("pg_scratch")("down")
        url = pg_url(name)
    settings = LedgerSettings(url=url, spill_dir=str(spill_dir), flush_interval_ms=60_000)
    down_engine = create_ledger_engine(url)
    writer = LedgerWriter(down_engine, settings, sink)
    await writer.start()
    records = [make_request(f"s{i:02d}", models=("a", "b")) for i in range(30)]
    try:
        for r in records[:20]:
            writer.submit(r)
        for r in records[20:]:
            await writer.submit_durable(r)  # acknowledged from the journal
        writer.submit(make_feedback("s00", 0.5))
        await writer.flush()
        assert sink.errors["db"] >= 1
        assert sum(sink.spills.values()) >= 31
        assert journal_files(spill_dir)
        assert writer.pending == 0

        # The database comes back.
        if backend == "sqlite":
            ready = await open_ledger_engine(url)
        else:
            await pg_admin(f'CREATE DATABASE "{name}"')
            ready = await open_ledger_engine(url)
        try:
            for r in records[:5]:
                writer.submit(r)  # resubmitted: must not be duplicated
            await writer.flush()
            assert await request_ids(ready) == [r.request_id for r in records]
            assert await count(ready, "calls") == 60
            assert await count(ready, "feedback") == 1
            assert journal_files(spill_dir) == []
        finally:
            await ready.dispose()
    finally:
        await writer.close()
        await down_engine.dispose()


@pytest.mark.postgres
async def test_postgres_vanishing_mid_run_loses_nothing(
    pg_scratch: Callable[[str], str], spill_dir: Path, sink: RecordingSink
) -> None:
    from .factories import pg_admin, pg_url

    name = pg_scratch("mid")
    await pg_admin(f'CREATE DATABASE "{name}"')
    url = pg_url(name)
    engine = await open_ledger_engine(url)
    writer = LedgerWriter(
        engine, LedgerSettings(url=url, spill_dir=str(spill_dir), flush_interval_ms=60_000), sink
    )
    await writer.start()
    try:
        for i in range(10):
            writer.submit(make_request(f"m{i:02d}"))
        await writer.flush()
        # Pull the database away under the writer (its pooled connections die with it).
        await pg_admin(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'",
            f'ALTER DATABASE "{name}" RENAME TO "{name}_away"',
        )
        for i in range(10, 20):
            await writer.submit_durable(make_request(f"m{i:02d}"))
        for i in range(20, 25):
            writer.submit(make_request(f"m{i:02d}"))
        await writer.flush()
        assert sink.errors["db"] >= 1
        assert journal_files(spill_dir)

        await pg_admin(f'ALTER DATABASE "{name}_away" RENAME TO "{name}"')
        await writer.flush()
        assert await request_ids(engine) == [f"m{i:02d}" for i in range(25)]
        assert journal_files(spill_dir) == []
    finally:
        await writer.close()
        await engine.dispose()


async def test_a_full_queue_spills_and_is_replayed(
    engine: AsyncEngine, make_settings: Settings, spill_dir: Path, sink: RecordingSink
) -> None:
    writer = LedgerWriter(engine, make_settings(queue_size=5, flush_rows=1000), sink)
    await writer.start()
    try:
        for i in range(20):  # no await in between: the flusher can't make room
            writer.submit(make_request(f"q{i:02d}"))
        await writer.flush()
        assert sink.spills["queue_full"] == 15
        assert await request_ids(engine) == [f"q{i:02d}" for i in range(20)]
        assert journal_files(spill_dir) == []
    finally:
        await writer.close()


async def test_close_drains_everything_and_cleans_up(
    engine: AsyncEngine, make_settings: Settings, spill_dir: Path
) -> None:
    writer = LedgerWriter(engine, make_settings(flush_rows=7))
    await writer.start()
    for i in range(50):
        writer.submit(make_request(f"c{i:02d}"))
    for i in range(50, 60):
        await writer.submit_durable(make_request(f"c{i:02d}"))
    await writer.close()
    assert await count(engine, "requests") == 60
    assert dir_listing(spill_dir) == []  # journal segments and lock file are gone
    await writer.close()  # idempotent


async def test_a_record_the_database_refuses_is_set_aside(
    engine: AsyncEngine, make_settings: Settings, spill_dir: Path, sink: RecordingSink
) -> None:
    writer = LedgerWriter(engine, make_settings(), sink)
    await writer.start()
    bad = make_request("bad")
    bad.policy = None  # type: ignore[assignment]  # violates NOT NULL
    try:
        writer.submit(make_request("good-1"))
        writer.submit(bad)
        writer.submit(make_request("good-2"))
        await writer.flush()
        assert await request_ids(engine) == ["good-1", "good-2"]
        assert sink.errors["data"] == 1
        assert journal_files(spill_dir) == []  # not retried forever
        assert rejected_ids(spill_dir) == ["bad"]
    finally:
        await writer.close()


async def test_text_either_database_can_store_is_fitted_not_refused(
    engine: AsyncEngine, make_settings: Settings, spill_dir: Path
) -> None:
    # A client controls the requested model's name and feedback text: a NUL character
    # (PostgreSQL's text types refuse it) or a name longer than its VARCHAR must not cost
    # the request its ledger row, nor hold up the rows batched with it.
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    nul, long = make_request("nul"), make_request("long")
    nul.requested_model = "gpt\x00-4"
    long.requested_model = "m" * 400
    note = make_feedback("nul", 0.5)
    note.comment = "fine\x00print"
    try:
        for record in (make_request("before"), nul, long, note, make_request("after")):
            writer.submit(record)
        await writer.flush()
        async with engine.connect() as conn:
            models = dict(
                (
                    await conn.execute(
                        sa.select(schema.requests.c.request_id, schema.requests.c.requested_model)
                    )
                ).all()
            )
            comment = (await conn.execute(sa.select(schema.feedback.c.comment))).scalar_one()
        assert sorted(models) == ["after", "before", "long", "nul"]
        assert models["nul"] == "gpt\ufffd-4" and models["long"] == "m" * 255
        assert comment == "fine\ufffdprint"
        assert rejected_ids(spill_dir) == [] and journal_files(spill_dir) == []
    finally:
        await writer.close()


async def test_a_value_the_database_refuses_is_set_aside_not_retried(
    backend: str, engine: AsyncEngine, make_settings: Settings, spill_dir: Path, sink: RecordingSink
) -> None:
    # PostgreSQL's INTEGER is 32-bit; asyncpg reports the refusal as a generic driver error
    # whose SQLSTATE (class 22, data exception) marks it as the data's fault: that record is
    # set aside, the rest of its batch stored, nothing retried forever.
    if backend != "postgresql":
        pytest.skip("SQLite stores any 64-bit integer")
    writer = LedgerWriter(engine, make_settings(), sink)
    await writer.start()
    bad = make_request("huge")
    bad.calls[0].attempts = 2**31
    try:
        writer.submit(make_request("good-1"))
        writer.submit(bad)
        writer.submit(make_request("good-2"))
        await writer.flush()
        assert await request_ids(engine) == ["good-1", "good-2"]
        assert rejected_ids(spill_dir) == ["huge"] and journal_files(spill_dir) == []
        assert sink.errors["data"] == 1
    finally:
        await writer.close()


async def test_a_stopped_writers_journal_is_adopted_but_a_live_ones_is_not(
    backend: str, ledger_url: str, tmp_path: Path, spill_dir: Path
) -> None:
    down_url = (
        f"sqlite+aiosqlite:///{tmp_path}/nowhere/x.db"
        if backend == "sqlite"
        else ledger_url.rsplit("/", 1)[0] + "/xrouter_test_does_not_exist"
    )
    settings = LedgerSettings(url=down_url, spill_dir=str(spill_dir), flush_interval_ms=60_000)
    down = create_ledger_engine(down_url)
    live = LedgerWriter(down, settings)
    stopped = LedgerWriter(down, settings)
    await live.start()
    await stopped.start()
    for i in range(5):
        live.submit(make_request(f"live{i}"))
        stopped.submit(make_request(f"stopped{i}"))
    await live.flush()
    await stopped.close()  # the database is down: its records stay in its journal

    engine = await open_ledger_engine(ledger_url)
    successor = LedgerWriter(engine, LedgerSettings(url=ledger_url, spill_dir=str(spill_dir)))
    try:
        await successor.start()
        assert successor.adopted_at_start == 1 and live.adopted_at_start == 0
        await successor.flush()
        assert await request_ids(engine) == [f"stopped{i}" for i in range(5)]
        assert any(live._journal.owner in name for name in journal_files(spill_dir))
    finally:
        await successor.close()
        await live.close()
        await down.dispose()
        await engine.dispose()


async def test_a_shutdown_does_not_wait_for_a_long_replay(
    backend: str, ledger_url: str, tmp_path: Path, spill_dir: Path
) -> None:
    """A journal of hours of traffic (an outage's) is replayed in the background; a SIGTERM
    meanwhile must not hold the graceful shutdown until it is all in. The rest stays in
    the journal, and the next writer replays it, nothing twice."""
    down_url = (
        f"sqlite+aiosqlite:///{tmp_path}/nowhere/x.db"
        if backend == "sqlite"
        else ledger_url.rsplit("/", 1)[0] + "/xrouter_test_does_not_exist"
    )
    down = create_ledger_engine(down_url)
    outage = LedgerWriter(
        down, LedgerSettings(url=down_url, spill_dir=str(spill_dir), flush_interval_ms=60_000)
    )
    await outage.start()
    n = 5000
    for i in range(n):
        outage.submit(make_request(f"r{i:05d}"))
    await outage.close()  # the database is down: all of it in the journal
    await down.dispose()

    engine = await open_ledger_engine(ledger_url)
    settings = LedgerSettings(url=ledger_url, spill_dir=str(spill_dir))
    try:
        # 500 chunks of 10: seconds of replay, which the shutdown must not wait for.
        interrupted = LedgerWriter(engine, settings.model_copy(update={"flush_rows": 10}))
        await interrupted.start()
        while not await request_ids(engine):  # noqa: ASYNC110 - the replay is under way
            await asyncio.sleep(0.01)
        await interrupted.close()
        done = len(await request_ids(engine))
        assert 0 < done < n  # it stopped at a chunk's end, not at the journal's
        successor = LedgerWriter(engine, settings)
        await successor.start()
        await successor.flush()
        await successor.close()
        assert await request_ids(engine) == [f"r{i:05d}" for i in range(n)]
        assert journal_files(spill_dir) == []
    finally:
        await engine.dispose()


def test_records_round_trip_through_json() -> None:
    rec = make_request("rt", router_cost=5, models=("a", "b"))
    rec.decision = {"policy": "compact", "actions": ["b"], "propensities": [0.5]}
    back = RequestRecord.from_json(orjson.loads(orjson.dumps(rec.to_json())))
    assert back == rec
    fb = make_feedback("rt", 1.0)
    assert type(fb).from_json(orjson.loads(orjson.dumps(fb.to_json()))) == fb
    with pytest.raises(ValueError):
        make_feedback("rt", 1.5)


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("log_content", ["hash", "full"])
async def test_content_json_cannot_encode_neither_stalls_the_writer_nor_costs_rows(
    log_content: str, engine: AsyncEngine, make_settings: Settings, spill_dir: Path
) -> None:
    # orjson parses request bodies nested 1,024 deep but encodes only 254 levels, and the
    # stdlib JSON parser behind LiteLLM's providers accepts a lone surrogate ("\ud800") that
    # no UTF-8 encoder takes. Such content must neither wedge the journal thread (every
    # later request waits for its row to be journaled) nor hold up the rows batched with it.
    writer = LedgerWriter(engine, make_settings(log_content=log_content))
    await writer.start()
    deep = make_request("deep", messages=[{"role": "user", "content": "hi", "x": _deep(300)}])
    lone = make_request("lone", response_text="broken \ud83d emoji")
    try:
        async with asyncio.timeout(10):
            await writer.submit_durable(make_request("before"))
            await writer.submit_durable(deep)
            await writer.submit_durable(lone)
            await writer.submit_durable(make_request("after"))
            await writer.flush()
        assert await request_ids(engine) == ["after", "before", "deep", "lone"]
        assert rejected_ids(spill_dir) == []
        async with engine.connect() as conn:
            stored = dict(
                (
                    await conn.execute(
                        sa.select(schema.requests.c.request_id, schema.requests.c.content)
                    )
                ).all()
            )
        # What could be kept was: the answer with its broken character replaced.
        if log_content == "full":
            assert stored["lone"]["response"] == "broken \ufffd emoji"
            assert stored["deep"]["messages"][0]["content"] == "hi"
        else:
            assert stored["lone"]["response_sha256"] and stored["deep"]["prompt_sha256"]
    finally:
        async with asyncio.timeout(10):
            await writer.close()
    assert dir_listing(spill_dir) == []  # every journaled record was committed


async def test_a_flush_its_caller_gives_up_on_loses_no_record(
    backend: str,
    make_settings: Settings,
    sink: RecordingSink,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """A caller that bounds ``flush()`` (the budget sync waits 10 s for it) gives up while
    the database hangs mid-insert. The batch is out of the queue by then: it must still
    reach the database once the hang ends — not vanish with the caller, and not count a
    healthy database as failed (the breaker would send the next batches to the journal)."""
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path}/db/ledger.db"
        proxy = None
    else:
        proxy, url = request.getfixturevalue("proxied_pg")
    engine = await open_ledger_engine(url)
    writer = LedgerWriter(engine, make_settings(url=url), sink, db_timeout_s=30.0)
    await writer.start()
    blocker = None
    try:
        await writer.flush()  # the start's own flush cycle is done: the hang meets ours
        for i in range(5):
            writer.submit(make_request(f"g{i}"))  # fire and forget: in memory only
        # The database hangs: SQLite's write lock held by another process, or PostgreSQL
        # behind a frozen proxy.
        if proxy is None:
            blocker = sqlite3.connect(f"{tmp_path}/db/ledger.db", isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
        else:
            proxy.freeze()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(writer.flush(), 0.5)
        if blocker is not None:
            blocker.execute("ROLLBACK")
            blocker.close()
            blocker = None
        if proxy is not None:
            proxy.restore()
        await writer.flush()
        assert await request_ids(engine) == [f"g{i}" for i in range(5)]
        assert (sink.spills, sink.errors) == ({}, {})
    finally:
        if blocker is not None:
            blocker.close()
        await writer.close()
        await engine.dispose()
