"""The ledger at production scale: what a ledger of months of traffic costs the gateway's
reads, its start-up, `xrouter export` and the retention task.

Fills a ledger with N requests (rows built by the gateway's own ``build_rows`` from
``RequestRecord``s, bulk-inserted in large transactions for speed): 300 keys (a tenth of them
with a monthly budget, a twentieth with a lifetime one), 12 models, 180 days of timestamps,
a third of the requests routed with a router call, a fifth naming an end user, a third
tagged, a twentieth cache hits, feedback on a fifth. Then it measures, on each backend:

* start-up: ``migrate`` on the filled ledger, and the budget restore (``budget_spend`` for
  every budgeted key in its window, as ``BudgetSync.restore_all`` does);
* every ``spend_report`` grouping, all time and with filters (last 7 days, one key, one tag),
  paging through keys with ``after``, ``totals``, ``cache_savings`` and the dashboard's
  reads — each with the event loop's worst stall meanwhile (a 5 ms ticker, as a concurrent
  ``/healthz`` would see it) and the ledger writer's throughput while it runs;
* the retention task's ``delete_requests`` (everything older than 150 days) and
  ``drop_content`` (older than 30 days), with a writer inserting 20 requests every 50 ms:
  the deletion's time and the writer's insert latency during it;
* `xrouter export` of a day, a week, and incremental (``--cursor``, twice): wall time and
  peak RSS (``/usr/bin/time -v``).

Usage::

    .venv/bin/python bench/ledger_scale.py [sqlite|postgresql ...] [--requests N]

PostgreSQL: a database ``xr_bench_scale`` on 127.0.0.1:5432, or ``--pg-database``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.ledger import schema  # noqa: E402
from gateway.ledger.inserter import BatchInserter  # noqa: E402
from gateway.ledger.migrations import migrate  # noqa: E402
from gateway.ledger.records import LedgerRecord, build_rows  # noqa: E402
from gateway.ledger.retention import delete_requests, drop_content  # noqa: E402
from gateway.ledger.spend import (  # noqa: E402
    GROUP_BY_CHOICES,
    GroupBy,
    budget_spend,
    cache_savings,
    spend_report,
    totals,
)
from gateway.ledger.store import open_ledger_engine  # noqa: E402
from tests.gateway.ledger.factories import (  # noqa: E402
    make_feedback,
    make_request,
    pg_admin,
    pg_url,
)

log = logging.getLogger("ledger_scale")

DAYS = 180
N_KEYS = 300
MODELS = tuple(f"provider-{i % 4}/model-{i:02d}" for i in range(12))
POLICIES = ("compact", "cheapest", "passthrough", "cascade")
TAGS = ("team-a", "team-b", "search", "chat", "exp-1", "exp-2")
_CHUNK = 20_000


def _key_id(i: int) -> str:
    return f"key_{i:08d}"


async def _fill_keys(engine: AsyncEngine) -> None:
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = []
    for i in range(N_KEYS):
        monthly, lifetime = i % 10 == 0, i % 20 == 5
        rows.append(
            {
                "key_id": _key_id(i),
                "key_hash": f"{i:064x}",
                "alias": f"alias-{i}",
                "budget_micros": 10**12 if monthly or lifetime else None,
                "budget_period": "monthly" if monthly else ("total" if lifetime else None),
                "metadata": {},
                "created_at": now - timedelta(days=DAYS + 1),
            }
        )
    async with engine.begin() as conn:
        await conn.execute(schema.api_keys.insert(), rows)


def _records(start: int, stop: int, n: int, now: float) -> list[LedgerRecord]:
    out: list[LedgerRecord] = []
    rng = random.Random(start)
    for i in range(start, stop):
        rid = f"req_{i:09d}"
        created = now - DAYS * 86400 * (1 - i / n) - 60
        key = _key_id(rng.randrange(N_KEYS)) if rng.random() < 0.97 else None
        model = MODELS[rng.randrange(len(MODELS))]
        policy = POLICIES[rng.randrange(len(POLICIES))]
        routed = policy != "passthrough" and rng.random() < 0.33
        request = make_request(
            rid,
            created_at=created,
            key_id=key,
            policy=policy,
            models=(model,),
            router_cost=rng.randint(1, 300) if routed else 0,
            call_costs=(rng.randint(0, 50_000),),
            messages=[],
            rng=rng,
        )
        request.messages = None  # log_content: none, the default
        request.response_text = None
        if rng.random() < 0.2:
            request.end_user = f"user-{rng.randrange(5000)}"
        if rng.random() < 0.33:
            request.tags = [TAGS[rng.randrange(len(TAGS))]]
        if i > start and rng.random() < 0.05:
            request.cached_from = f"req_{i - 1:09d}"
            request.calls, request.decision = [], None
            request.total_cost_micros = request.router_cost_micros = 0
            request.downstream_cost_micros = 0
        out.append(request)
        if rng.random() < 0.2:
            out.append(make_feedback(rid, rng.random(), created_at=created + 30))
    return out


async def fill(engine: AsyncEngine, n: int) -> float:
    """N requests (with their calls, tags, feedback) inserted directly; returns seconds."""
    started = time.perf_counter()
    await _fill_keys(engine)
    now = time.time()
    tables = (schema.requests, schema.calls, schema.feedback, schema.request_tags)
    for start in range(0, n, _CHUNK):
        rows = build_rows(_records(start, min(n, start + _CHUNK), n, now), "none")
        for r in rows[0] + rows[2]:
            r["logged_at"] = r["created_at"] + timedelta(seconds=2)
        async with engine.begin() as conn:
            for table, table_rows in zip(tables, rows, strict=True):
                if table_rows:
                    await conn.execute(table.insert(), table_rows)
        if start // _CHUNK % 10 == 0:
            log.info("filled %d / %d", start + _CHUNK, n)
    async with engine.begin() as conn:
        await conn.execute(sa.text("ANALYZE"))
    return time.perf_counter() - started


class LoopProbe:
    """A 5 ms ticker on the loop: its worst lateness is what a ``/healthz`` sent meanwhile
    would have waited beyond its own work."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.perf_counter() - t - 0.005)

    def __enter__(self) -> LoopProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def _writer(
    engine: AsyncEngine, stop: asyncio.Event, counter: list[float], pause: float
) -> None:
    """Batches of 20 requests through the gateway's batch inserter, ``pause`` seconds apart
    (0: as fast as the ledger takes them); appends each batch's latency."""
    inserter = BatchInserter(engine, "none", timeout_s=60)
    i = 0
    rng = random.Random(7)
    while not stop.is_set():
        batch: list[LedgerRecord] = []
        for _ in range(20):
            i += 1
            batch.append(
                make_request(
                    f"live_{os.getpid()}_{time.monotonic_ns()}_{i}",
                    key_id=_key_id(rng.randrange(N_KEYS)),
                    models=(MODELS[i % len(MODELS)],),
                    rng=rng,
                )
            )
        t = time.perf_counter()
        await inserter.insert(batch)
        counter.append(time.perf_counter() - t)
        await asyncio.sleep(pause)


async def timed_read(
    engine: AsyncEngine, name: str, read: Callable[[], Awaitable[Any]], *, with_writer: bool
) -> dict[str, Any]:
    stop = asyncio.Event()
    latencies: list[float] = []
    writer = asyncio.create_task(_writer(engine, stop, latencies, 0)) if with_writer else None
    with LoopProbe() as probe:
        t = time.perf_counter()
        result = await read()
        elapsed = time.perf_counter() - t
    stop.set()
    if writer is not None:
        await writer
    rows = len(result) if isinstance(result, list) else 1
    line = {
        "read": name,
        "s": round(elapsed, 3),
        "rows": rows,
        "loop_stall_ms": round(probe.worst * 1000, 1),
    }
    if latencies:
        line["writes_per_s"] = round(20 * len(latencies) / elapsed)
        line["write_max_ms"] = round(max(latencies) * 1000, 1)
    print(line, flush=True)
    return line


async def _page_all(engine: AsyncEngine, group: str, page: int) -> list[Any]:
    after: list[str | None] | None = None
    pages: list[Any] = []
    while True:
        rows = await spend_report(engine, [group], after=after, limit=page)  # type: ignore[list-item]
        pages.append(len(rows))
        if len(rows) < page:
            return pages
        field = {"key": "key_id"}.get(group, group)
        after = [rows[-1][field]]


async def reads(engine: AsyncEngine) -> None:
    now = datetime.now(UTC)
    week = now - timedelta(days=7)
    month = now - timedelta(days=30)
    one_key = _key_id(3)
    cases: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
    for g in GROUP_BY_CHOICES:
        by: list[GroupBy] = [g]  # type: ignore[list-item]
        cases.append((f"spend {g} all time", partial(spend_report, engine, by)))
        cases.append((f"spend {g} 7 days", partial(spend_report, engine, by, since=week)))
        cases.append((f"spend {g} one key", partial(spend_report, engine, by, key_id=one_key)))
    cases += [
        ("spend none (totals row)", lambda: spend_report(engine, [])),
        ("spend model tag=search", lambda: spend_report(engine, ["model"], tag="search")),
        ("spend key,model 7 days", lambda: spend_report(engine, ["key", "model"], since=week)),
        ("spend key pages of 50", lambda: _page_all(engine, "key", 50)),
        ("spend user pages of 1000", lambda: _page_all(engine, "user", 1000)),
        ("totals all time", lambda: totals(engine)),
        ("cache_savings all time", lambda: cache_savings(engine)),
        (
            "dashboard (model/policy 30 d, day 14 d, top users)",
            lambda: asyncio.gather(
                spend_report(engine, ["model"], since=month),
                spend_report(engine, ["policy"], since=month),
                spend_report(engine, ["day"], since=now - timedelta(days=14)),
                spend_report(engine, ["user"], since=month, limit=11, costliest_first=True),
                cache_savings(engine, since=now - timedelta(days=1)),
            ),
        ),
        ("budget_spend one key, month", lambda: budget_spend(engine, [one_key], month)),
    ]
    for name, read in cases:
        await timed_read(engine, name, read, with_writer=False)
    # The ledger writer's throughput alone, then while the biggest reports run.
    await timed_read(engine, "writer alone, 3 s", lambda: asyncio.sleep(3), with_writer=True)
    biggest: list[GroupBy] = ["model", "key"]
    for g in biggest:
        read = partial(spend_report, engine, [g])
        await timed_read(engine, f"spend {g} all time + writer", read, with_writer=True)


async def startup(engine: AsyncEngine) -> None:
    t = time.perf_counter()
    await migrate(engine)
    print({"startup": "migrate (up to date)", "s": round(time.perf_counter() - t, 3)})
    from gateway.limits.windows import period_window

    async with engine.connect() as conn:
        budgeted = (
            await conn.execute(
                sa.select(schema.api_keys.c.key_id, schema.api_keys.c.budget_period).where(
                    schema.api_keys.c.budget_micros.is_not(None)
                )
            )
        ).all()
    by_window: dict[Any, list[str]] = {}
    for key_id, period in budgeted:
        by_window.setdefault(period_window(period, time.time()), []).append(key_id)

    async def restore() -> int:
        for window, ids in by_window.items():
            await budget_spend(engine, ids, window.start)
        return len(budgeted)

    await timed_read(engine, f"budget restore ({len(budgeted)} keys)", restore, with_writer=False)


async def retention(engine: AsyncEngine) -> None:
    now = datetime.now(UTC)
    old = now - timedelta(days=150)
    steps: list[tuple[str, Callable[[], Awaitable[int]]]] = [
        ("drop_content older than 30 d", partial(drop_content, engine, now - timedelta(days=30))),
        ("delete_requests older than 150 d", partial(delete_requests, engine, old)),
        ("delete_requests again (nothing left to delete)", partial(delete_requests, engine, old)),
    ]
    for name, step in steps:
        stop = asyncio.Event()
        latencies: list[float] = []
        writer = asyncio.create_task(_writer(engine, stop, latencies, 0.05))
        with LoopProbe() as probe:
            t = time.perf_counter()
            n = await step()
            elapsed = time.perf_counter() - t
        stop.set()
        await writer
        print(
            {
                "retention": name,
                "s": round(elapsed, 2),
                "rows": n,
                "loop_stall_ms": round(probe.worst * 1000, 1),
                "insert_p50_ms": round(statistics.median(latencies) * 1000, 1),
                "insert_max_ms": round(max(latencies) * 1000, 1),
            },
            flush=True,
        )


def export_runs(url: str, tmp: Path) -> None:
    now = datetime.now(UTC)
    day = (now - timedelta(days=10)).date()
    cursor = tmp / "cursor.json"
    runs = {
        "export one day": ["--since", str(day), "--until", str(day + timedelta(days=1))],
        "export one week": ["--since", str(day - timedelta(days=6)), "--until", str(day)],
        "export --cursor (first: everything)": ["--cursor", str(cursor)],
        "export --cursor (again: nothing new)": ["--cursor", str(cursor)],
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, extra in runs.items():
        out = tmp / "out.jsonl"
        cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "gateway.cli", "export"]
        cmd += ["--ledger", url, "--out", str(out), *extra]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        elapsed = time.perf_counter() - t
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        size = out.stat().st_size if out.exists() else 0
        print(
            {
                "export": name,
                "s": round(elapsed, 2),
                "peak_rss_mb": round(int(rss.group(1)) / 1024) if rss else None,
                "out_mb": round(size / 2**20, 1),
                "rc": proc.returncode,
            },
            flush=True,
        )
        if proc.returncode not in (0, 3):
            print(proc.stderr[-2000:])
        out.unlink(missing_ok=True)


async def run(backend: str, n: int, pg_database: str, keep: bool) -> None:
    tmp = Path(tempfile.mkdtemp())
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp}/ledger.db"
    else:
        await pg_admin(
            f'DROP DATABASE IF EXISTS "{pg_database}" WITH (FORCE)',
            f'CREATE DATABASE "{pg_database}"',
        )
        url = pg_url(pg_database)
    engine = await open_ledger_engine(url)
    try:
        print({"backend": backend, "requests": n, "fill_s": round(await fill(engine, n), 1)})
        if backend == "sqlite":
            size = (tmp / "ledger.db").stat().st_size
            print({"ledger_mb": round(size / 2**20)})
        await startup(engine)
        await reads(engine)
        await engine.dispose()
        export_runs(url, tmp)
        engine = await open_ledger_engine(url)
        await retention(engine)
    finally:
        await engine.dispose()
        if not keep:
            shutil.rmtree(tmp)
            if backend == "postgresql":
                await pg_admin(f'DROP DATABASE IF EXISTS "{pg_database}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backends", nargs="*", default=["sqlite", "postgresql"])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--pg-database", default="xr_bench_scale")
    parser.add_argument("--keep", action="store_true", help="keep the ledgers afterwards")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for backend in args.backends:
        asyncio.run(run(backend, args.requests, args.pg_database, args.keep))


if __name__ == "__main__":
    main()
