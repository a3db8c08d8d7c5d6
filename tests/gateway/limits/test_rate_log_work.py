"""Both stores' rate limits do bounded work per call, whatever a key's rate, and answer
exactly alike.

Redis runs one script at a time for every worker and key, so a script that reads a whole
rate log stalls all of them: with the tpm log read entry by entry, the first check after a
pause and every tpm 429 took tens to hundreds of milliseconds on a busy key, and a burst of
429s timed every request of every key out (503 ``limits_unavailable``). The in-process store
did the same walks in Python on the gateway's event loop, stalling every request of the
worker."""

from __future__ import annotations

import asyncio
import random
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import pytest
import redis.asyncio as aredis

import gateway.limits
from gateway.limits import KeyLimits, MemoryLimitStore, RateResult
from gateway.limits.redis_store import RedisLimitStore
from tests.support.redis_server import PrivateRedis
from tests.support.services import REDIS_URL

T = TypeVar("T")
T0 = 1_741_773_600.3  # 2025-03-12 10:00:00.3 UTC
RATE = 1_000  # requests a second laid down in the key's window
# Redis time one call may take: reading the entries involved one by one took 21-34 ms (a
# 2-core VM), the bounded scripts take 0.4-0.8 ms there.
BOUND_MS = 5.0


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    redis_server = PrivateRedis()  # alone on it: SLOWLOG shows this test's scripts only
    yield redis_server
    redis_server.kill()


@pytest.fixture
async def slowlog(server: PrivateRedis) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis(port=server.port)
    await client.config_set("slowlog-log-slower-than", 0)  # every command, with its µs
    await client.config_set("slowlog-max-len", 10_000)
    yield client
    await client.aclose()


async def redis_ms(slowlog: aredis.Redis, call: Awaitable[T]) -> tuple[T, float]:
    """The call's result, and how long Redis spent running its script (one EVALSHA)."""
    await slowlog.slowlog_reset()
    result = await call
    entries = await slowlog.slowlog_get(10_000)
    scripts = [e["duration"] for e in entries if e["command"].startswith(b"EVALSHA")]
    assert len(scripts) == 1, entries
    return result, scripts[0] / 1000


@pytest.mark.redis
async def test_a_pause_and_a_tpm_429_on_a_busy_key_take_redis_a_bounded_time(
    server: PrivateRedis, slowlog: aredis.Redis
) -> None:
    store = RedisLimitStore(server.url, key_prefix="work")
    key = KeyLimits("busy", rpm=10**8, tpm=10**12)
    try:
        # A minute of a key at 1,000 requests a second: 60,000 entries in each log.
        for start in range(0, 60 * RATE, 2_000):
            await asyncio.gather(
                *(store.check_rate(key, 500, T0 + i / RATE) for i in range(start, start + 2_000))
            )
        # Checks after 1 s and after 18 s without traffic, in turn: the 18 s pauses find
        # 18,000 entries of each log gone at once.
        pauses: dict[int, list[float]] = {1: [], 18: []}
        now = T0 + 60
        for gap in (1, 18, 1, 18, 1, 18):
            now += gap
            if gap == 1 and len(pauses[18]) == 2:
                # ~21,000 entries left in the window: a request as large as what they hold is
                # refused until the last of them (T0 + 98) has left
                used = 10**12 - ((await store.check_rate(key, 0, now)).remaining_tokens or 0)
                full = KeyLimits("busy", rpm=10**8, tpm=used)
                walks = []
                for _ in range(3):
                    refused, ms = await redis_ms(slowlog, store.check_rate(full, used, now))
                    assert not refused.allowed and refused.limit == "tpm"
                    assert refused.retry_after_s == pytest.approx(59.0)
                    walks.append(ms)
                assert min(walks) < BOUND_MS, walks
            result, ms = await redis_ms(slowlog, store.check_rate(key, 500, now))
            assert result.allowed
            pauses[gap].append(ms)
        # Not slower for the 18,000 entries than for the 1,000 (min: a busy machine may
        # pause Redis itself now and then).
        assert min(pauses[18]) < BOUND_MS, pauses
        assert min(pauses[18]) < 4 * max(pauses[1]) + 1.0, pauses
    finally:
        await store.aclose()


# -- the in-process store: bounded Python per call ----------------------------------------------

_LIMITS_DIR = str(Path(gateway.limits.__file__).parent)


async def python_lines(call: Awaitable[T]) -> tuple[T, int]:
    """The call's result, and how many lines of ``gateway.limits`` Python it ran.

    A count, not a time: deterministic, and what a walk over a log in Python costs the event
    loop (a line or two an entry). It does not see work done in C (a bisection, copying an
    array); bench/limits_latency.py --store memory times the calls whole."""
    lines = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(_LIMITS_DIR) else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        result = await call  # the in-process store never suspends: nothing else runs here
    finally:
        sys.settrace(previous)
    return result, lines


# Lines of Python one call may run on a key at 1,000 requests a second. The tick sums take a
# few lines per tick of the window (240) and per timestamp of one tick (~250): 85 for a check
# in steady traffic, 400-1,650 for these. Walking the log took 2-3 lines an entry: 57,000
# after 10 s, 180,000 after 30 s, 357,000 for the 429.
LINES_BOUND = 5_000


async def test_a_pause_and_a_429_on_a_busy_key_run_bounded_python_in_process() -> None:
    store = MemoryLimitStore()
    key = KeyLimits("busy", rpm=10**8, tpm=10**12)
    # A minute of a key at 1,000 requests a second, as the gateway books them: an estimate at
    # admission and its correction dated at admission, when the request ends.
    for i in range(60 * RATE):
        now = T0 + i / RATE
        assert (await store.check_rate(key, 2_010, now)).allowed
        await store.add_tokens(key, -1_990, now + 0.5, at=now)
    end = T0 + 60
    work: dict[str, int] = {}
    _, work["steady"] = await python_lines(store.check_rate(key, 500, end))

    state = await store.check_rate(key, 0, end)
    used = 10**12 - (state.remaining_tokens or 0)
    requests = 10**8 - (state.remaining_requests or 0)
    # refused until the window's last request has left, and until about half of them have
    refused, work["tpm 429"] = await python_lines(
        store.check_rate(KeyLimits("busy", tpm=used), used, end)
    )
    assert refused.limit == "tpm" and refused.retry_after_s == pytest.approx(60.0, abs=0.01)
    refused, work["rpm 429"] = await python_lines(
        store.check_rate(KeyLimits("busy", rpm=requests // 2), 0, end)
    )
    assert refused.limit == "rpm" and 29 < (refused.retry_after_s or 0) < 31

    # the first checks after 10 s and then 30 s more without traffic: that much of both logs
    # (10,000 and 30,000 requests) has left at once
    for gap, at in ((10, end + 10), (30, end + 40)):
        allowed, work[f"after {gap} s"] = await python_lines(store.check_rate(key, 500, at))
        assert allowed.allowed
    assert max(work.values()) < LINES_BOUND, work


# -- same answers as the in-process store ------------------------------------------------------


def _answer(result: RateResult) -> tuple[Any, ...]:
    # Redis hands durations back with 6 decimals
    def approx(value: float | None) -> Any:
        return None if value is None else pytest.approx(value, abs=1e-5)

    return (
        result.allowed,
        result.limit,
        result.remaining_requests,
        result.remaining_tokens,
        approx(result.retry_after_s),
        approx(result.reset_requests_s),
        approx(result.reset_tokens_s),
    )


# Steps between calls: several requests a tick, ticks and seconds apart, pauses of up to a
# window. From T0 (.3 s past a tick) timestamps and cutoffs fall inside ticks; from a whole
# second in steps of 1/8 s (exact in binary) they fall on tick starts, and a cutoff exactly on
# an entry (60 s later: it has just left).
ANY_TIME = (T0, (0, 0.01, 0.03, 0.1, 0.125, 0.25, 0.375, 1, 7, 30, 59.75))
ON_TICKS = (1_741_773_600.0, (0, 0, 0.125, 0.25, 0.375, 0.5, 1, 7, 30, 59.75, 60, 60.125))


async def _same_answers(seed: int, prefix: str, clock: tuple[float, tuple[float, ...]]) -> None:
    rng = random.Random(seed)
    memory = MemoryLimitStore()
    redis = RedisLimitStore(REDIS_URL, key_prefix=prefix)
    rpm = rng.choice([None, 5, 50, 500])
    key = KeyLimits(f"k{seed}", rpm=rpm, tpm=rng.choice([1_000, 5_000, 20_000]))
    admitted: list[float] = []
    now, steps = clock
    try:
        for step in range(1_000):
            now += rng.choice(steps)
            if rng.random() < 0.65 or not admitted:
                tokens = rng.choice([0, 1, 10, 100, 500, 999, 5_000])
                want = _answer(await memory.check_rate(key, tokens, now))
                got = _answer(await redis.check_rate(key, tokens, now))
                assert got == want, (seed, step, now - T0, tokens)
                if want[0]:
                    admitted.append(now)
            else:
                # a correction dated at its request's admission (a refund, or more used), or
                # dated now: a negative net weight at its own timestamp
                at: float | None = rng.choice(admitted)
                if rng.random() < 0.3:
                    at = None
                delta = rng.choice([-999, -500, -10, 50, 300, -3_000])
                await memory.add_tokens(key, delta, now, at=at)
                await redis.add_tokens(key, delta, now, at=at)
    finally:
        await redis.aclose()


@pytest.mark.redis
@pytest.mark.parametrize("clock", [ANY_TIME, ON_TICKS], ids=["any-time", "on-ticks"])
async def test_the_redis_rate_limits_answer_what_the_in_process_ones_do(
    redis_prefix: str, redis_client: aredis.Redis, clock: tuple[float, tuple[float, ...]]
) -> None:
    try:
        for seed in range(16):
            await _same_answers(seed, f"{redis_prefix}-{uuid.uuid4().hex[:4]}", clock)
    finally:
        keys = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}*")]
        if keys:
            await redis_client.delete(*keys)


# -- budget holds ----------------------------------------------------------------------------


async def test_the_first_reserve_after_a_mass_expiry_runs_bounded_python_in_process() -> None:
    """50,000 holds expiring together (a mass failure: none was settled) were all popped by
    the next budget call, ~500,000 lines of Python (57-150 ms on the event loop); it frees
    256 now, as the Redis scripts do (test_limit_stores shows the two stores' answers equal).
    Holds settled before are no work either: in a heap, the entries they left in front of the
    expired holds had to be popped first."""
    store = MemoryLimitStore(hold_ttl_s=60.0)
    key = KeyLimits("mass", budget_micros=10**12, budget_period="total")
    for i in range(50_000):  # capped too: the request-cap spend expires with each hold
        assert (await store.reserve(key, 10**6, 1_000, f"h{i}", T0 + 10 + i / 1_000)).ok
    for i in range(20_000):  # served and settled, with earlier deadlines
        assert (await store.reserve(key, None, 1_000, f"s{i}", T0 + i / 2_000)).ok
        await store.settle(key, f"s{i}", 1_000, 900, T0 + i / 2_000)
    later = T0 + 60 + 60  # every hold expired
    reserved, lines = await python_lines(store.reserve(key, 10**6, 1_000, "next", later))
    assert reserved.ok
    assert lines < LINES_BOUND, lines
    # the 256 earliest went; the rest are swept by the next calls, 256 a call
    state = await store.spent(key, later)
    assert (state.spent, state.reserved) == (20_000 * 900, (50_000 - 2 * 256 + 1) * 1_000)
