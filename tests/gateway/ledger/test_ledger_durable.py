from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings

from .factories import count, make_request, request_ids

REPO_ROOT = Path(__file__).resolve().parents[3]
N = 200


def journal_lines(spill_dir: Path) -> int:
    return sum(
        len(p.read_bytes().splitlines())
        for p in spill_dir.glob("*.jsonl")
        if not p.name.startswith("rejected")
    )


def journal_files(spill_dir: Path) -> list[str]:
    return sorted(p.name for p in spill_dir.glob("*.jsonl"))


async def run_child_and_kill(url: str, spill_dir: Path, mode: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.gateway.ledger.durable_child",
        url,
        str(spill_dir),
        str(N),
        mode,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            line = await proc.stdout.readline()
        if line.strip() != f"ACKED {N}".encode():
            assert proc.stderr is not None
            err = await proc.stderr.read()
            pytest.fail(f"child did not acknowledge: {line!r}\n{err.decode()[-3000:]}")
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("mode", ["db_up", "db_down"])
async def test_acknowledged_records_survive_kill_9(
    mode: str,
    backend: str,
    ledger_url: str,
    engine: AsyncEngine,
    spill_dir: Path,
    tmp_path: Path,
) -> None:
    child_url = ledger_url
    if mode == "db_down":
        child_url = (
            f"sqlite+aiosqlite:///{tmp_path}/missing/l.db"
            if backend == "sqlite"
            else ledger_url.rsplit("/", 1)[0] + "/xrouter_test_missing_db"
        )
    await run_child_and_kill(child_url, spill_dir, mode)
    expected = [f"k{i:04d}" for i in range(N)]
    if mode == "db_up":
        # The flushed half is in; the rest exists only in the dead writer's journal.
        assert await count(engine, "requests") == N // 2
    else:
        assert await count(engine, "requests") == 0
    assert journal_lines(spill_dir) >= N - (N // 2 if mode == "db_up" else 0)

    writer = LedgerWriter(engine, LedgerSettings(url=ledger_url, spill_dir=str(spill_dir)))
    await writer.start()
    try:
        await writer.flush()
        assert await request_ids(engine) == expected  # all of them, none twice
        assert await count(engine, "calls") == N
        assert await count(engine, "feedback") == 1
        assert journal_files(spill_dir) == []
    finally:
        await writer.close()


async def test_durable_records_are_journaled_before_the_database_sees_them(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], spill_dir: Path
) -> None:
    writer = LedgerWriter(engine, make_settings(flush_rows=10_000))
    await writer.start()
    try:
        await asyncio.gather(
            *(writer.submit_durable(make_request(f"g{i:03d}")) for i in range(300))
        )
        # Acknowledged = on disk; the batched insert has not run yet (interval 60 s).
        assert journal_lines(spill_dir) == 300
        assert await count(engine, "requests") == 0
        await writer.flush()
        assert await count(engine, "requests") == 300
    finally:
        await writer.close()
    assert journal_files(spill_dir) == []  # committed, so the journal was dropped


async def test_durable_submit_works_before_start_via_the_database(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    writer = LedgerWriter(engine, make_settings())
    waiter = asyncio.create_task(writer.submit_durable(make_request("early")))
    await asyncio.sleep(0.05)
    assert not waiter.done()  # nothing to make it durable yet
    await writer.start()
    try:
        async with asyncio.timeout(5):
            await waiter
        assert await request_ids(engine) == ["early"]
    finally:
        await writer.close()
