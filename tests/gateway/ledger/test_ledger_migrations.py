from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import schema
from gateway.ledger.export import export_ledger, read_export
from gateway.ledger.inserter import BatchInserter
from gateway.ledger.keys import DuplicateAliasError, KeyRepository
from gateway.ledger.migrations import (
    MIGRATIONS,
    Migration,
    MigrationError,
    current_version,
    latest_version,
    migrate,
)
from gateway.ledger.records import LedgerRecord, RequestRecord, build_rows
from gateway.ledger.store import create_ledger_engine, open_ledger_engine, sqlite_file

from .factories import make_feedback, make_request


async def _engine(url: str) -> AsyncEngine:
    path = sqlite_file(sa.make_url(url))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return create_ledger_engine(url)


def _describe(conn: sa.Connection) -> dict[str, object]:
    insp = sa.inspect(conn)
    out: dict[str, object] = {"tables": sorted(insp.get_table_names())}
    for table in schema.metadata.sorted_tables:
        out[table.name] = {
            "columns": {c["name"]: c["nullable"] for c in insp.get_columns(table.name)},
            # PostgreSQL also lists the indexes behind unique constraints.
            "indexes": sorted(
                str(i["name"])
                for i in insp.get_indexes(table.name)
                if not i.get("duplicates_constraint")
            ),
            "unique": sorted(str(u["name"]) for u in insp.get_unique_constraints(table.name)),
            "pk": insp.get_pk_constraint(table.name)["constrained_columns"],
        }
    return out


def _expected() -> dict[str, object]:
    out: dict[str, object] = {
        "tables": sorted([*schema.metadata.tables, "schema_version"]),
    }
    for table in schema.metadata.sorted_tables:
        out[table.name] = {
            "columns": {c.name: c.nullable for c in table.columns},
            "indexes": sorted(str(i.name) for i in table.indexes),
            "unique": sorted(
                str(c.name) for c in table.constraints if isinstance(c, sa.UniqueConstraint)
            ),
            "pk": [c.name for c in table.primary_key.columns],
        }
    return out


# Feedback columns and the migration that added each (the rest are the baseline's).
_FEEDBACK_ADDED = {
    "logged_at": 13,
    **dict.fromkeys(("reward", "cost_usd", "cost_weight", "normalized_cost", "penalty"), 15),
}


def _feedback_as_of(version: int) -> sa.Table:
    """The feedback table as a release at schema ``version`` writes it."""
    return sa.Table(
        "feedback",
        sa.MetaData(),
        *(
            sa.Column(c.name, c.type, primary_key=c.primary_key)
            for c in schema.feedback.columns
            if _FEEDBACK_ADDED.get(c.name, 1) <= version
        ),
    )


# Calls columns added after the baseline, and the migration that added each.
_CALLS_ADDED = {"deployment": 9, "fallback_reason": 16}


def _calls_as_of(version: int) -> sa.Table:
    """The calls table as a release at schema ``version`` writes it."""
    return sa.Table(
        "calls",
        sa.MetaData(),
        *(
            sa.Column(c.name, c.type, primary_key=c.primary_key)
            for c in schema.calls.columns
            if _CALLS_ADDED.get(c.name, 1) <= version
        ),
    )


def _only(rows: list[dict[str, Any]], table: sa.Table) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k in table.c} for row in rows]


async def test_upgrading_an_empty_database_gives_the_current_schema(ledger_url: str) -> None:
    engine = await _engine(ledger_url)
    try:
        assert await current_version(engine) == 0
        assert await migrate(engine) == latest_version() == MIGRATIONS[-1].version
        assert await current_version(engine) == latest_version()
        async with engine.connect() as conn:
            assert await conn.run_sync(_describe) == _expected()
    finally:
        await engine.dispose()


async def test_rerunning_migrations_changes_nothing(ledger_url: str) -> None:
    engine = await open_ledger_engine(ledger_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                schema.feedback.insert().values(
                    feedback_id="f1",
                    request_id="r1",
                    score=1.0,
                    source="t",
                    created_at=sa.func.now(),
                )
            )
        for _ in range(2):
            assert await migrate(engine) == latest_version()
            second = await open_ledger_engine(ledger_url)
            await second.dispose()
        async with engine.connect() as conn:
            versions = (await conn.execute(sa.text("SELECT version FROM schema_version"))).all()
            kept = (await conn.execute(sa.text("SELECT count(*) FROM feedback"))).scalar_one()
        assert [v[0] for v in versions] == [m.version for m in MIGRATIONS]
        assert kept == 1
    finally:
        await engine.dispose()


async def test_concurrent_startups_migrate_once(ledger_url: str) -> None:
    engines = [await _engine(ledger_url) for _ in range(3)]
    try:
        versions = await asyncio.gather(*(migrate(e) for e in engines))
        assert versions == [latest_version()] * 3
        async with engines[0].connect() as conn:
            rows = (await conn.execute(sa.text("SELECT count(*) FROM schema_version"))).scalar()
        assert rows == len(MIGRATIONS)
    finally:
        for e in engines:
            await e.dispose()


def _add_note_column(conn: sa.Connection) -> None:
    conn.execute(sa.text("ALTER TABLE api_keys ADD COLUMN note VARCHAR(40)"))


def _half_done_then_fail(conn: sa.Connection) -> None:
    conn.execute(sa.text("CREATE TABLE half_done (x INTEGER)"))
    raise RuntimeError("step 3 broke")


async def test_a_new_step_runs_once_and_a_failing_step_rolls_back(ledger_url: str) -> None:
    engine = await _engine(ledger_url)
    steps = [*MIGRATIONS, Migration(latest_version() + 1, "add note", _add_note_column)]
    try:
        assert await migrate(engine, steps) == latest_version() + 1
        assert await migrate(engine, steps) == latest_version() + 1  # no second ALTER

        failing = [*steps, Migration(latest_version() + 2, "broken", _half_done_then_fail)]
        with pytest.raises(MigrationError, match="step 3 broke"):
            await migrate(engine, failing)
        assert await current_version(engine) == latest_version() + 1
        async with engine.connect() as conn:
            tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
            cols = await conn.run_sync(
                lambda c: [x["name"] for x in sa.inspect(c).get_columns("api_keys")]
            )
        assert "half_done" not in tables  # the DDL was rolled back with the step
        assert "note" in cols

        # An older release on a newer database keeps working (steps are additive).
        assert await migrate(engine) == latest_version() + 1
    finally:
        await engine.dispose()


async def test_steps_must_be_ordered(tmp_path: Path) -> None:
    engine = await _engine(f"sqlite+aiosqlite:///{tmp_path}/x.db")
    try:
        bad = [Migration(2, "b", _add_note_column), Migration(1, "a", _add_note_column)]
        with pytest.raises(MigrationError, match="ascending"):
            await migrate(engine, bad)
        assert await current_version(engine) == 0
    finally:
        await engine.dispose()


async def test_sqlite_is_opened_in_wal_mode(tmp_path: Path) -> None:
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{tmp_path}/deep/dir/l.db")
    try:
        async with engine.connect() as conn:
            mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
            sync = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar()
            busy = (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar()
        assert (mode, sync, busy) == ("wal", 1, 5000)  # synchronous=1 is NORMAL
    finally:
        await engine.dispose()


async def test_requests_logged_before_the_api_column_read_as_chat(ledger_url: str) -> None:
    """Migration 3 adds ``requests.api``: rows written before it, and rows an older release
    writes after a rollback (without the column), read as chat requests."""
    engine = await _engine(ledger_url)
    row = {
        "created_at": sa.func.now(), "key_id": None, "policy": "compact",
        "requested_model": "xrouter", "final_model": "m", "status": 200, "error_type": None,
        "total_cost_micros": 1, "router_cost_micros": 0, "downstream_cost_micros": 1,
        "prompt_tokens": 1, "completion_tokens": 1, "latency_ms": 1.0, "overhead_ms": 0.1,
        "cost_weight": None, "decision": None, "content": None, "stream": False,
    }  # fmt: skip
    # The requests table as releases before migration 3 wrote it: no api column.
    old = sa.Table(
        "requests",
        sa.MetaData(),
        *(sa.Column(c.name, c.type) for c in schema.requests.columns if c.name != "api"),
    )
    try:
        assert await migrate(engine, MIGRATIONS[:2]) == 2
        async with engine.begin() as conn:
            await conn.execute(sa.insert(old).values(request_id="before", **row))
        assert await migrate(engine) == latest_version()
        async with engine.begin() as conn:
            await conn.execute(sa.insert(old).values(request_id="rolled-back", **row))
            await conn.execute(
                sa.insert(schema.requests).values(request_id="new", api="responses", **row)
            )
            got = dict(
                (
                    await conn.execute(
                        sa.select(schema.requests.c.request_id, schema.requests.c.api)
                    )
                ).all()
            )
        assert got == {"before": "chat", "rolled-back": "chat", "new": "responses"}
        # Migration 4's requests.cached_from: rows that never came from the answer cache,
        # including an older release's inserts, read as not cached.
        async with engine.connect() as conn:
            cached = (await conn.execute(sa.select(schema.requests.c.cached_from))).scalars()
            assert list(cached) == [None, None, None]
            # Migration 6's requests.end_user: nobody named, as for a request without ``user``.
            users = (await conn.execute(sa.select(schema.requests.c.end_user))).scalars()
            assert list(users) == [None, None, None]
    finally:
        await engine.dispose()


async def test_keys_made_before_expiry_existed_never_expire(ledger_url: str) -> None:
    """Migrations 5 and 7 add ``api_keys.expires_at`` and ``routing``: keys from before
    them, and keys an older release creates after a rollback, read as never expiring and
    routed by the gateway's defaults."""
    engine = await _engine(ledger_url)
    old = sa.Table(
        "api_keys",
        sa.MetaData(),
        *(
            sa.Column(c.name, c.type)
            for c in schema.api_keys.columns
            if c.name not in ("expires_at", "routing")
        ),
    )

    def key(key_id: str) -> dict[str, object]:
        return {
            "key_id": key_id, "key_hash": key_id.ljust(64, "0"), "alias": key_id,
            "budget_micros": None, "budget_period": None, "rpm": None, "tpm": None,
            "allowed_models": None, "allowed_policies": None, "metadata": {},
            "created_at": sa.func.now(), "revoked_at": None,
        }  # fmt: skip

    try:
        assert await migrate(engine, MIGRATIONS[:4]) == 4
        async with engine.begin() as conn:
            await conn.execute(sa.insert(old).values(**key("before")))
        assert await migrate(engine) == latest_version()
        async with engine.begin() as conn:
            await conn.execute(sa.insert(old).values(**key("rolled-back")))
        infos = {k.key_id: k for k in await KeyRepository(engine).list()}
        assert {k: (v.expires_at, v.routing) for k, v in infos.items()} == {
            "before": (None, None),
            "rolled-back": (None, None),
        }
    finally:
        await engine.dispose()


async def test_keys_from_before_live_aliases_keep_every_field_and_free_revoked_aliases(
    ledger_url: str,
) -> None:
    """Migration 12 makes aliases unique among live keys only (on SQLite by rebuilding the
    table): every key and every field comes through, a revoked key's alias can be taken,
    and a live key's still cannot."""
    engine = await _engine(ledger_url)
    now = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)

    def key(key_id: str, alias: str, revoked: bool) -> dict[str, object]:
        return {
            "key_id": key_id, "key_hash": key_id.ljust(64, "0"), "alias": alias,
            "budget_micros": 5_000_000, "budget_period": "monthly", "rpm": 60, "tpm": 1000,
            "allowed_models": ["a"], "allowed_policies": ["compact"],
            "metadata": {"team": "t"}, "created_at": now,
            "revoked_at": now if revoked else None, "expires_at": now + dt.timedelta(days=9),
            "routing": {"cost_weight": 0.5},
        }  # fmt: skip

    try:
        assert await migrate(engine, MIGRATIONS[:11]) == 11
        async with engine.begin() as conn:
            await conn.execute(sa.insert(schema.api_keys), [
                key("key_old", "search", True), key("key_live", "ads", False),
            ])  # fmt: skip
        # The table as version 11 has it: columns added since (max_parallel, 14) come later.
        v11 = [c for c in schema.api_keys.c if c.name != "max_parallel"]
        async with engine.connect() as conn:
            before = [dict(r._mapping) for r in await conn.execute(
                sa.select(*v11).order_by(schema.api_keys.c.key_id)
            )]  # fmt: skip
        assert await migrate(engine) == latest_version()
        async with engine.connect() as conn:
            after = [dict(r._mapping) for r in await conn.execute(
                sa.select(*v11).order_by(schema.api_keys.c.key_id)
            )]  # fmt: skip
            added = (await conn.execute(sa.select(schema.api_keys.c.max_parallel))).scalars()
            assert list(added) == [None, None]  # no bound, as before the column
            assert await conn.run_sync(_describe) == _expected()
        assert after == before and len(after) == 2
        repo = KeyRepository(engine)
        taken, _ = await repo.create("search")
        assert taken.alias == "search" and not taken.revoked
        with pytest.raises(DuplicateAliasError):
            await repo.create("ads")
    finally:
        await engine.dispose()


async def test_a_ledger_from_before_logged_at_gains_it_and_still_exports(
    ledger_url: str, tmp_path: Path
) -> None:
    """Migration 11 adds ``requests.logged_at`` (and its index) to a ledger at version 10.
    Its rows keep NULL and count as logged when they were created, as do the rows an older
    release writes after a rollback; both exports still hold them all."""
    t0 = 1_750_000_000.0
    engine = await _engine(ledger_url)
    # The requests table as releases before migration 11 write it: no logged_at column.
    old = sa.Table(
        "requests",
        sa.MetaData(),
        *(sa.Column(c.name, c.type) for c in schema.requests.columns if c.name != "logged_at"),
    )
    old_feedback, old_calls = _feedback_as_of(10), _calls_as_of(10)

    async def write_as_an_older_release(*records: LedgerRecord) -> None:
        req_rows, call_rows, fb_rows, _ = build_rows(records, "none")
        async with engine.begin() as conn:
            await conn.execute(sa.insert(old), req_rows)
            await conn.execute(sa.insert(old_calls), _only(call_rows, old_calls))
            await conn.execute(sa.insert(old_feedback), _only(fb_rows, old_feedback))

    def scored(rid: str, created_at: float) -> tuple[LedgerRecord, LedgerRecord]:
        # Scored a second after it was served: within any window that holds it (a window
        # carries the feedback given before it closed).
        return make_request(rid, created_at=created_at), make_feedback(rid, 1.0, created_at + 1)

    try:
        assert await migrate(engine, MIGRATIONS[:10]) == 10
        await write_as_an_older_release(*scored("old0", t0), *scored("old1", t0 + 60))
        assert await migrate(engine) == latest_version()
        async with engine.connect() as conn:
            described = await conn.run_sync(_describe)
        assert described["requests"] == _expected()["requests"]
        # A rolled-back release writes on; this one's writer stamps its rows.
        await write_as_an_older_release(*scored("rolled-back", t0 + 90))
        assert await BatchInserter(engine, "none", 10).insert(scored("new", t0 + 30)) == []
        stamps = sa.select(schema.requests.c.request_id, schema.requests.c.logged_at)
        async with engine.connect() as conn:
            logged = dict((await conn.execute(stamps)).all())
        assert [rid for rid, at in logged.items() if at is not None] == ["new"]

        out = tmp_path / "x.jsonl"

        async def exported(**bounds: float) -> list[str]:
            await export_ledger(engine, out, **bounds)  # type: ignore[arg-type]
            return [r.id for r in read_export(out)]

        assert await exported() == ["old0", "new", "old1", "rolled-back"]  # by created_at
        assert await exported(since=t0 + 30) == ["new", "old1", "rolled-back"]
        # By logged time: the unstamped rows at their created_at, then the stamped ones.
        assert await exported(logged_until=t0 + 60) == ["old0"]
        assert await exported(logged_since=t0 + 60) == ["old1", "rolled-back", "new"]
        assert "logged_at" not in read_export(out)[0].model_dump()
        assert read_export(out)[2].model_dump()["logged_at"] == logged["new"].isoformat()
    finally:
        await engine.dispose()


async def test_feedback_from_before_the_logged_reward_exports_without_it(
    ledger_url: str, tmp_path: Path
) -> None:
    """Migration 15 adds the logged reward's columns to a ledger at version 14: its feedback
    keeps NULL and exports with its score alone; feedback written since carries every term."""
    t0 = 1_750_000_000.0
    engine = await _engine(ledger_url)
    try:
        assert await migrate(engine, MIGRATIONS[:14]) == 14
        old_feedback, old_calls = _feedback_as_of(14), _calls_as_of(14)
        req_rows, call_rows, fb_rows, _ = build_rows(
            [make_request("old", created_at=t0), make_feedback("old", 0.5, t0 + 10)], "none"
        )
        async with engine.begin() as conn:
            await conn.execute(sa.insert(schema.requests), req_rows)
            await conn.execute(sa.insert(old_calls), _only(call_rows, old_calls))
            await conn.execute(sa.insert(old_feedback), _only(fb_rows, old_feedback))
        assert await migrate(engine) == latest_version()
        async with engine.connect() as conn:
            assert (await conn.run_sync(_describe))["feedback"] == _expected()["feedback"]
        new = make_feedback("old", 1.0, t0 + 20)
        new = dataclasses.replace(
            new, reward=0.9, cost_usd=0.0001, cost_weight=1.0, normalized_cost=0.1, penalty=0.1
        )
        assert await BatchInserter(engine, "none", 10).insert([new]) == []
        out = tmp_path / "x.jsonl"
        await export_ledger(engine, out)
        [record] = [json.loads(line) for line in out.read_text().splitlines()]
        first, second = record["feedback"]
        assert first["score"] == 0.5 and "reward" not in first
        assert {k: second[k] for k in ("score", "reward", "cost_weight", "penalty")} == {
            "score": 1.0,
            "reward": 0.9,
            "cost_weight": 1.0,
            "penalty": 0.1,
        }
    finally:
        await engine.dispose()


async def test_a_fallback_from_before_its_reason_was_logged_is_still_the_models_failure(
    ledger_url: str, tmp_path: Path
) -> None:
    """Migration 16 adds ``calls.fallback_reason`` to a ledger at version 15. A row a
    fallback answered from before it does not say whether the model asked for was called:
    it keeps NULL and exports as that model's failure, as it did; a request whose row says
    its model was kept away by its open circuit is left out (nothing is known of that
    model)."""
    t0 = 1_750_000_000.0
    decision = {"policy": "compact", "actions": ["weak"], "propensities": [0.5], "propensity": 0.5}

    def fell_back(rid: str, created_at: float) -> tuple[LedgerRecord, LedgerRecord]:
        rec = make_request(rid, created_at=created_at, models=("strong",), decision=decision)
        rec.calls[0].fallback_from = "weak"
        return rec, make_feedback(rid, 1.0, created_at + 1)

    engine = await _engine(ledger_url)
    try:
        assert await migrate(engine, MIGRATIONS[:15]) == 15
        old_calls = _calls_as_of(15)
        req_rows, call_rows, fb_rows, _ = build_rows(fell_back("old", t0), "none")
        async with engine.begin() as conn:
            await conn.execute(sa.insert(schema.requests), req_rows)
            await conn.execute(sa.insert(old_calls), _only(call_rows, old_calls))
            await conn.execute(sa.insert(schema.feedback), fb_rows)
        assert await migrate(engine) == latest_version()
        async with engine.connect() as conn:
            assert (await conn.run_sync(_describe))["calls"] == _expected()["calls"]
        skipped, score = fell_back("new", t0 + 10)
        assert isinstance(skipped, RequestRecord)
        skipped.calls[0].fallback_reason = "circuit_open"
        assert await BatchInserter(engine, "none", 10).insert([skipped, score]) == []
        out = tmp_path / "x.jsonl"
        await export_ledger(engine, out)
        by_id = {r.id: r for r in read_export(out)}
        old = by_id["old"].outcomes["weak"]
        assert (old.score, (old.model_extra or {})["error_type"]) == (0.0, "fell_back")
        assert [c["fallback_reason"] for c in by_id["old"].model_dump()["calls"]] == [None]
        assert "new" not in by_id
    finally:
        await engine.dispose()
