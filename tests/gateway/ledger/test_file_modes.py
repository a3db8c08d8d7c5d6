"""What the gateway writes to disk holding ledger data (journal segments, the SQLite ledger
and its -wal/-shm, exports) is readable by its owner only under the usual umask 022; what
an operator made beforehand keeps its mode."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from gateway.ledger.export import ExportFormat, export_ledger
from gateway.ledger.spill import SpillJournal
from gateway.ledger.store import open_ledger_engine
from tests.gateway.conftest import Upstream
from tests.gateway.ledger.factories import make_request
from tests.support.gateway import gateway_config, start_gateway


@pytest.fixture(autouse=True)
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_journal_segments_and_the_directory_it_makes_are_owner_only(tmp_path: Path) -> None:
    spill_dir = tmp_path / "state" / "spill"
    journal = SpillJournal(spill_dir)
    journal.open()
    try:
        journal.wal_append([make_request(uuid.uuid4().hex)])
        journal.append([make_request(uuid.uuid4().hex)])
        journal.reject([make_request(uuid.uuid4().hex)], "refused")
        files = sorted(spill_dir.iterdir())
        assert {p.name.split("-")[0] for p in files} == {"wal", "spill", "rejected", "writer"}
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
        assert mode(spill_dir) == 0o700
        # Its parent may hold other things: made with the usual mode.
        assert mode(spill_dir.parent) == 0o755
    finally:
        journal.close()


def test_a_spill_directory_the_operator_made_keeps_its_mode(tmp_path: Path) -> None:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir(mode=0o750)
    journal = SpillJournal(spill_dir)
    journal.open()
    try:
        journal.append([make_request(uuid.uuid4().hex)])
        assert mode(spill_dir) == 0o750
        assert {mode(p) for p in spill_dir.glob("spill-*.jsonl")} == {0o600}
    finally:
        journal.close()


async def test_the_sqlite_ledger_the_gateway_creates_is_owner_only(tmp_path: Path) -> None:
    db = tmp_path / "data" / "ledger.db"
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{db}")
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("SELECT count(*) FROM schema_version"))
        # Open, in WAL mode: the database and SQLite's own two files next to it.
        files = [db, db.with_name("ledger.db-wal"), db.with_name("ledger.db-shm")]
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    finally:
        await engine.dispose()


async def test_a_sqlite_ledger_file_the_operator_made_keeps_its_mode(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    db.touch(mode=0o640)
    db.chmod(0o640)
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{db}")
    await engine.dispose()
    assert mode(db) == 0o640


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
async def test_an_export_is_owner_only_unless_it_replaces_a_file(
    tmp_path: Path, fmt: ExportFormat
) -> None:
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    try:
        new = tmp_path / "out" / f"new.{fmt}"
        await export_ledger(engine, new, fmt, include_unscored=True)
        assert mode(new) == 0o600
        # A file someone made readable by others (for another tool's user) stays so when
        # the next export replaces it.
        shared = tmp_path / f"shared.{fmt}"
        shared.touch()
        shared.chmod(0o644)
        await export_ledger(engine, shared, fmt, include_unscored=True)
        assert mode(shared) == 0o644
    finally:
        await engine.dispose()


def test_a_served_gateway_keeps_its_ledger_and_journal_owner_only(
    upstream: Upstream, tmp_path: Path
) -> None:
    # ``xrouter serve`` as deployed: it makes the spill directory and the SQLite ledger
    # before its workers start, and the workers journal every answered request.
    db, spill_dir = tmp_path / "data" / "ledger.db", tmp_path / "state" / "spill"
    cfg = gateway_config(
        tmp_path,
        upstream.base_url,
        ledger={"url": f"sqlite+aiosqlite:///{db}", "spill_dir": str(spill_dir)},
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        r = httpx.post(
            f"{gw.url}/v1/chat/completions",
            json={"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "modes"}]},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        files = [db, db.with_name("ledger.db-wal"), db.with_name("ledger.db-shm")]
        files += sorted(spill_dir.iterdir())
        assert any(p.name.startswith("wal-") for p in files)  # the request's journal segment
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
        assert mode(spill_dir) == 0o700
    finally:
        gw.stop()
