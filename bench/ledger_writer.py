"""Ledger writer figures: durable-submit latency under open-loop load, batched-insert CPU per
request, and the worst event-loop stall during a flush.

    .venv/bin/python bench/ledger_writer.py [sqlite|postgresql]
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.ledger.store import open_ledger_engine  # noqa: E402
from gateway.ledger.writer import LedgerWriter  # noqa: E402
from gateway.settings import LedgerSettings  # noqa: E402
from tests.gateway.ledger.factories import make_request, pg_admin, pg_url  # noqa: E402


def pct_ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] * 1000


async def fresh_url(backend: str, tmp: str) -> str:
    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp}/ledger.db"
    await pg_admin('DROP DATABASE IF EXISTS "xr_bench" WITH (FORCE)', 'CREATE DATABASE "xr_bench"')
    return pg_url("xr_bench")


async def durable(backend: str, rate: float, seconds: float = 3.0) -> None:
    tmp = tempfile.mkdtemp()
    url = await fresh_url(backend, tmp)
    engine = await open_ledger_engine(url)
    writer = LedgerWriter(engine, LedgerSettings(url=url, spill_dir=f"{tmp}/spill"))
    await writer.start()
    latencies: list[float] = []

    async def one(i: int) -> None:
        t = time.perf_counter()
        await writer.submit_durable(make_request(f"b{i:06d}"))
        latencies.append(time.perf_counter() - t)

    tasks = []
    t0 = time.perf_counter()
    for i in range(int(rate * seconds)):  # open loop: a request every 1/rate seconds
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    await writer.close()
    await engine.dispose()
    shutil.rmtree(tmp)
    print(
        f"{backend:10s} submit_durable @ {rate:5.0f}/s: median {pct_ms(latencies, 0.5):.2f} ms  "
        f"p90 {pct_ms(latencies, 0.9):.2f} ms  p99 {pct_ms(latencies, 0.99):.2f} ms"
    )


async def flush(backend: str, n: int = 500, rounds: int = 5) -> None:
    tmp = tempfile.mkdtemp()
    url = await fresh_url(backend, tmp)
    engine = await open_ledger_engine(url)
    writer = LedgerWriter(
        engine, LedgerSettings(url=url, spill_dir=f"{tmp}/spill", flush_interval_ms=60_000)
    )
    await writer.start()
    per_request: list[float] = []
    lags: list[float] = []
    for k in range(rounds):
        for i in range(n):
            writer.submit(make_request(f"f{k}-{i:05d}"))
        done = asyncio.Event()

        async def monitor(done: asyncio.Event = done) -> None:
            while not done.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.0005)
                lags.append(time.perf_counter() - t - 0.0005)

        task = asyncio.create_task(monitor())
        await asyncio.sleep(0.005)
        t = time.process_time()
        await writer.flush()
        per_request.append((time.process_time() - t) / n)
        done.set()
        await task
    await writer.close()
    await engine.dispose()
    shutil.rmtree(tmp)
    print(
        f"{backend:10s} flush of {n} requests: {statistics.median(per_request) * 1e6:.0f} µs of CPU "
        f"per request, worst event-loop stall {max(lags) * 1000:.1f} ms"
    )


async def main(backends: list[str]) -> None:
    for backend in backends:
        for rate in (200, 1000, 2000):
            await durable(backend, rate)
        await flush(backend)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or ["sqlite", "postgresql"]))
