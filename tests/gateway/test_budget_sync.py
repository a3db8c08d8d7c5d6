"""Key budgets restored from the ledger (``gateway.budget_sync``), against a real SQLite
ledger and both limit stores (Redis on 127.0.0.1:6379)."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as aredis
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.budget_sync import BudgetSync
from gateway.ledger.keys import KeyInfo, KeyRepository
from gateway.ledger.store import open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.limits import FailPolicyStore, LimitStore, MemoryLimitStore
from gateway.limits.redis_store import RedisLimitStore
from gateway.metrics import GatewayMetrics
from gateway.settings import LedgerSettings
from tests.gateway.ledger.factories import make_request
from tests.support.redis_server import PrivateRedis
from tests.support.services import REDIS_URL, need_redis

NOW = datetime(2025, 3, 12, 10, 0, tzinfo=UTC).timestamp()
HOUR, DAY = 3600.0, 86400.0


@dataclass
class Ledger:
    engine: AsyncEngine
    writer: LedgerWriter
    keys: KeyRepository


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[Ledger]:
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    # Rows wait in the queue (no timer flush during a test): only an explicit flush writes.
    settings = LedgerSettings(
        url="sqlite://", spill_dir=str(tmp_path / "spill"), flush_interval_ms=60_000
    )
    writer = LedgerWriter(engine, settings)
    await writer.start()
    yield Ledger(engine, writer, KeyRepository(engine))
    await writer.close()
    await engine.dispose()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LimitStore]:
    if request.param == "memory":
        yield MemoryLimitStore()
        return
    need_redis()
    prefix = f"xrtest-{uuid.uuid4().hex[:12]}"
    redis_store = RedisLimitStore(REDIS_URL, key_prefix=prefix)
    yield redis_store
    await redis_store.aclose()
    await _purge(prefix)


async def _purge(prefix: str) -> int:
    client = aredis.Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        return len(keys)
    finally:
        await client.aclose()


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry(), models=["m"], policies=["compact"])


def restores(metrics: GatewayMetrics, trigger: str) -> float:
    value = metrics.registry.get_sample_value("xrouter_budget_restores_total", {"trigger": trigger})
    return value or 0.0


def spend(ledger: Ledger, key: KeyInfo | None, at: float, *costs: int) -> int:
    """Log one request of ``key`` at ``at``: a router call of 999 µUSD and downstream calls
    costing ``costs``; returns what the request cost."""
    rid = f"req-{uuid.uuid4().hex[:10]}"
    ledger.writer.submit(
        make_request(
            rid,
            created_at=at,
            key_id=None if key is None else key.key_id,
            models=tuple(f"m{i}" for i in range(len(costs))),
            call_costs=costs,
            router_cost=999,
        )
    )
    return 999 + sum(costs)


def sync(
    store: LimitStore,
    ledger: Ledger,
    metrics: GatewayMetrics,
    clock: Callable[[], float] = lambda: NOW,
    in_flight_s: float = 0.0,
) -> BudgetSync:
    return BudgetSync(
        store,
        ledger.keys,
        ledger.engine,
        interval_s=3600,
        flush=ledger.writer.flush,
        metrics=metrics,
        clock=clock,
        in_flight_s=in_flight_s,
    )


async def spent(store: LimitStore, key: KeyInfo) -> int:
    return (await store.spent(key.limits(), now=NOW)).spent


async def test_startup_restores_each_budgeted_key_for_its_current_period(
    store: LimitStore, ledger: Ledger, metrics: GatewayMetrics
) -> None:
    total, _ = await ledger.keys.create("total", budget_usd=5)
    daily, _ = await ledger.keys.create("daily", budget_usd=5, budget_period="daily")
    weekly, _ = await ledger.keys.create("weekly", budget_usd=5, budget_period="weekly")
    monthly, _ = await ledger.keys.create("monthly", budget_usd=5, budget_period="monthly")
    unbudgeted, _ = await ledger.keys.create("unbudgeted")
    revoked, _ = await ledger.keys.create("revoked", budget_usd=5)
    # 2025-03-12 is a Wednesday: "yesterday" is in this week and month, "last week" in this
    # month, "last month" in none of the periods but the lifetime one.
    times = {"today": NOW - HOUR, "yesterday": NOW - DAY, "last week": NOW - 8 * DAY}
    times["last month"] = NOW - 14 * DAY
    ledgered: dict[str, dict[str, int]] = {}
    for key in (total, daily, weekly, monthly, unbudgeted, revoked):
        ledgered[key.alias] = {when: spend(ledger, key, at, 100, 23) for when, at in times.items()}
    spend(ledger, None, NOW - HOUR, 5_000)  # a request without a key counts for nobody
    await ledger.keys.revoke(revoked.key_id)

    budgets = sync(store, ledger, metrics)
    await budgets.start()  # flushes the queued rows first
    try:
        assert await spent(store, total) == sum(ledgered["total"].values())
        assert await spent(store, daily) == ledgered["daily"]["today"]
        week = ("today", "yesterday")
        assert await spent(store, weekly) == sum(ledgered["weekly"][w] for w in week)
        month = ("today", "yesterday", "last week")
        assert await spent(store, monthly) == sum(ledgered["monthly"][w] for w in month)
        assert await spent(store, unbudgeted) == 0
        assert await spent(store, revoked) == 0
        assert await store.spend_restored()
        assert restores(metrics, "startup") == 1
        # Nothing lost since: a check is one marker lookup and restores nothing.
        assert not await budgets.check()
        assert restores(metrics, "startup") == 1
    finally:
        await budgets.aclose()


async def test_a_restore_never_lowers_a_counter(
    store: LimitStore, ledger: Ledger, metrics: GatewayMetrics
) -> None:
    key, _ = await ledger.keys.create("k", budget_usd=1, budget_period="daily")
    first = spend(ledger, key, NOW - HOUR, 400)
    # Spend the store has and the ledger does not yet (a request still in flight).
    limits = key.limits()
    assert (await store.reserve(limits, None, 3_000, "live", now=NOW)).ok
    await store.settle(limits, "live", 3_000, first + 500, now=NOW)
    await sync(store, ledger, metrics).restore_all()
    assert await spent(store, key) == first + 500
    second = spend(ledger, key, NOW - HOUR, 700)
    await ledger.writer.flush()
    await sync(store, ledger, metrics).restore_all()
    assert await spent(store, key) == first + second


async def test_a_process_that_replayed_a_stopped_ones_journal_restores_a_restored_store(
    store: LimitStore, ledger: Ledger, metrics: GatewayMetrics
) -> None:
    """A replica killed with -9 leaves requests in its journal; the store loses its data and
    a replica that kept running restores it from a ledger without them. The killed one's
    successor replays them, finds the store marked restored, and must restore anyway."""
    key, _ = await ledger.keys.create("k", budget_usd=1)
    before = spend(ledger, key, NOW - HOUR, 300)
    await ledger.writer.flush()
    await sync(store, ledger, metrics).restore_all()  # the replica that kept running
    assert await spent(store, key) == before and await store.spend_restored()
    journaled = spend(ledger, key, NOW - HOUR, 450)  # in the ledger once start() flushes
    plain = sync(store, ledger, metrics)
    await plain.start()  # took over no journal: the marker is enough
    await plain.aclose()
    assert await spent(store, key) == before
    successor = sync(store, ledger, metrics)
    await successor.start(replayed=True)
    try:
        assert await spent(store, key) == before + journaled
        assert restores(metrics, "startup") == 1
        assert not await successor.check()  # once is enough
    finally:
        await successor.aclose()


async def test_changing_a_keys_period_restores_its_new_counter(
    store: LimitStore, ledger: Ledger, metrics: GatewayMetrics
) -> None:
    key, _ = await ledger.keys.create("k", budget_usd=1, budget_period="monthly")
    today = spend(ledger, key, NOW - HOUR, 300)
    earlier = spend(ledger, key, NOW - 5 * DAY, 200)
    budgets = sync(store, ledger, metrics)
    await budgets.start()
    try:
        assert await spent(store, key) == today + earlier
        # The admin API's PATCH: a daily counter is new to the store, not to the ledger.
        changed = await ledger.keys.update(key.key_id, budget_period="daily")
        assert await spent(store, changed) == 0
        await budgets.restore_key(changed)
        assert await spent(store, changed) == today
        assert restores(metrics, "key_update") == 1
        unbudgeted = await ledger.keys.update(key.key_id, budget_micros=None)
        await budgets.restore_key(unbudgeted)  # nothing to restore
        assert restores(metrics, "key_update") == 1
    finally:
        await budgets.aclose()


@pytest.mark.redis
async def test_a_redis_that_lost_its_data_is_restored_at_the_next_check(
    ledger: Ledger, metrics: GatewayMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    need_redis()
    prefix = f"xrtest-{uuid.uuid4().hex[:12]}"
    store = RedisLimitStore(REDIS_URL, key_prefix=prefix)
    key, _ = await ledger.keys.create("k", budget_usd=1)
    ledgered = spend(ledger, key, NOW - HOUR, 250) + spend(ledger, key, NOW - 40 * DAY, 50)
    budgets = sync(store, ledger, metrics)
    try:
        await budgets.start()
        assert await spent(store, key) == ledgered
        # A second gateway process on the same Redis finds the counters there.
        other = sync(store, ledger, metrics)
        await other.start()
        await other.aclose()
        assert restores(metrics, "startup") == 1
        assert await _purge(prefix) > 0  # FLUSHALL, or a restart without persistence
        assert await spent(store, key) == 0
        with caplog.at_level(logging.WARNING, logger="gateway.budget_sync"):
            assert await budgets.check()
        assert await spent(store, key) == ledgered
        assert restores(metrics, "store_lost") == 1
        assert "lost its spend counters" in caplog.text
    finally:
        await budgets.aclose()
        await store.aclose()
        await _purge(prefix)


@pytest.mark.redis
async def test_what_was_in_flight_at_a_loss_is_restored_once_it_reaches_the_ledger(
    ledger: Ledger, metrics: GatewayMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    """A request in flight when Redis lost its counters settles into the emptied store
    before the check finds the loss; the restore then takes the ledger's larger figure and
    that spend is gone from the counter. Once the request's row is in the ledger
    (``in_flight_s`` after the restore) a second restore brings it back — not before, and
    not counted as a second loss."""
    need_redis()
    prefix = f"xrtest-{uuid.uuid4().hex[:12]}"
    store = RedisLimitStore(REDIS_URL, key_prefix=prefix)
    key, _ = await ledger.keys.create("k", budget_usd=1)
    ledgered = spend(ledger, key, NOW - HOUR, 250, 3_000)
    clock = [NOW]
    budgets = sync(store, ledger, metrics, lambda: clock[0], in_flight_s=660)
    try:
        await budgets.start()
        assert await spent(store, key) == ledgered
        assert await _purge(prefix) > 0
        # The request in flight settles its calls into the emptied store (999 + 400 µUSD)...
        await store.settle(key.limits(), "req-late:call_0", 0, 1_399, now=NOW)
        assert await spent(store, key) == 1_399
        # ...and the restore keeps the larger figure, the ledger's, which does not have it.
        assert await budgets.check()
        assert await spent(store, key) == ledgered
        # Its row reaches the ledger after the restore (written behind its response).
        assert spend(ledger, key, NOW - 60, 400) == 1_399
        clock[0] = NOW + 600
        assert not await budgets.check()
        assert await spent(store, key) == ledgered  # not yet: it could still be in flight
        clock[0] = NOW + 661
        with caplog.at_level(logging.INFO, logger="gateway.budget_sync"):
            assert not await budgets.check()
        assert await spent(store, key) == ledgered + 1_399
        assert "in flight when the limit store lost its counters" in caplog.text
        assert restores(metrics, "store_lost") == 1
        clock[0] = NOW + 2_000
        await budgets.check()  # once: nothing pending any more
        assert await spent(store, key) == ledgered + 1_399
    finally:
        await budgets.aclose()
        await store.aclose()
        await _purge(prefix)


@pytest.mark.redis
async def test_a_settle_the_limit_store_gave_up_on_is_recounted_from_the_ledger(
    ledger: Ledger, metrics: GatewayMetrics, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stays down past a settle's deadline (the hold TTL), then comes back from its AOF
    with the "restored" marker: nothing says the counters lost anything but the store's
    count of settles given up, and the next check restores the key from the ledger."""
    (tmp_path / "redis").mkdir()
    server = PrivateRedis(tmp_path / "redis")
    prefix = f"xrtest-{uuid.uuid4().hex[:12]}"
    store = FailPolicyStore(
        RedisLimitStore(server.url, key_prefix=prefix, hold_ttl_s=0.5), "closed"
    )
    key, _ = await ledger.keys.create("k", budget_usd=1)
    ledgered = spend(ledger, key, NOW - HOUR, 250)
    budgets = sync(store, ledger, metrics)
    try:
        await budgets.start()
        assert await spent(store, key) == ledgered
        assert (await store.reserve(key.limits(), None, 2_000, "late", now=NOW)).ok
        server.kill()
        await store.settle(key.limits(), "late", 2_000, 1_399, now=NOW)
        late = spend(ledger, key, NOW - 60, 400)  # its row, written behind its response
        for _ in range(300):
            if store.spend_writes_lost():
                break
            await asyncio.sleep(0.05)
        assert store.spend_writes_lost() == 1
        server.start()
        assert await store.spend_restored()  # the marker survived: no loss to find
        assert await spent(store, key) == ledgered
        with caplog.at_level(logging.WARNING, logger="gateway.budget_sync"):
            assert await budgets.check()
        assert await spent(store, key) == ledgered + late
        assert "could not reach the limit store" in caplog.text
        assert restores(metrics, "store_lost") == 0  # the store lost nothing
        assert not await budgets.check()  # once
    finally:
        await budgets.aclose()
        await store.aclose()
        server.kill()


@pytest.mark.redis
async def test_a_settle_queued_across_a_loss_is_counted_once(
    ledger: Ledger, metrics: GatewayMetrics, tmp_path: Path
) -> None:
    """Redis goes away while a settle is sent (it waits in the retry queue; its row reaches
    the ledger) and comes back empty. The check restored the counter to the ledger's figure,
    which holds that request, and then the queued settle landed and added it again: the key
    over-counted for the rest of its period (restores only raise counters)."""
    (tmp_path / "redis").mkdir()
    server = PrivateRedis(tmp_path / "redis")
    prefix = f"xrtest-{uuid.uuid4().hex[:12]}"
    store = FailPolicyStore(RedisLimitStore(server.url, key_prefix=prefix), "closed")
    key, _ = await ledger.keys.create("k", budget_usd=1)
    ledgered = spend(ledger, key, NOW - HOUR, 250)
    budgets = sync(store, ledger, metrics)
    try:
        await budgets.start()
        assert (await store.reserve(key.limits(), None, 500_000, "late", now=NOW)).ok
        server.kill()
        await store.settle(key.limits(), "late", 500_000, 399_001, now=NOW)
        late = spend(ledger, key, NOW - 60, 400_000)  # its row, written behind its response
        assert store.pending_writes == 1
        server.start()
        client = aredis.Redis.from_url(server.url)
        await client.flushall()  # a restart without persistence
        await client.aclose()
        assert await budgets.check()
        for _ in range(200):  # until the queued settle has landed (at once, here)
            if not store.pending_writes:
                break
            await asyncio.sleep(0.05)
        assert await spent(store, key) == ledgered + late
        assert restores(metrics, "store_lost") == 1
    finally:
        await budgets.aclose()
        await store.aclose()
        server.kill()


@pytest.mark.redis
async def test_a_loss_found_by_a_process_that_did_not_restore_at_startup_is_store_lost(
    ledger: Ledger, metrics: GatewayMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway restarted on a persistent Redis finds the counters there and restores
    nothing at startup (as does every worker but the first): a later loss is still a loss
    of the store, for the log and for the alert on trigger="store_lost"."""
    need_redis()
    prefix = f"xrtest-{uuid.uuid4().hex[:12]}"
    store = RedisLimitStore(REDIS_URL, key_prefix=prefix)
    key, _ = await ledger.keys.create("k", budget_usd=1)
    ledgered = spend(ledger, key, NOW - HOUR, 250)
    first = sync(store, ledger, GatewayMetrics(CollectorRegistry(), models=[], policies=[]))
    restarted = sync(store, ledger, metrics)
    try:
        await first.start()
        await first.aclose()  # the previous gateway process, gone
        await restarted.start()  # finds the marker: nothing to restore
        assert restores(metrics, "startup") == 0
        assert await _purge(prefix) > 0
        with caplog.at_level(logging.WARNING, logger="gateway.budget_sync"):
            assert await restarted.check()
        assert await spent(store, key) == ledgered
        assert restores(metrics, "store_lost") == 1
        assert restores(metrics, "startup") == 0
        assert "lost its spend counters" in caplog.text
    finally:
        await restarted.aclose()
        await store.aclose()
        await _purge(prefix)


async def test_a_ledger_that_cannot_be_read_is_retried_and_logged_once(
    ledger: Ledger, metrics: GatewayMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = create_async_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{port}/none")
    store = MemoryLimitStore()
    key, _ = await ledger.keys.create("k", budget_usd=1)
    ledgered = spend(ledger, key, NOW - HOUR, 640)
    await ledger.writer.flush()
    budgets = BudgetSync(store, KeyRepository(down), down, interval_s=3600, clock=lambda: NOW)
    try:
        with caplog.at_level(logging.INFO, logger="gateway.budget_sync"):
            await budgets.start()  # does not raise: the gateway serves, and retries
            assert not await budgets.check()
            assert not await store.spend_restored()
            failures = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(failures) == 1  # one outage, one line
            # The database is back.
            budgets.keys, budgets.engine = ledger.keys, ledger.engine
            assert await budgets.check()
        assert await spent(store, key) == ledgered
        assert "restored again" in caplog.text
    finally:
        await budgets.aclose()
        await down.dispose()
