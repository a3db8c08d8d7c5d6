"""The Redis rate limits do bounded work per call, whatever a key's rate, and still answer
exactly what the in-process store answers.

Redis runs one script at a time for every worker and key, so a script that reads a whole
rate log stalls all of them: with the tpm log read entry by entry, the first check after a
pause and every tpm 429 took tens to hundreds of milliseconds on a busy key, and a burst of
429s timed every request of every key out (503 ``limits_unavailable``)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, TypeVar

import pytest
import redis.asyncio as aredis

from gateway.limits import KeyLimits, MemoryLimitStore, RateResult
from gateway.limits.redis_store import RedisLimitStore
from tests.support.redis_server import PrivateRedis
from tests.support.services import REDIS_URL

pytestmark = pytest.mark.redis

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


async def _same_answers(seed: int, prefix: str) -> None:
    rng = random.Random(seed)
    memory = MemoryLimitStore()
    redis = RedisLimitStore(REDIS_URL, key_prefix=prefix)
    rpm = rng.choice([None, 5, 50, 500])
    key = KeyLimits(f"k{seed}", rpm=rpm, tpm=rng.choice([1_000, 5_000, 20_000]))
    admitted: list[float] = []
    now = T0
    try:
        for step in range(1_000):
            # several requests a tick, ticks and seconds apart, pauses of up to a window
            now += rng.choice([0, 0.01, 0.03, 0.1, 0.125, 0.25, 0.375, 1, 7, 30, 59.75])
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


async def test_the_redis_rate_limits_answer_what_the_in_process_ones_do(
    redis_prefix: str, redis_client: aredis.Redis
) -> None:
    try:
        for seed in range(16):
            await _same_answers(seed, f"{redis_prefix}-{uuid.uuid4().hex[:4]}")
    finally:
        keys = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}*")]
        if keys:
            await redis_client.delete(*keys)
