"""CPU cost of the limit stores per request: check_rate + reserve + settle + add_tokens,
the four operations a budgeted, rate-limited pass-through request makes.

Measures this process's CPU time (time.process_time, user + system) over N requests, once
one at a time (c=1) and once from 16 concurrent workers (c=16, how a loaded gateway runs
them: calls of one loop tick share a round trip). For Redis it is the gateway-side cost
(building the call, the client, syscalls, parsing the reply), not the Redis server's time;
wall time per request is printed alongside. Runs on uvloop, as the gateway does.

    .venv/bin/python bench/limits_cpu.py [--n 5000] [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.limits import KeyLimits, LimitStore, MemoryLimitStore
from gateway.limits.redis_store import RedisLimitStore


async def run(store: LimitStore, n: int, concurrency: int) -> tuple[float, float]:
    # Limits high enough that every request passes: we measure the work, not rejections.
    limits = KeyLimits("bench", budget_micros=10**15, budget_period="daily", rpm=10**9, tpm=10**12)
    for i in range(200):  # warm-up: connections, script cache, allocator
        await one(store, limits, f"w{i}")
    tag = uuid.uuid4().hex[:6]

    async def worker(w: int) -> None:
        for i in range(n // concurrency):
            await one(store, limits, f"{tag}-{w}-{i}")

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    done = n // concurrency * concurrency
    return cpu / done * 1e6, wall / done * 1e6


async def one(store: LimitStore, limits: KeyLimits, rid: str) -> None:
    rate = await store.check_rate(limits, 500)
    assert rate.allowed
    held = await store.reserve(limits, 50_000, 20_000, rid)
    assert held.ok
    await store.settle(limits, rid, 20_000, 12_345)
    await store.add_tokens(limits, -120)


async def purge(url: str, prefix: str) -> None:
    import redis.asyncio as aredis

    client = aredis.Redis.from_url(url)
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    memory = MemoryLimitStore()
    for c in (1, 16):
        cpu, wall = await run(memory, args.n, c)
        print(
            f"memory c={c:<2}  {cpu:8.1f} µs CPU/request  {wall:8.1f} µs wall/request  (N={args.n})"
        )

    prefix = f"xrbench-{uuid.uuid4().hex[:8]}"
    redis_store = RedisLimitStore(args.redis_url, key_prefix=prefix)
    if not await redis_store.ping():
        print(f"redis:  unreachable at {args.redis_url}, skipped")
        return
    try:
        for c in (1, 16):
            cpu, wall = await run(redis_store, args.n, c)
            print(
                f"redis  c={c:<2}  {cpu:8.1f} µs CPU/request  {wall:8.1f} µs wall/request  (N={args.n})"
            )
    finally:
        await redis_store.aclose()
        await purge(args.redis_url, prefix)


if __name__ == "__main__":
    uvloop.run(main())
