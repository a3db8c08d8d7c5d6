"""``xrouter export`` reads a ledger and never makes or migrates one. It ran the migrations:
pointed at an empty PostgreSQL database it made the ledger's tables there and exported 0
records, exit 0; pointed at another application's database it added the ledger's tables
beside that application's (or failed in a migration); and a newer xrouter upgraded the
ledger of the older gateway still writing it. Each backend: a database that holds no
ledger, or an older one, is one line and exit 2, and is left as it was."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.migrations import MIGRATIONS, latest_version, migrate
from gateway.ledger.store import create_ledger_engine, open_ledger_engine, sqlite_file
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings

from .factories import make_feedback, make_request


def _args(out: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return parser.parse_args(["--out", str(out)])


def _where(url: str) -> str:
    path = sqlite_file(sa.make_url(url))
    return str(path) if path is not None else url


def _engine(url: str) -> AsyncEngine:
    """An engine that changes nothing as it connects: SQLite's plain driver, not the
    ledger's engine (which switches a database to WAL)."""
    path = sqlite_file(sa.make_url(url))
    if path is None:
        return create_ledger_engine(url)
    path.parent.mkdir(parents=True, exist_ok=True)
    return create_async_engine(f"sqlite+aiosqlite:///{path}", poolclass=NullPool)


async def _run(url: str, *statements: str) -> None:
    """Run SQL on the database at ``url``, with no migration."""
    engine = _engine(url)
    try:
        async with engine.begin() as conn:
            for sql in statements:
                await conn.execute(sa.text(sql))
    finally:
        await engine.dispose()


async def _describe(url: str) -> dict[str, list[str]]:
    """Every table with its columns and indexes (what a migration would change), and a
    SQLite database's journal mode."""

    def read(conn: sa.Connection) -> dict[str, list[str]]:
        insp = sa.inspect(conn)
        out = {
            t: sorted(c["name"] for c in insp.get_columns(t))
            + sorted(f"index {i['name']}" for i in insp.get_indexes(t))
            for t in insp.get_table_names()
        }
        if conn.dialect.name == "sqlite":
            out["journal_mode"] = [conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()]
        return out

    engine = _engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


async def _versions(url: str) -> list[int]:
    engine = _engine(url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(sa.text("SELECT version FROM schema_version"))
            return sorted(int(v) for (v,) in rows)
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("tables", "why"),
    [
        pytest.param((), "no schema_version table", id="empty"),
        pytest.param(
            ("CREATE TABLE requests (x INTEGER)", "CREATE TABLE other (y TEXT)"),
            "no schema_version table",
            id="another-application",
        ),
        pytest.param(
            ("CREATE TABLE schema_version (version INTEGER, description TEXT)",),
            "its schema_version table is empty",
            id="empty-schema-version",
        ),
        pytest.param(
            (
                "CREATE TABLE schema_version (version INTEGER)",
                "INSERT INTO schema_version VALUES (3)",
            ),
            "no requests table",
            id="another-schema-version",
        ),
    ],
)
async def test_a_database_that_holds_no_ledger_is_refused_and_left_as_it_was(
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tables: tuple[str, ...],
    why: str,
) -> None:
    await _run(ledger_url, "CREATE TABLE mine (z INTEGER)", *tables)
    before = await _describe(ledger_url)
    out = tmp_path / "e.jsonl"
    assert await run_export(_args(out), ledger_url) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line == (
        f"error: no ledger database at {_where(ledger_url)} (it holds no xrouter ledger: {why})"
    )
    assert captured.out == ""
    # SQLite: its journal mode too, which the ledger's engine would have set to WAL.
    assert await _describe(ledger_url) == before
    assert not out.exists()


async def test_an_empty_database_is_refused_and_left_empty(
    ledger_url: str, backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The audit's case: `--ledger postgresql+asyncpg://…/<empty db>` ran all the migrations,
    # printed "exported 0 records" and exited 0.
    # SQLite: a database file without tables (one without a byte is "an empty file").
    await _run(ledger_url, "PRAGMA user_version = 1" if backend == "sqlite" else "SELECT 1")
    before = await _describe(ledger_url)
    assert await run_export(_args(tmp_path / "e.jsonl"), ledger_url) == 2
    (line,) = capsys.readouterr().err.splitlines()
    why = (
        "an empty SQLite database"
        if backend == "sqlite"
        else "it holds no xrouter ledger: no schema_version table"
    )
    assert line == f"error: no ledger database at {_where(ledger_url)} ({why})"
    assert await _describe(ledger_url) == before
    assert not (tmp_path / "e.jsonl").exists()


async def test_an_older_ledger_is_refused_not_upgraded(
    ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A newer xrouter exporting from an older gateway's ledger migrated it, under the
    # gateway still writing it.
    _engine(ledger_url)  # the SQLite directory
    engine = create_ledger_engine(ledger_url)  # a ledger's own: WAL, as the gateway made it
    try:
        await migrate(engine, MIGRATIONS[:10])
    finally:
        await engine.dispose()
    before = await _describe(ledger_url)
    out = tmp_path / "e.jsonl"
    assert await run_export(_args(out), ledger_url) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"error: the ledger at {_where(ledger_url)} is at schema version 10, older than this "
        f"xrouter reads ({latest_version()}): upgrade the gateway that writes it to this "
        "release (xrouter serve migrates its ledger as it starts), or use the xrouter "
        "release that gateway runs"
    )
    assert await _versions(ledger_url) == list(range(1, 11))
    assert await _describe(ledger_url) == before
    assert not out.exists()


async def test_a_newer_ledger_is_exported_with_a_warning(
    ledger_url: str,
    make_settings: Callable[..., LedgerSettings],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A newer release's steps are additive: this one reads the columns it knows, and says
    # the ledger is newer, as `xrouter serve` does.
    engine = await open_ledger_engine(ledger_url)
    try:
        writer = LedgerWriter(engine, make_settings())
        await writer.start()
        writer.submit(make_request("n1"))
        writer.submit(make_feedback("n1", 0.5))
        await writer.close()
    finally:
        await engine.dispose()
    newer = latest_version() + 1
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
    await _run(
        ledger_url,
        "ALTER TABLE requests ADD COLUMN later_column INTEGER",
        f"INSERT INTO schema_version VALUES ({newer}, 'a later release', '{now}')",
    )
    out = tmp_path / "e.jsonl"
    assert await run_export(_args(out), ledger_url) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"warning: ledger schema is at version {newer}, newer than this release knows "
        f"({latest_version()}): its records are exported as this release knows them"
    ]
    assert captured.out.startswith(f"exported 1 records to {out}")
    assert await _versions(ledger_url) == list(range(1, newer + 1))
