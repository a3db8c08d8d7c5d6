"""What request retention costs: how fast ``ledger.request_retention_days`` deletes old
requests, and how long the gateway's ledger writes wait meanwhile.

Fills a fresh ledger with N requests spread evenly over the last 100 days (one call each,
half of them scored, each with two tags) through the batch inserter the gateway uses, then
deletes those older than 60 days (``gateway.ledger.retention.delete_requests``, batches of
1,000 requests, one short transaction each) while a writer inserts a batch of 20 new
requests every 50 ms, as a busy gateway's ledger writer does, and reports the deletion's
rate and the writer's insert latency during it (median, p99, max) against the same writer
with nothing deleting.

Usage::

    .venv/bin/python bench/ledger_retention.py [sqlite|postgresql ...] [--requests N]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ledger_db import main  # noqa: E402

from gateway.ledger.inserter import BatchInserter  # noqa: E402
from gateway.ledger.records import LedgerRecord  # noqa: E402
from gateway.ledger.retention import delete_requests  # noqa: E402
from tests.gateway.ledger.factories import make_feedback, make_request  # noqa: E402

_BATCH = 1_000
DAYS = 100
KEEP_DAYS = 60


def _records(start: int, stop: int, n: int, now: float) -> list[LedgerRecord]:
    out: list[LedgerRecord] = []
    for i in range(start, stop):
        rid = f"r{i:07d}"
        request = make_request(rid, created_at=now - DAYS * 86400 * (1 - i / n), key_id=None)
        request.tags = ["team-a", f"exp-{i % 7}"]
        out.append(request)
        if i % 2 == 0:
            out.append(make_feedback(rid, 1.0))
    return out


async def _writer_latencies(
    inserter: BatchInserter, stop: asyncio.Event, seconds: float | None = None
) -> list[float]:
    """Insert 20 new requests every 50 ms until ``stop`` (or for ``seconds``); each insert's
    latency in ms."""
    out: list[float] = []
    started = time.perf_counter()
    i = 0
    while not stop.is_set() and (seconds is None or time.perf_counter() - started < seconds):
        batch = [make_request(f"w{i:06d}-{j}", key_id=None) for j in range(20)]
        i += 1
        t = time.perf_counter()
        await inserter.insert(list(batch))
        out.append((time.perf_counter() - t) * 1000)
        await asyncio.sleep(0.05)
    return out


def _summary(ms: list[float]) -> str:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"median {statistics.median(ordered):.1f} ms, p99 {p99:.1f} ms, "
        f"max {ordered[-1]:.1f} ms ({len(ordered)} inserts)"
    )


async def run(engine: AsyncEngine, tmp: Path, backend: str, n: int) -> None:
    inserter = BatchInserter(engine, "none", timeout_s=60)
    now = time.time()
    t = time.perf_counter()
    for start in range(0, n, _BATCH):
        await inserter.insert(_records(start, min(start + _BATCH, n), n, now))
    async with engine.begin() as conn:
        await conn.execute(sa.text("ANALYZE"))
    print(f"{backend}: {n:,} requests written in {time.perf_counter() - t:.1f} s", flush=True)

    idle = await _writer_latencies(inserter, asyncio.Event(), seconds=5)
    print(f"  writer alone: {_summary(idle)}", flush=True)

    stop = asyncio.Event()
    writer = asyncio.create_task(_writer_latencies(inserter, stop))
    cutoff = datetime.fromtimestamp(now, UTC) - timedelta(days=KEEP_DAYS)
    t = time.perf_counter()
    deleted = await delete_requests(engine, cutoff)
    seconds = time.perf_counter() - t
    stop.set()
    busy = await writer
    print(
        f"  deleted {deleted:,} requests older than {KEEP_DAYS} days (with their calls, "
        f"feedback and tags) in {seconds:.1f} s: {deleted / seconds:,.0f} requests/s",
        flush=True,
    )
    print(f"  writer meanwhile: {_summary(busy)}", flush=True)


if __name__ == "__main__":
    main(__doc__ or "", run)
