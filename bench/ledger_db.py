"""Shared by the ledger benchmarks (``ledger_export.py``, ``ledger_retention.py``): a fresh
ledger on each backend, and their common command line."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.ledger.store import open_ledger_engine  # noqa: E402
from tests.gateway.ledger.factories import pg_admin, pg_url  # noqa: E402

Run = Callable[[AsyncEngine, Path, str, int], Awaitable[None]]


@asynccontextmanager
async def fresh_ledger(backend: str) -> AsyncIterator[tuple[AsyncEngine, Path]]:
    """A new, migrated ledger on ``backend`` (sqlite or postgresql) and a scratch directory;
    both are gone afterwards (the PostgreSQL database stays until the next run drops it)."""
    tmp = Path(tempfile.mkdtemp())
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp}/ledger.db"
    else:
        await pg_admin(
            'DROP DATABASE IF EXISTS "xr_bench" WITH (FORCE)', 'CREATE DATABASE "xr_bench"'
        )
        url = pg_url("xr_bench")
    engine = await open_ledger_engine(url)
    try:
        yield engine, tmp
    finally:
        await engine.dispose()
        shutil.rmtree(tmp)


def main(doc: str, run: Run) -> None:
    """``[sqlite|postgresql ...] [--requests N]``: ``run`` on a fresh ledger per backend."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("backends", nargs="*", default=["sqlite", "postgresql"])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()

    async def one(backend: str) -> None:
        async with fresh_ledger(backend) as (engine, tmp):
            await run(engine, tmp, backend, args.requests)

    for backend in args.backends:
        asyncio.run(one(backend))
