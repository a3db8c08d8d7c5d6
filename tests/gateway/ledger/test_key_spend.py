"""Services.key_spend read from the ledger (a revoked key, or a limit store that is down),
on SQLite and PostgreSQL: a key over its budget has none left, never a negative amount."""

from __future__ import annotations

import socket
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.keys import KeyRepository
from gateway.ledger.writer import LedgerWriter
from gateway.limits import FailPolicyStore, LimitStore, MemoryLimitStore
from gateway.limits.redis_store import RedisLimitStore
from gateway.services import Services
from gateway.settings import LedgerSettings, Settings

from .factories import make_request

BUDGET_USD = 0.0005
SPENT_MICROS = 665  # over the 500 micro-USD budget, as a last request can take a key


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def spend_in_ledger(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], key_id: str
) -> None:
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    writer.submit(make_request("over-1", key_id=key_id, call_costs=(400,)))
    writer.submit(make_request("over-2", key_id=key_id, call_costs=(SPENT_MICROS - 400,)))
    await writer.close()


def services(engine: AsyncEngine, store: LimitStore) -> Services:
    return Services(
        Settings(), CollectorRegistry(), engine=engine, limits=FailPolicyStore(store, "closed")
    )


async def test_a_revoked_key_over_its_budget_has_none_left(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    # The store knows nothing of the key (as after a restart: only live keys are restored),
    # so its spend comes from the ledger.
    repo = KeyRepository(engine)
    key, _ = await repo.create("over", budget_usd=BUDGET_USD, budget_period="total")
    await spend_in_ledger(engine, make_settings, key.key_id)
    revoked = await repo.revoke(key.key_id)
    spent, remaining = await services(engine, MemoryLimitStore()).key_spend(revoked)
    assert (spent, remaining) == (SPENT_MICROS / 1e6, 0.0)


async def test_a_key_over_its_budget_has_none_left_while_the_store_is_down(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    repo = KeyRepository(engine)
    key, _ = await repo.create("over-live", budget_usd=BUDGET_USD, budget_period="monthly")
    await spend_in_ledger(engine, make_settings, key.key_id)
    down = RedisLimitStore(f"redis://127.0.0.1:{closed_port()}/0", key_prefix="xrtest-down")
    try:
        spent, remaining = await services(engine, down).key_spend(key)
    finally:
        await down.aclose()
    assert (spent, remaining) == (SPENT_MICROS / 1e6, 0.0)
