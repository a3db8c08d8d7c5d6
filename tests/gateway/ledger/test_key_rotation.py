"""Concurrent rotations of one key, on SQLite and PostgreSQL: exactly one secret is handed
out, and it is the one the key answers to."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.keys import (
    KeyInfo,
    KeyNotFoundError,
    KeyRepository,
    RotateConflictError,
)
from gateway.ledger.schema import api_keys

ROTATIONS = 10


async def contended_rotations(
    engine: AsyncEngine, key: KeyInfo, holder_values: dict[str, Any]
) -> list[tuple[KeyInfo, str] | BaseException]:
    """Start ROTATIONS rotations of ``key`` while another transaction holds its row (on
    SQLite: the database's write lock) with ``holder_values`` written; let that transaction
    commit only once every rotation has read the key's hash and sent its UPDATE, so all of
    them read the same hash and contend for the same write."""
    repo = KeyRepository(engine)
    sent = 0
    lock = threading.Lock()  # the events fire on the driver's side of the greenlet bridge

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        nonlocal sent
        if " ".join(statement.split()).upper().startswith("UPDATE API_KEYS SET KEY_HASH"):
            with lock:
                sent += 1

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        async with engine.begin() as holder:
            await holder.execute(
                api_keys.update().where(api_keys.c.key_id == key.key_id).values(**holder_values)
            )
            tasks = [asyncio.create_task(repo.rotate(key.key_id)) for _ in range(ROTATIONS)]
            # Well inside SQLite's 5 s busy timeout, which the waiting UPDATEs run on.
            deadline = time.monotonic() + 3
            while sent < ROTATIONS:
                assert time.monotonic() < deadline, f"only {sent} rotations reached their write"
                await asyncio.sleep(0.01)
        return list(await asyncio.gather(*tasks, return_exceptions=True))
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)


async def test_of_concurrent_rotations_exactly_one_is_handed_a_secret(
    engine: AsyncEngine,
) -> None:
    repo = KeyRepository(engine)
    key, old = await repo.create("contended", budget_usd=5)
    results = await contended_rotations(engine, key, {"alias": key.alias})
    won = [r for r in results if isinstance(r, tuple)]
    lost = [r for r in results if not isinstance(r, tuple)]
    assert len(won) == 1, f"{len(won)} rotations returned a secret; only one can be valid"
    assert len(lost) == ROTATIONS - 1
    assert all(isinstance(e, RotateConflictError) for e in lost), lost
    info, secret = won[0]
    assert info == key
    assert await repo.by_secret(secret) == key  # the secret handed out is the live one
    assert await repo.by_secret(old) is None
    # A loser that retries rotates again: its new secret replaces the winner's.
    retried, again = await repo.rotate(key.key_id)
    assert retried == key and await repo.by_secret(again) == key
    assert await repo.by_secret(secret) is None
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(sa.func.count()).select_from(api_keys))).scalar()
    assert rows == 1


async def test_rotations_racing_a_revocation_find_no_live_key(engine: AsyncEngine) -> None:
    # A key revoked while rotations wait is gone for all of them: 404, not a conflict the
    # caller would retry forever.
    repo = KeyRepository(engine)
    key, old = await repo.create("revoked-meanwhile")
    results = await contended_rotations(engine, key, {"revoked_at": datetime.now(UTC)})
    assert all(isinstance(r, KeyNotFoundError) for r in results), results
    assert await repo.by_secret(old) is None
    with pytest.raises(KeyNotFoundError):
        await repo.rotate(key.key_id)
