"""Redis-only behaviour: exactness across real processes, key layout, unreachable server."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio as aredis

from gateway.limits import (
    STORE_UNAVAILABLE,
    FailPolicyStore,
    KeyLimits,
    LimitStoreUnavailable,
    period_window,
)
from gateway.limits.redis_store import RedisLimitStore
from tests.support.services import REDIS_URL

pytestmark = pytest.mark.redis

REPO_ROOT = Path(__file__).resolve().parents[3]

# Each worker process waits for a common start time, then fires all its attempts at once.
_WORKER = """
import asyncio, json, sys, time
from gateway.limits import KeyLimits
from gateway.limits.redis_store import RedisLimitStore

prefix, start_at, attempts = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])

async def main():
    store = RedisLimitStore("redis://127.0.0.1:6379/0", key_prefix=prefix)
    rate_key = KeyLimits("shared", rpm=50, tpm=1_000_000)
    budget_key = KeyLimits("shared", budget_micros=2_000, budget_period="daily")
    await store.ping()  # connect before the start line
    await asyncio.sleep(max(0.0, start_at - time.time()))
    rates = await asyncio.gather(*(store.check_rate(rate_key, 10) for _ in range(attempts)))

    async def spend(i):
        rid = f"{prefix}-{i}-{id(store)}"
        got = await store.reserve(budget_key, None, 100, rid)
        if got.ok:
            await store.settle(budget_key, rid, 100, 100)
            return 100
        return 0

    spent = await asyncio.gather(*(spend(i) for i in range(30)))
    await store.aclose()
    print(json.dumps({"accepted": sum(r.allowed for r in rates), "spent": sum(spent)}))

asyncio.run(main())
"""


async def test_rpm_is_exact_across_processes(redis_client: aredis.Redis, redis_prefix: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    start_at = time.time() + 1.5  # time for both interpreters to import and connect
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _WORKER,
            redis_prefix,
            repr(start_at),
            "60",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        outputs = [await asyncio.wait_for(p.communicate(), timeout=30) for p in procs]
        for p, (_, err) in zip(procs, outputs, strict=True):
            assert p.returncode == 0, err.decode()
        results = [json.loads(out) for out, _ in outputs]
        assert sum(r["accepted"] for r in results) == 50
        # budget: every settled micro-dollar is in the shared counter, and none over budget
        store = RedisLimitStore(REDIS_URL, key_prefix=redis_prefix)
        try:
            state = await store.spent(
                KeyLimits("shared", budget_micros=2_000, budget_period="daily")
            )
        finally:
            await store.aclose()
        assert state.spent == sum(r["spent"] for r in results) <= 2_000
        assert state.reserved == 0
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
        keys = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}:*")]
        if keys:
            await redis_client.delete(*keys)


async def test_keys_are_hash_tagged_and_expire(
    redis_client: aredis.Redis, redis_prefix: str
) -> None:
    store = RedisLimitStore(REDIS_URL, key_prefix=redis_prefix, hold_ttl_s=120)
    try:
        daily = KeyLimits("team{a}", budget_micros=10_000, budget_period="daily", rpm=5, tpm=500)
        lifetime = KeyLimits("lifetime", budget_micros=10_000)
        for limits in (daily, lifetime):
            await store.check_rate(limits, 10)
            await store.add_tokens(limits, 5)
            assert (await store.reserve(limits, 5_000, 100, "req-1")).ok
            assert (await store.reserve(limits, None, 100, "req-2")).ok
            await store.settle(limits, "req-1", 100, 90)
        assert (await store.reserve(None, 1_000, 10, "anon-1")).ok

        keys = sorted([k async for k in redis_client.scan_iter(match=f"{redis_prefix}:*")])
        tag = re.compile(rf"^{re.escape(redis_prefix)}:\{{([^{{}}]+)\}}:")
        tags = {tag.match(k).group(1) for k in keys}  # type: ignore[union-attr]
        assert tags == {"team%7Ba%7D", "lifetime", "%anon:anon-1"}
        for k in keys:
            ttl = await redis_client.pttl(k)
            if k.endswith(":b:spent:total"):
                assert ttl == -1, k  # a lifetime budget's spend is kept
            else:
                assert ttl > 0, k  # everything else cleans itself up
        # the per-request key exists only for the capped request
        assert any(k.endswith(":b:req:req-1") for k in keys)
        assert not any(k.endswith(":b:req:req-2") for k in keys)
    finally:
        await store.aclose()
        keys = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}:*")]
        if keys:
            await redis_client.delete(*keys)


async def test_restored_counters_expire_like_settled_ones_and_the_marker_goes_with_the_data(
    redis_client: aredis.Redis, redis_prefix: str
) -> None:
    store = RedisLimitStore(REDIS_URL, key_prefix=redis_prefix)
    try:
        daily = KeyLimits("d", budget_micros=10_000, budget_period="daily")
        lifetime = KeyLimits("t", budget_micros=10_000)
        now = time.time()
        await store.restore_spent(daily, period_window("daily", now), 1_234, now=now)
        await store.restore_spent(lifetime, period_window(None, now), 5_678, now=now)
        await store.mark_spend_restored()
        day = period_window("daily", now)
        daily_key = f"{redis_prefix}:{{d}}:b:spent:{day.id}"
        assert await redis_client.get(daily_key) == "1234"
        ttl_ms = await redis_client.pttl(daily_key)
        expected = day.counter_ttl_s(now)
        assert expected is not None and 0 < ttl_ms <= expected * 1000
        assert await redis_client.pttl(f"{redis_prefix}:{{t}}:b:spent:total") == -1
        assert await store.spend_restored()
        # What a Redis that lost its data looks like to the gateway: no counters, no marker.
        keys = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}:*")]
        await redis_client.delete(*keys)
        assert not await store.spend_restored()
        assert (await store.spent(daily, now=now)).spent == 0
    finally:
        await store.aclose()
        keys = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}:*")]
        if keys:
            await redis_client.delete(*keys)


async def test_unreachable_redis_raises_unavailable(closed_port: int) -> None:
    store = RedisLimitStore(f"redis://127.0.0.1:{closed_port}/0", key_prefix="xrtest-down")
    key = KeyLimits("k", budget_micros=100, budget_period="daily", rpm=5, tpm=100)
    started = time.monotonic()
    try:
        assert await store.ping() is False
        with pytest.raises(LimitStoreUnavailable, match="redis"):
            await store.check_rate(key, 1)
        with pytest.raises(LimitStoreUnavailable):
            await store.add_tokens(key, 1)
        with pytest.raises(LimitStoreUnavailable):
            await store.reserve(key, None, 1, "r")
        with pytest.raises(LimitStoreUnavailable):
            await store.settle(key, "r", 1, 1)
        with pytest.raises(LimitStoreUnavailable):
            await store.spent(key)
    finally:
        await store.aclose()
    assert time.monotonic() - started < 5  # fails fast instead of hanging the request


async def test_rejects_prefix_that_breaks_hash_tags() -> None:
    with pytest.raises(ValueError):
        RedisLimitStore(REDIS_URL, key_prefix="bad{prefix}")


async def test_concurrent_calls_share_a_pipeline_and_survive_a_script_flush(
    redis_client: aredis.Redis, redis_prefix: str
) -> None:
    store = RedisLimitStore(REDIS_URL, key_prefix=redis_prefix)
    try:
        limits = KeyLimits("batched", budget_micros=1_000, budget_period="total", rpm=1000)
        # Redis forgets every script (as after a restart): batched EVALSHAs get NOSCRIPT,
        # and the store loads the scripts and runs those calls again.
        await redis_client.script_flush()
        results = await asyncio.gather(
            *(store.reserve(limits, None, 30, f"r{i}") for i in range(50))
        )
        assert sum(r.ok for r in results) == 33  # 33 x 30 <= 1000 < 34 x 30, exactly
        rates = await asyncio.gather(*(store.check_rate(limits, 1) for _ in range(20)))
        assert [r.remaining_requests for r in rates if r.allowed] != [] and all(
            r.allowed for r in rates
        )
        await asyncio.gather(*(store.settle(limits, f"r{i}", 30, 10) for i in range(33)))
        state = await store.spent(limits)
        assert (state.spent, state.reserved) == (330, 0)
    finally:
        await store.aclose()
        keys = [k async for k in redis_client.scan_iter(match=f"{redis_prefix}:*")]
        if keys:
            await redis_client.delete(*keys)


async def test_write_behind_settle_failure_reaches_the_fail_policy(
    redis_client: aredis.Redis, redis_prefix: str
) -> None:
    # settle() returns before Redis has run it; when the script then fails, the failure
    # must still be reported (the gateway counts it in xrouter_limit_store_errors_total).
    events: list[str] = []
    store = FailPolicyStore(
        RedisLimitStore(REDIS_URL, key_prefix=redis_prefix), "closed", events.append
    )
    limits = KeyLimits("wb", budget_micros=1_000, budget_period="total")
    try:
        assert (await store.reserve(limits, None, 100, "r1")).ok
        await store.settle(limits, "r1", 100, 60)
        assert (await store.spent(limits)).spent == 60  # a later read sees the settle
        assert events == []
        # Break the key's hold set so the next settle's script errors (WRONGTYPE).
        holds = f"{redis_prefix}:{{wb}}:b:holds"
        await redis_client.set(holds, "not a zset")  # (settled holds left it empty, i.e. gone)
        await store.settle(limits, "r2", 100, 60)  # returns: nothing awaited the reply
        for _ in range(100):
            if events:
                break
            await asyncio.sleep(0.01)
        assert events == [STORE_UNAVAILABLE]
    finally:
        await store.aclose()
