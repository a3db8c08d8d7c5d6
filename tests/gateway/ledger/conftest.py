"""Every ledger test runs on SQLite (a file in tmp_path) and on PostgreSQL (a database made
for this test session, reset per test and dropped at the end)."""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.store import open_ledger_engine
from gateway.settings import LedgerSettings
from tests.support.services import unavailable
from tests.support.tcp_proxy import ThreadedTcpProxy

from .factories import PG_HOST, PG_PORT, RecordingSink, pg_admin, pg_url


def run_in_thread(factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine to completion on a private loop, callable from sync fixtures whether
    or not a test loop is running in this thread."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(factory())
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    name = f"xrouter_test_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        run_in_thread(lambda: pg_admin(f'CREATE DATABASE "{name}"'))
    except (OSError, TimeoutError) as exc:
        unavailable(f"PostgreSQL at {PG_HOST}:{PG_PORT} is unreachable ({exc})")
    yield name
    run_in_thread(lambda: pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def proxied_pg(pg_database: str) -> Iterator[tuple[ThreadedTcpProxy, str]]:
    """(a loopback proxy in front of the session's database, emptied, that the test cuts or
    freezes; the ledger URL that reaches the database through it)."""
    run_in_thread(
        lambda: pg_admin("DROP SCHEMA public CASCADE", "CREATE SCHEMA public", database=pg_database)
    )
    proxy = ThreadedTcpProxy(PG_HOST, PG_PORT)
    try:
        yield proxy, pg_url(pg_database).replace(f":{PG_PORT}/", f":{proxy.port}/")
    finally:
        proxy.close()


@pytest.fixture(scope="session")
def pg_scratch(pg_database: str) -> Iterator[Callable[[str], str]]:
    """Names for extra databases (created by the test itself); all dropped at the end."""
    made: list[str] = []

    def name(suffix: str) -> str:
        db = f"{pg_database}_{suffix}_{secrets.token_hex(2)}"
        made.append(db)
        return db

    yield name
    drops = [
        f'DROP DATABASE IF EXISTS "{candidate}" WITH (FORCE)'
        for db in made
        for candidate in (db, db + "_away")
    ]
    if drops:
        run_in_thread(lambda: pg_admin(*drops))


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ledger_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """An empty database: a new SQLite file, or the session's PG database with its public
    schema dropped and recreated."""
    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/db/ledger.db"
    db = request.getfixturevalue("pg_database")
    run_in_thread(
        lambda: pg_admin("DROP SCHEMA public CASCADE", "CREATE SCHEMA public", database=db)
    )
    return pg_url(db)


@pytest.fixture
async def engine(ledger_url: str) -> AsyncIterator[AsyncEngine]:
    eng = await open_ledger_engine(ledger_url)
    yield eng
    await eng.dispose()


@pytest.fixture
def spill_dir(tmp_path: Path) -> Path:
    return tmp_path / "spill"


@pytest.fixture
def make_settings(ledger_url: str, spill_dir: Path) -> Callable[..., LedgerSettings]:
    def make(**overrides: Any) -> LedgerSettings:
        values: dict[str, Any] = {
            "url": ledger_url,
            "spill_dir": str(spill_dir),
            # Tests flush explicitly unless they test the timer or the row trigger.
            "flush_interval_ms": 60_000,
            "flush_rows": 500,
        }
        values.update(overrides)
        return LedgerSettings(**values)

    return make


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()
