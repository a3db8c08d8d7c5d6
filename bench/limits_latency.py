"""Latency of the limit stores with the state a long-running gateway accumulates.

Drives ``RedisLimitStore`` (the real class, its real Lua scripts) against a real Redis, or
with ``--store memory`` the in-process ``MemoryLimitStore`` (the default without Redis), with
a synthetic clock so a minute of traffic at ``--rate`` requests a second is laid down in
seconds, then times single calls on that state (one at a time, so the figure is the call's
own: Redis time plus a loopback round trip, or the time the call holds the event loop):

* steady     one key (budget, rpm, tpm) taking the gateway's four calls per request
             (check_rate with a 2,010-token estimate, reserve, settle, add_tokens refunding
             1,990) from 32 concurrent workers for 60 s of synthetic time; p50/p99 per request
             and Redis's µs per script over the run (INFO commandstats: the whole server's).
* tpm 429    that key's window full (two tpm log entries per request), refused with a
             request as large as its tpm: what every such 429 costs.
* rpm 429    the same window refused by an rpm half its count (retry-after: mid-window).
* pause      the first check after 1, 10 and 30 s without traffic, i.e. with that many
             seconds of the log leaving the window at once.
* holds      reserve / settle / spent with 50,000 budget holds in flight on one key, then
             the first reserves after all of them expired at once.
* many keys  check_rate over 20,000 keys, 32 workers.

Redis runs one script at a time for every worker and key, and the in-process store runs on
the worker's event loop, so a slow call is a stall for all of them: the figures that matter
are the single-call ones. "Redis µs" is INFO commandstats' EVALSHA time over the call: exact
on a Redis nothing else uses, else an upper bound (e.g. `redis-server --port 6390 --save ''`
and `--redis-url redis://127.0.0.1:6390`).

    .venv/bin/python bench/limits_latency.py [--store redis|memory] [--rate 1000]
        [--redis-url redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.limits import KeyLimits, LimitStore, MemoryLimitStore
from gateway.limits.redis_store import RedisLimitStore

WORKERS = 32
ESTIMATE, REFUND = 2_010, -1_990  # a 10-token prompt with max_tokens 2,000 that used 20


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def line(label: str, ms: list[float]) -> str:
    return (
        f"{label:<46} n={len(ms):<6} p50 {pct(ms, 0.5):8.3f} ms  p99 {pct(ms, 0.99):8.3f} ms  "
        f"max {max(ms):8.3f} ms"
    )


async def timed(call: Awaitable[Any]) -> float:
    started = time.perf_counter()
    await call
    return (time.perf_counter() - started) * 1e3


async def in_parallel(jobs: Iterable[int], job: Callable[[int], Awaitable[None]]) -> None:
    todo = iter(jobs)

    async def worker() -> None:
        for i in todo:
            await job(i)

    await asyncio.gather(*(worker() for _ in range(WORKERS)))


async def evalsha_stats(redis: Any | None) -> tuple[int, int]:
    """Redis's script calls and µs so far; (0, 0) for the in-process store (no Redis)."""
    if redis is None:
        return 0, 0
    stats = (await redis.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


async def steady(
    store: LimitStore, redis: Any | None, key: KeyLimits, t0: float, rate: int
) -> None:
    requests = 60 * rate
    wall: list[float] = []

    async def request(i: int) -> None:
        now = t0 + i / rate
        started = time.perf_counter()
        assert (await store.check_rate(key, ESTIMATE, now)).allowed
        assert (await store.reserve(key, None, 20_000, f"r{i}", now)).ok
        await store.settle(key, f"r{i}", 20_000, 12_345, now)
        await store.add_tokens(key, REFUND, now, at=now)
        wall.append((time.perf_counter() - started) * 1e3)

    calls0, usec0 = await evalsha_stats(redis)
    await in_parallel(range(requests), request)
    calls1, usec1 = await evalsha_stats(redis)
    per_script = (usec1 - usec0) / max(1, calls1 - calls0)
    print(line(f"steady: 4 calls/request, c={WORKERS}, {rate}/s x 60 s", wall))
    if redis is not None:
        print(f"{'':<46} Redis {per_script:.1f} µs per script (all clients of this server)")


async def refusals(store: LimitStore, redis: Any | None, key: KeyLimits, now: float) -> None:
    assert key.tpm is not None and key.rpm is not None
    state = await store.check_rate(key, 0, now)
    used = key.tpm - (state.remaining_tokens or 0)
    requests = key.rpm - (state.remaining_requests or 0)
    cases = (
        (
            f"tpm 429 for a whole window ({used:,} tokens)",
            KeyLimits(key.key_id, rpm=key.rpm, tpm=used),
            used,
        ),
        # refused until half the window has left: the answer is mid-log
        (
            f"rpm 429, rpm {requests // 2:,} of {requests:,}",
            KeyLimits(key.key_id, rpm=requests // 2),
            0,
        ),
    )
    for label, limits, tokens in cases:
        ms = []
        calls0, usec0 = await evalsha_stats(redis)
        for _ in range(20):
            started = time.perf_counter()
            refused = await store.check_rate(limits, tokens, now)
            ms.append((time.perf_counter() - started) * 1e3)
            assert not refused.allowed and refused.retry_after_s is not None
        calls1, usec1 = await evalsha_stats(redis)
        print(line(label, ms))
        if redis is not None:
            per_script = (usec1 - usec0) / max(1, calls1 - calls0)
            print(f"{'':<46} Redis {per_script:.0f} µs per script")


async def pauses(store: LimitStore, redis: Any | None, key: KeyLimits, end: float) -> None:
    # The log covers [end - 60, end); each check finds the next stretch of it gone at once.
    for left, at in ((1, end + 1), (10, end + 11), (30, end + 41)):
        calls0, usec0 = await evalsha_stats(redis)
        ms = await timed(store.check_rate(key, ESTIMATE, at))
        calls1, usec1 = await evalsha_stats(redis)
        label = f"check after {left:>2} s of the log left at once"
        spent = (
            f"  (Redis {usec1 - usec0:,} µs in {calls1 - calls0} script)"
            if redis is not None
            else ""
        )
        print(f"{label:<46} {ms:8.3f} ms{spent}")


async def holds(store: LimitStore, t0: float, count: int) -> None:
    key = KeyLimits("holds", budget_micros=10**15, budget_period="daily")

    async def hold(i: int) -> None:
        assert (await store.reserve(key, None, 1_000, f"h{i}", t0)).ok

    await in_parallel(range(count), hold)
    reserve, settle, spent = [], [], []
    for i in range(500):
        reserve.append(await timed(store.reserve(key, None, 1_000, f"m{i}", t0)))
        settle.append(await timed(store.settle(key, f"m{i}", 1_000, 500, t0)))
        spent.append(await timed(store.spent(key, t0)))
    print(line(f"reserve with {count:,} holds in flight", reserve))
    print(line(f"settle (write-behind) with {count:,} holds", settle))
    print(line(f"spent with {count:,} holds", spent))
    assert isinstance(store, RedisLimitStore | MemoryLimitStore)
    later = t0 + store.hold_ttl_s + 1
    after = [await timed(store.reserve(key, None, 1_000, f"x{i}", later)) for i in range(50)]
    print(line(f"reserve after {count:,} holds expired at once", after))


async def many_keys(store: LimitStore, t0: float, count: int) -> None:
    keys = [
        KeyLimits(f"k{i}", budget_micros=10**12, budget_period="daily", rpm=1_000, tpm=10**6)
        for i in range(count)
    ]
    ms: list[float] = []

    async def check(i: int) -> None:
        ms.append(await timed(store.check_rate(keys[i % count], 500, t0 + i / 1_000)))

    await in_parallel(range(3 * count), check)
    print(line(f"check_rate over {count:,} keys, c={WORKERS}", ms))


async def purge(redis: Any, prefix: str) -> None:
    batch = []
    async for name in redis.scan_iter(match=f"{prefix}:*", count=10_000):
        batch.append(name)
        if len(batch) >= 1_000:
            await redis.unlink(*batch)
            batch = []
    if batch:
        await redis.unlink(*batch)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("redis", "memory"), default="redis")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rate", type=int, default=1_000, help="requests a second (steady)")
    parser.add_argument("--holds", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=20_000)
    args = parser.parse_args()

    t0 = time.time() - 600  # synthetic clock: all of this happens "in the past"
    key = KeyLimits("steady", budget_micros=10**15, budget_period="daily", rpm=10**8, tpm=10**12)
    if args.store == "memory":
        await run(MemoryLimitStore(), None, key, t0, args)
        return

    import redis.asyncio as aredis

    redis = aredis.Redis.from_url(args.redis_url, socket_timeout=120)
    prefix = f"xrbench-{uuid.uuid4().hex[:8]}"
    store = RedisLimitStore(args.redis_url, key_prefix=prefix)
    if not await store.ping():
        print(f"redis unreachable at {args.redis_url}")
        return
    try:
        await run(store, redis, key, t0, args)
    finally:
        await purge(redis, prefix)
        await redis.aclose()


async def run(
    store: LimitStore, redis: Any | None, key: KeyLimits, t0: float, args: argparse.Namespace
) -> None:
    try:
        await steady(store, redis, key, t0, args.rate)
        await refusals(store, redis, key, t0 + 60)
        await pauses(store, redis, key, t0 + 60)
        await holds(store, t0, args.holds)
        await many_keys(store, t0, args.keys)
    finally:
        await store.aclose()


if __name__ == "__main__":
    uvloop.run(main())
