"""Ledger export figures: how fast ``xrouter export`` reads a large ledger into an outcome
table, how much memory it holds while doing so, and what each kind of incremental window
and the late-feedback count cost.

Fills a fresh ledger with N requests (one call each; half of them scored, a twentieth of
them cache hits of another request, some of those scored too) through the same batch
inserter the gateway uses, then times, on it:

- a full export (JSONL), and the Python memory it allocated at its peak (tracemalloc);
- a logged window (``--cursor``) over every row;
- a scored window (``--scored``) over every feedback row, and one over the last tenth;
- the late-feedback count an incremental export prints, over the last tenth.

Usage::

    .venv/bin/python bench/ledger_export.py [sqlite|postgresql ...] [--requests N]
"""

from __future__ import annotations

import asyncio
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ledger_db import main  # noqa: E402

from gateway.ledger.export import export_ledger  # noqa: E402
from gateway.ledger.export_bounds import count_late_feedback, database_now  # noqa: E402
from gateway.ledger.inserter import BatchInserter  # noqa: E402
from gateway.ledger.records import LedgerRecord  # noqa: E402
from tests.gateway.ledger.factories import (  # noqa: E402
    make_cache_hit,
    make_feedback,
    make_request,
)

T = TypeVar("T")
_BATCH = 1_000


def _records(start: int, stop: int) -> list[LedgerRecord]:
    out: list[LedgerRecord] = []
    for i in range(start, stop):
        rid = f"r{i:07d}"
        if i % 20 == 19:  # a cache hit of the request before it
            out.append(make_cache_hit(rid, make_request(f"r{i - 1:07d}")))
            if i % 40 == 39:
                out.append(make_feedback(rid, 0.5))
            continue
        out.append(make_request(rid))
        if i % 2 == 0:
            out.append(make_feedback(rid, 1.0))
    return out


async def _timed(what: str, work: Callable[[], Awaitable[T]]) -> tuple[T, float]:
    t = time.perf_counter()
    result = await work()
    seconds = time.perf_counter() - t
    print(f"  {what}: {seconds:.2f} s", flush=True)
    return result, seconds


async def run(engine: AsyncEngine, tmp: Path, backend: str, n: int) -> None:
    inserter = BatchInserter(engine, "full", timeout_s=60)
    t = time.perf_counter()
    tenth = n - n // 10
    for start in range(0, tenth, _BATCH):
        await inserter.insert(_records(start, min(start + _BATCH, tenth)))
    # The last tenth after a mark: the windows "since the previous export" start there.
    await asyncio.sleep(0.01)
    mark = await database_now(engine)
    await asyncio.sleep(0.01)
    for start in range(tenth, n, _BATCH):
        await inserter.insert(_records(start, min(start + _BATCH, n)))
    end = await database_now(engine) + timedelta(seconds=1)
    # Fresh statistics, as autovacuum keeps them on a ledger that grew over time: a
    # planner that still thinks the tables are empty scans them instead of the indexes.
    async with engine.begin() as conn:
        await conn.execute(sa.text("ANALYZE"))
    print(f"{backend}: {n:,} requests written in {time.perf_counter() - t:.1f} s", flush=True)

    out = Path(tmp) / "export.jsonl"
    count, seconds = await _timed(
        "full export", lambda: export_ledger(engine, out, include_unscored=True)
    )
    # Again under tracemalloc (which slows Python down several times): its peak.
    tracemalloc.start()
    await export_ledger(engine, out, include_unscored=True)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"    {count:,} records, {count / seconds:,.0f} records/s, "
        f"{out.stat().st_size / 1e6:.0f} MB of JSONL; Python allocations peak "
        f"{peak / 1e6:.1f} MB"
    )
    scored_all, _ = await _timed(
        "logged window, every row",
        lambda: export_ledger(engine, out, logged_since=None, logged_until=end),
    )
    print(f"    {scored_all:,} scored records")
    every, _ = await _timed(
        "scored window, every feedback row",
        lambda: export_ledger(engine, out, logged_since=None, logged_until=end, scored=True),
    )
    last, _ = await _timed(
        "scored window, the last tenth",
        lambda: export_ledger(engine, out, logged_since=mark, logged_until=end, scored=True),
    )
    print(f"    {every:,} and {last:,} records")
    late, _ = await _timed(
        "late-feedback count, the last tenth",
        lambda: count_late_feedback(engine, mark, end, scored=True),
    )
    print(f"    {late:,} re-scores")


if __name__ == "__main__":
    main(__doc__ or "", run)
