"""Key budget gauges kept current between a key's calls (``gateway.budget_gauges``), against
a real SQLite key table, the in-process limit store and an unreachable Redis."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.budget_gauges import BudgetGauges
from gateway.ledger.keys import KeyInfo, KeyRepository
from gateway.ledger.store import open_ledger_engine
from gateway.limits import LimitStore, MemoryLimitStore
from gateway.limits.redis_store import RedisLimitStore
from gateway.metrics import GatewayMetrics

GAUGE = "xrouter_key_budget_remaining_usd"


@pytest.fixture
async def keys(tmp_path: Path) -> AsyncIterator[KeyRepository]:
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    yield KeyRepository(engine)
    await engine.dispose()


@pytest.fixture
def metrics() -> GatewayMetrics:
    return GatewayMetrics(CollectorRegistry(), models=[], policies=[])


def gauge(metrics: GatewayMetrics, alias: str) -> float | None:
    return metrics.registry.get_sample_value(GAUGE, {"key_alias": alias})


async def spend(store: LimitStore, key: KeyInfo, micros: int, rid: str) -> None:
    limits = key.limits()
    assert (await store.reserve(limits, None, micros, rid)).ok
    await store.settle(limits, rid, micros, micros)


async def test_a_key_out_of_budget_yesterday_reads_its_new_period_without_calling(
    keys: KeyRepository, metrics: GatewayMetrics
) -> None:
    """The gauge read 0 when the key was refused last period; the store's counter for this
    period is empty. Without a refresh it would read 0 (and alert) until the key called
    again in this process."""
    store = MemoryLimitStore()
    key, _ = await keys.create("daily", budget_usd=2, budget_period="daily")
    metrics.key_budgets.remaining("daily", 0)  # the last reading, yesterday
    gauges = BudgetGauges(store, keys, metrics, interval_s=3600)
    gauges.track("daily", key.key_id)
    await gauges.refresh()
    assert gauge(metrics, "daily") == 2.0
    # Spend elsewhere (another worker or replica on the same store) shows at the next one.
    await spend(store, key, 250_000, "r1")
    await gauges.refresh()
    assert gauge(metrics, "daily") == 1.75


async def test_after_a_restart_the_keys_with_budgets_are_exported_without_calling(
    keys: KeyRepository,
) -> None:
    """Only keys that called since the restart were exported: one exhausted before it, which
    may never call again, lost its series and the "budget exhausted" alert cleared."""
    store = MemoryLimitStore()
    spent, _ = await keys.create("spent", budget_usd=1, budget_period="total")
    await keys.create("fresh", budget_usd=2, budget_period="daily")
    await keys.create("unbudgeted")
    gone, _ = await keys.create("gone", budget_usd=3)
    await keys.revoke(gone.key_id)
    await spend(store, spent, 1_000_000, "r1")
    metrics = GatewayMetrics(CollectorRegistry(), models=[], policies=[])
    gauges = BudgetGauges(store, keys, metrics, interval_s=3600)  # the restarted process
    await gauges.refresh()
    assert (gauge(metrics, "spent"), gauge(metrics, "fresh")) == (0.0, 2.0)
    assert gauge(metrics, "unbudgeted") is None and gauge(metrics, "gone") is None
    # No more than the gauge exports: the oldest first.
    one = GatewayMetrics(CollectorRegistry(), models=[], policies=[], budget_gauge_keys=1)
    await BudgetGauges(store, keys, one, interval_s=3600).refresh()
    assert (gauge(one, "spent"), gauge(one, "fresh")) == (0.0, None)


async def test_changed_revoked_and_renamed_keys_follow_the_ledger(
    keys: KeyRepository, metrics: GatewayMetrics
) -> None:
    store = MemoryLimitStore()
    raised, _ = await keys.create("raised", budget_usd=1)
    revoked, _ = await keys.create("revoked", budget_usd=1)
    renamed, _ = await keys.create("renamed", budget_usd=1)
    unbudgeted, _ = await keys.create("unbudgeted", budget_usd=1)
    gauges = BudgetGauges(store, keys, metrics, interval_s=3600)
    for key in (raised, revoked, renamed, unbudgeted):
        await spend(store, key, 400_000, f"r-{key.alias}")
        metrics.key_budgets.remaining(key.alias, 600_000)
        gauges.track(key.alias, key.key_id)
    await gauges.refresh()  # its first pass, which takes up the live budgeted keys
    # Changed through the admin API of another replica: this process learns it here.
    await keys.update(raised.key_id, budget_micros=3_000_000)
    await keys.revoke(revoked.key_id)
    await keys.update(renamed.key_id, alias="renamed-now")
    await keys.update(unbudgeted.key_id, budget_micros=None)
    await gauges.refresh()
    assert gauge(metrics, "raised") == 2.6
    for gone in ("revoked", "renamed", "unbudgeted"):
        assert gauge(metrics, gone) is None  # the series is dropped, its slot freed
    assert gauge(metrics, "renamed-now") is None  # exported at its next call, not before
    assert set(gauges.tracked) == {"raised"}


async def test_an_unreachable_store_keeps_the_last_readings_and_is_logged_once(
    keys: KeyRepository, metrics: GatewayMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RedisLimitStore(f"redis://127.0.0.1:{port}/0", key_prefix="xrtest-gauges")
    key, _ = await keys.create("k", budget_usd=1)
    metrics.key_budgets.remaining("k", 300_000)
    gauges = BudgetGauges(store, keys, metrics, interval_s=3600)
    gauges.track("k", key.key_id)
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.budget_gauges"):
            await gauges.refresh()
            await gauges.refresh()
        assert gauge(metrics, "k") == 0.3
        assert set(gauges.tracked) == {"k"}  # still kept current once the store is back
        failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(failures) == 1 and "refreshing" in failures[0].getMessage()
    finally:
        await store.aclose()
