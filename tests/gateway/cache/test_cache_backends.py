"""The cache's backends: the in-process LRU (expiry, both bounds) and Redis (the real
server on 127.0.0.1:6379; a closed port; a server that never answers)."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aredis

from gateway.cache import CacheUnavailable, MemoryBackend, RedisBackend
from tests.support.gateway import free_port
from tests.support.services import REDIS_URL, need_redis


async def test_memory_entries_expire_after_their_ttl() -> None:
    m = MemoryBackend(max_entries=10, max_bytes=1 << 20)
    await m.put("short", b"a", ttl_s=0.5)
    await m.put("long", b"b", ttl_s=60)
    assert await m.get("short") == b"a"
    await asyncio.sleep(0.6)
    assert await m.get("short") is None and await m.get("long") == b"b"
    assert len(m) == 1 and m.size_bytes == 1  # an expired entry read is gone


async def test_memory_evicts_the_least_recently_used_beyond_either_bound() -> None:
    m = MemoryBackend(max_entries=3, max_bytes=1 << 20)
    for k in "abc":
        await m.put(k, k.encode() * 10, ttl_s=60)
    await m.get("a")  # a is now the most recently used
    await m.put("d", b"d" * 10, ttl_s=60)
    assert [k for k in "abcd" if await m.get(k) is not None] == ["a", "c", "d"]

    m = MemoryBackend(max_entries=100, max_bytes=100)
    for k in "abcde":
        await m.put(k, k.encode() * 30, ttl_s=60)  # 30 bytes each: three fit
    assert [k for k in "abcde" if await m.get(k) is not None] == ["c", "d", "e"]
    assert m.size_bytes == 90
    await m.put("huge", b"x" * 101, ttl_s=60)  # larger than the whole cache: not kept
    assert await m.get("huge") is None and m.size_bytes == 90
    await m.put("c", b"C", ttl_s=60)  # replacing an entry frees its bytes
    assert m.size_bytes == 61 and await m.get("c") == b"C"


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    prefix = f"xrtest-cache-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = aredis.Redis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.mark.redis
async def test_redis_stores_under_the_prefix_with_the_ttl(redis_prefix: str) -> None:
    backend = RedisBackend(REDIS_URL, prefix=redis_prefix, timeout_s=0.5)
    try:
        assert await backend.get("k") is None
        await backend.put("k", b"\x00answer\xff", ttl_s=30)
        # The SET is write-behind, but Redis runs a connection's commands in order: the
        # GET pipelined after it sees it.
        assert await backend.get("k") == b"\x00answer\xff"
        client = aredis.Redis.from_url(REDIS_URL)
        ttl = await client.pttl(f"{redis_prefix}:k")
        await client.aclose()
        assert 29_000 < ttl <= 30_000
        assert backend.errors == 0
    finally:
        await backend.aclose()


async def test_clearing_drops_every_answer_and_nothing_else(redis_prefix: str) -> None:
    m = MemoryBackend(max_entries=10, max_bytes=1 << 20)
    for k in "abc":
        await m.put(k, b"v", ttl_s=60)
    assert await m.clear() == 3 and len(m) == 0 and m.size_bytes == 0 and await m.get("a") is None

    need_redis()
    # A prefix with glob characters in it is matched as written, not as a pattern.
    prefix = f"{redis_prefix}[ab]*"
    backend = RedisBackend(REDIS_URL, prefix=prefix, timeout_s=0.5)
    client = aredis.Redis.from_url(REDIS_URL)

    def digest(i: int) -> str:  # answers are keyed by cache_key's SHA-256 hex digest
        return hashlib.sha256(f"k{i}".encode()).hexdigest()

    neighbours = [
        f"{redis_prefix}-other",  # a neighbour's key
        f"{redis_prefix}a*:{digest(0)}",  # what the prefix would match as a pattern
        f"{prefix}:eu:{digest(0)}",  # a deployment whose prefix starts with ours
    ]
    try:
        for i in range(1500):  # more than one SCAN page
            await backend.put(digest(i), b"v", ttl_s=60)
        for name in neighbours:
            await client.set(name, b"not ours", ex=60)
        assert await backend.get(digest(1499)) == b"v"
        assert await backend.clear() == 1500
        assert await backend.get(digest(0)) is None
        for name in neighbours:
            assert await client.get(name) == b"not ours", name
    finally:
        await client.delete(*neighbours)
        keys = [k async for k in client.scan_iter(match=f"{redis_prefix}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
        await backend.aclose()


async def test_redis_that_is_not_there_is_unavailable_not_an_error() -> None:
    backend = RedisBackend(f"redis://127.0.0.1:{free_port()}/0", prefix="x", timeout_s=0.2)
    try:
        with pytest.raises(CacheUnavailable):
            await backend.get("k")
        with pytest.raises(CacheUnavailable):
            await backend.put("k", b"v", ttl_s=1)
        with pytest.raises(CacheUnavailable):
            await backend.clear()
    finally:
        await backend.aclose()


async def test_a_redis_that_never_answers_costs_one_timeout(silent_redis_url: str) -> None:
    """A server that accepts and stays silent (a hung Redis): the lookup gives up after
    ``timeout_s``, not after the client's connection timeout."""
    backend = RedisBackend(silent_redis_url, prefix="x", timeout_s=0.1)
    try:
        t0 = time.perf_counter()
        with pytest.raises(CacheUnavailable):
            await backend.get("k")
        assert 0.09 < time.perf_counter() - t0 < 0.5
    finally:
        await backend.aclose()
