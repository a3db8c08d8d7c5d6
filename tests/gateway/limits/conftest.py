"""Fixtures for the limit-store suite: every shared test runs against both backends.

Redis tests use the real server on 127.0.0.1:6379 with a key prefix unique to the test and
delete everything under it afterwards; they skip (with the reason) if Redis isn't there.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aredis

from gateway.limits import LimitStore, MemoryLimitStore
from gateway.limits.redis_store import RedisLimitStore
from tests.support.services import REDIS_URL, need_redis

StoreFactory = Callable[..., Awaitable[LimitStore]]


async def _purge(prefix: str) -> None:
    client = aredis.Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
def redis_prefix() -> str:
    return f"xrtest-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis_client() -> AsyncIterator[aredis.Redis]:
    need_redis()
    client = aredis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def make_store(
    request: pytest.FixtureRequest, redis_prefix: str
) -> AsyncIterator[StoreFactory]:
    """``await make_store(hold_ttl_s=...)`` builds a store of the parametrized backend."""
    backend: str = request.param
    if backend == "redis":
        need_redis()
    made: list[LimitStore] = []

    async def factory(**kwargs: Any) -> LimitStore:
        store: LimitStore
        if backend == "redis":
            store = RedisLimitStore(REDIS_URL, key_prefix=redis_prefix, **kwargs)
        else:
            store = MemoryLimitStore(**kwargs)
        made.append(store)
        return store

    yield factory
    for store in made:
        await store.aclose()
    if backend == "redis":
        await _purge(redis_prefix)


@pytest.fixture
async def store(make_store: StoreFactory) -> LimitStore:
    return await make_store()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
