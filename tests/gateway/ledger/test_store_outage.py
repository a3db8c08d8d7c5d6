"""A PostgreSQL ledger that is down or hung, seen through a real connection: a loopback
proxy in front of the session's database that the test cuts (connections closed, new ones
refused) or freezes (accepted, nothing forwarded). asyncpg raises the socket's own errors
there, which SQLAlchemy does not wrap; the gateway must still see an outage — a key taken as
last read, a 503 — never a 500 or a request held for asyncpg's 60 s connect timeout."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.auth import Authenticator
from gateway.errors import APIError
from gateway.ledger.keys import KeyRepository
from gateway.ledger.store import create_ledger_engine, open_ledger_engine
from tests.support.tcp_proxy import TcpProxy

from .conftest import run_in_thread
from .factories import PG_HOST, PG_PORT, pg_admin, pg_url

pytestmark = pytest.mark.postgres


@pytest.fixture
async def proxied(pg_database: str) -> AsyncIterator[tuple[AsyncEngine, TcpProxy, str]]:
    """(an engine that reaches the database through the proxy, the proxy, a key's secret)."""
    run_in_thread(
        lambda: pg_admin("DROP SCHEMA public CASCADE", "CREATE SCHEMA public", database=pg_database)
    )
    direct = await open_ledger_engine(pg_url(pg_database))
    _, secret = await KeyRepository(direct).create("app")
    await direct.dispose()
    proxy = TcpProxy(PG_HOST, PG_PORT)
    await proxy.start()
    url = pg_url(pg_database).replace(f":{PG_PORT}/", f":{proxy.port}/")
    engine = create_ledger_engine(url)
    try:
        yield engine, proxy, secret
    finally:
        await proxy.close()
        await engine.dispose()


async def test_a_database_that_is_down_is_an_outage(
    proxied: tuple[AsyncEngine, TcpProxy, str],
) -> None:
    engine, proxy, secret = proxied
    auth = Authenticator(
        KeyRepository(engine), enabled=True, admin_key=None, ttl_s=0.01, stale_if_error_s=30
    )
    known = await auth.caller({"authorization": f"Bearer {secret}"})
    await proxy.cut()
    await asyncio.sleep(0.02)  # past the cache's TTL
    # The key in hand is served as last read; a key never read is the outage, said as one.
    assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == known.key_id
    with pytest.raises(APIError) as exc:
        await auth.caller({"authorization": f"Bearer xr-{secrets.token_urlsafe(32)}"})
    assert (exc.value.status, exc.value.code) == (503, "database_unavailable")
    # What admin, feedback and spend calls meet: an error the app answers as a 503.
    with pytest.raises(sa_exc.DBAPIError, match="cannot reach the database"):
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
    await proxy.restore()
    async with engine.connect() as conn:
        assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1


async def test_an_outage_asks_the_client_back_when_a_lookup_will_be_made(
    proxied: tuple[AsyncEngine, TcpProxy, str],
) -> None:
    """A failed lookup holds the others back for the cache's TTL: a key refused meanwhile
    is told to retry after it (a retry sooner meets the same 503 without a lookup)."""
    engine, proxy, _ = proxied
    auth = Authenticator(
        KeyRepository(engine), enabled=True, admin_key=None, ttl_s=3.0, stale_if_error_s=30
    )
    await proxy.cut()
    with pytest.raises(APIError) as exc:
        await auth.caller({"authorization": f"Bearer xr-{secrets.token_urlsafe(32)}"})
    assert (exc.value.status, exc.value.code) == (503, "database_unavailable")
    assert exc.value.headers["retry-after"] == "3"
    assert 2500 < int(exc.value.headers["retry-after-ms"]) <= 3000
    await asyncio.sleep(1.0)
    with pytest.raises(APIError) as exc:
        await auth.caller({"authorization": f"Bearer xr-{secrets.token_urlsafe(32)}"})
    assert exc.value.headers["retry-after"] == "2"  # what is left of the wait
    await proxy.restore()


async def test_a_database_that_hangs_holds_a_key_lookup_for_its_timeout_only(
    proxied: tuple[AsyncEngine, TcpProxy, str],
) -> None:
    engine, proxy, secret = proxied
    auth = Authenticator(
        KeyRepository(engine),
        enabled=True,
        admin_key=None,
        ttl_s=0.01,
        stale_if_error_s=30,
        lookup_timeout_s=0.5,
    )
    known = await auth.caller({"authorization": f"Bearer {secret}"})
    await proxy.freeze()
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == known.key_id
    with pytest.raises(APIError) as exc:
        await auth.caller({"authorization": f"Bearer xr-{secrets.token_urlsafe(32)}"})
    assert (exc.value.status, exc.value.code) == (503, "database_unavailable")
    assert time.monotonic() - t0 < 2.0  # two lookups of 0.5 s each, not a minute
    await proxy.restore()
    assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == known.key_id


async def test_a_hung_database_holds_one_lookup_at_a_time_not_every_request(
    proxied: tuple[AsyncEngine, TcpProxy, str],
) -> None:
    """Every request of every known key waited the lookup's whole timeout while the
    database hung (each started a lookup of its own, found the key as last read and did not
    keep it): a 20-fold drop in throughput for the outage. After a failed lookup, keys are
    taken as last read without one until the TTL passes; then one request probes."""
    engine, proxy, secret = proxied
    auth = Authenticator(
        KeyRepository(engine),
        enabled=True,
        admin_key=None,
        ttl_s=0.4,
        stale_if_error_s=30,
        lookup_timeout_s=0.5,
    )
    known = await auth.caller({"authorization": f"Bearer {secret}"})
    await proxy.freeze()
    await asyncio.sleep(0.45)  # past the cache's TTL

    async def timed() -> float:
        t0 = time.monotonic()
        assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == known.key_id
        return time.monotonic() - t0

    assert await timed() >= 0.45  # the lookup that finds the outage waits its timeout
    quick = [await timed() for _ in range(5)]
    assert max(quick) < 0.1, quick  # then no lookup: the key as last read
    # A key never read is the outage at once too.
    with pytest.raises(APIError) as exc:
        await auth.caller({"authorization": f"Bearer xr-{secrets.token_urlsafe(32)}"})
    assert (exc.value.status, exc.value.code) == (503, "database_unavailable")
    # Asked to come back when a lookup will be made again, and not before (at least 1 s).
    assert (exc.value.headers["retry-after"], exc.value.headers["retry-after-ms"]) == ("1", "1000")
    await asyncio.sleep(0.45)  # past the wait: one request probes, the others do not wait
    waits = sorted(await asyncio.gather(*(timed() for _ in range(5))))
    assert waits[-1] >= 0.45 and waits[-2] < 0.1, waits
    await proxy.restore()
    await asyncio.sleep(0.45)
    assert await timed() < 0.45  # the database answers again, and is asked again
    await proxy.freeze()
    await asyncio.sleep(0.45)
    assert await timed() >= 0.45  # asked, since the last lookup answered
    await proxy.restore()


async def test_the_urls_own_connect_timeout_is_taken_as_seconds(
    proxied: tuple[AsyncEngine, TcpProxy, str],
) -> None:
    engine, proxy, _ = proxied
    url = engine.url.render_as_string(hide_password=False)
    await proxy.freeze()
    quick = create_ledger_engine(url + "?timeout=0.5")
    t0 = time.monotonic()
    try:
        with pytest.raises(sa_exc.DBAPIError, match="cannot reach the database: TimeoutError"):
            async with quick.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
    finally:
        await quick.dispose()
    assert time.monotonic() - t0 < 5.0  # the URL's 0.5 s, not the default 10 s
    for bad in ("abc", "0", "-1", "inf"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            create_ledger_engine(f"{url}?timeout={bad}")


async def test_the_urls_asyncpg_settings_are_read_as_asyncpg_wants_them(
    proxied: tuple[AsyncEngine, TcpProxy, str],
) -> None:
    """Numbers and flags in the URL's query reach asyncpg as such: passed on as text, the
    first connection raised a TypeError (``'<' not supported between 'str' and 'int'``)."""
    engine, _, _ = proxied
    url = engine.url.render_as_string(hide_password=False)
    tuned = create_ledger_engine(
        f"{url}?statement_cache_size=0&command_timeout=5&ssl=disable&direct_tls=false"
    )
    try:
        async with tuned.connect() as conn:
            assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1
    finally:
        await tuned.dispose()
    with pytest.raises(ValueError, match=r"libpq's sslmode is asyncpg's ssl: \?ssl=require"):
        create_ledger_engine(f"{url}?sslmode=require")
