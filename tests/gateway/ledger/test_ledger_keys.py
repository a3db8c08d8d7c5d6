from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.keys import (
    DuplicateAliasError,
    KeyNotFoundError,
    KeyRepository,
)
from gateway.ledger.schema import api_keys


async def all_text(engine: AsyncEngine) -> str:
    """Every value of every table, as text."""

    def dump(conn: sa.Connection) -> str:
        md = sa.MetaData()
        md.reflect(conn)
        parts = []
        for table in md.sorted_tables:
            for row in conn.execute(sa.select(table)):
                parts.append(repr(tuple(row)))
        return "\n".join(parts)

    async with engine.connect() as conn:
        return await conn.run_sync(dump)


async def test_the_secret_is_never_stored(engine: AsyncEngine) -> None:
    repo = KeyRepository(engine)
    info, secret = await repo.create(
        "team-a",
        budget_usd="12.5",
        budget_period="monthly",
        rpm=60,
        tpm=100_000,
        allowed_models=["gpt-4o-mini", "claude-haiku"],
        allowed_policies=["compact"],
        metadata={"team": "a", "user": "ann"},
    )
    assert secret.startswith("xr-") and len(secret) == 3 + 43
    text = await all_text(engine)
    assert info.key_id in text
    assert hashlib.sha256(secret.encode()).hexdigest() in text  # the hash is what is kept
    assert secret not in text
    assert secret[3:] not in text
    for shown in (repr(info), str(info), str(info.to_dict())):
        assert secret not in shown
        assert hashlib.sha256(secret.encode()).hexdigest() not in shown


async def test_create_and_look_up(engine: AsyncEngine) -> None:
    repo = KeyRepository(engine)
    info, secret = await repo.create(
        "svc",
        budget_usd=0.1,
        budget_period="daily",
        allowed_models=["b", "a", "a"],
        metadata={"team": "x"},
    )
    assert info.key_id.startswith("key_") and len(info.key_id) == 12
    assert info.budget_micros == 100_000  # exact, no float drift
    assert info.allowed_models == ("a", "b")
    assert info.allowed_policies is None and info.allows_policy("anything")
    assert info.allows_model("a") and not info.allows_model("c")
    assert info.metadata == {"team": "x"}
    assert await repo.get(info.key_id) == info
    assert await repo.by_secret(secret) == info
    assert await repo.by_secret(secret + "x") is None
    assert await repo.by_secret("not-a-key") is None
    assert await repo.get("key_missing") is None
    with pytest.raises(DuplicateAliasError):
        await repo.create("svc")
    with pytest.raises(ValueError):
        await repo.create("bad-period", budget_period="hourly")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await repo.create("bad-rpm", rpm=0)


async def test_update_and_revoke(engine: AsyncEngine) -> None:
    repo = KeyRepository(engine)
    first, secret = await repo.create("one", rpm=10, allowed_models=["a"])
    second, _ = await repo.create("two")

    updated = await repo.update(first.key_id, rpm=None, tpm=500, budget_usd="3", alias="uno")
    assert (updated.rpm, updated.tpm, updated.budget_micros, updated.alias) == (
        None,
        500,
        3_000_000,
        "uno",
    )
    assert updated.allowed_models == ("a",)  # untouched
    with pytest.raises(ValueError, match="cannot update"):
        await repo.update(first.key_id, key_hash="0" * 64)
    with pytest.raises(DuplicateAliasError):
        await repo.update(first.key_id, alias="two")
    with pytest.raises(KeyNotFoundError):
        await repo.update("key_nothere", rpm=5)

    assert [k.key_id for k in await repo.list()] == [first.key_id, second.key_id]
    revoked = await repo.revoke(first.key_id)
    assert revoked.revoked and revoked.revoked_at is not None
    assert await repo.by_secret(secret) is None
    assert (await repo.by_secret(secret, include_revoked=True)) == revoked
    assert [k.key_id for k in await repo.list()] == [second.key_id]
    assert {k.key_id for k in await repo.list(include_revoked=True)} == {
        first.key_id,
        second.key_id,
    }
    again = await repo.revoke(first.key_id)
    assert again.revoked_at == revoked.revoked_at  # the first revocation time stays
    # A revoked key stays as it was revoked (as rotate refuses one).
    with pytest.raises(KeyNotFoundError):
        await repo.update(first.key_id, rpm=5)
    with pytest.raises(KeyNotFoundError):
        await repo.update(first.key_id)
    assert (await repo.get(first.key_id)) == revoked
    with pytest.raises(KeyNotFoundError):
        await repo.revoke("key_nothere")


async def test_a_revoked_keys_alias_may_be_taken_again(engine: AsyncEngine) -> None:
    # An alias names one live key; a revoked key keeps its own in the history, and a new
    # key (or a live one renamed) may take it, as a deleted key's alias is free in LiteLLM.
    repo = KeyRepository(engine)
    old, _ = await repo.create("search")
    await repo.revoke(old.key_id)
    new, _ = await repo.create("search")
    assert new.key_id != old.key_id
    kept = await repo.get(old.key_id)
    assert kept is not None and kept.revoked and kept.alias == "search"
    with pytest.raises(DuplicateAliasError):
        await repo.create("search")  # the live one holds it
    other, _ = await repo.create("other")
    with pytest.raises(DuplicateAliasError):
        await repo.update(other.key_id, alias="search")
    await repo.revoke(new.key_id)
    assert (await repo.update(other.key_id, alias="search")).alias == "search"
    by_alias = sorted(
        (k.key_id, k.revoked) for k in await repo.list(include_revoked=True) if k.alias == "search"
    )
    assert by_alias == sorted([(old.key_id, True), (new.key_id, True), (other.key_id, False)])
    # The database holds the line too, for two gateways creating the same alias at once.
    with pytest.raises(sa.exc.IntegrityError):
        async with engine.begin() as conn:
            await conn.execute(
                api_keys.insert().values(
                    key_id="key_racer",
                    key_hash="0" * 64,
                    alias="search",
                    metadata={},
                    created_at=datetime.now(UTC),
                )
            )


async def test_expiry_is_stored_in_utc_changed_and_cleared(engine: AsyncEngine) -> None:
    repo = KeyRepository(engine)
    never, _ = await repo.create("never")
    assert never.expires_at is None and not never.expired()
    # A naive time is UTC; an aware one is converted; both come back aware, in UTC.
    naive = datetime(2031, 5, 6, 7, 8, 9)
    key, secret = await repo.create("dated", expires_at=naive)
    assert key.expires_at == naive.replace(tzinfo=UTC)
    assert not key.expired() and key.expired(datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC))
    paris = timezone(timedelta(hours=2))
    moved = await repo.update(key.key_id, expires_at=datetime(2031, 1, 1, 2, 0, tzinfo=paris))
    assert moved.expires_at == datetime(2031, 1, 1, 0, 0, tzinfo=UTC)
    assert (await repo.by_secret(secret)) == moved  # lookups carry it to the authenticator
    view = moved.to_dict()
    assert (view["expires_at"], view["expired"]) == ("2031-01-01T00:00:00+00:00", False)
    past = await repo.update(key.key_id, expires_at=datetime(2020, 1, 1, tzinfo=UTC))
    assert past.expired() and past.to_dict()["expired"] is True
    cleared = await repo.update(key.key_id, expires_at=None)
    assert cleared.expires_at is None
    with pytest.raises(ValueError, match="expires_at"):
        await repo.update(key.key_id, expires_at="tomorrow")


async def test_rotation_replaces_the_secret_and_keeps_the_key(engine: AsyncEngine) -> None:
    repo = KeyRepository(engine)
    key, old = await repo.create("rotated", budget_usd=5, rpm=60)
    rotated, new = await repo.rotate(key.key_id)
    assert new != old and new.startswith("xr-")
    assert rotated == key  # same id, budget, limits, metadata: only the secret changed
    assert await repo.by_secret(old) is None
    assert await repo.by_secret(new) == key
    async with engine.connect() as conn:
        stored = (await conn.execute(sa.select(api_keys.c.key_hash))).scalars().all()
    assert new not in stored and hashlib.sha256(new.encode()).hexdigest() in stored
    await repo.revoke(key.key_id)
    with pytest.raises(KeyNotFoundError):
        await repo.rotate(key.key_id)  # a revoked key stays revoked
    with pytest.raises(KeyNotFoundError):
        await repo.rotate("key_nothere")


async def test_routing_defaults_keep_what_is_set(engine: AsyncEngine) -> None:
    repo = KeyRepository(engine)
    key, _ = await repo.create("routed", routing={"cost_weight": 2.5, "max_cost_usd": None})
    assert key.routing == {"cost_weight": 2.5}  # an unset default is the gateway's
    changed = await repo.update(key.key_id, routing={"default_policy": "cascade"})
    assert changed.routing == {"default_policy": "cascade"}  # replaced, not merged
    assert changed.to_dict()["routing"] == {"default_policy": "cascade"}
    assert (await repo.update(key.key_id, routing={})).routing is None
    assert (await repo.update(key.key_id, routing=None)).routing is None
    with pytest.raises(ValueError, match="routing takes"):
        await repo.update(key.key_id, routing={"lambda": 1})


async def test_keys_are_listed_page_by_page_in_creation_order(engine: AsyncEngine) -> None:
    repo = KeyRepository(engine)
    made = [(await repo.create(f"page-{i}"))[0].key_id for i in range(5)]
    # Two keys made in the same instant: the key id breaks the tie, so no page repeats or
    # skips one.
    same = datetime(2030, 1, 1, tzinfo=UTC)
    async with engine.begin() as conn:
        await conn.execute(
            api_keys.update().where(api_keys.c.key_id.in_(made[3:])).values(created_at=same)
        )
    order = made[:3] + sorted(made[3:])
    pages, after = [], None
    while True:
        page = [k.key_id for k in await repo.list(limit=2, after=after)]
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert pages == [order[:2], order[2:4], order[4:]]
    await repo.revoke(order[1])
    assert [k.key_id for k in await repo.list(limit=2, after=order[0])] == order[2:4]
    # A revoked key still works as a cursor (the page after it was fetched while it lived).
    assert [k.key_id for k in await repo.list(after=order[1])] == order[2:]
    assert await repo.count() == 4 and await repo.count(include_revoked=True) == 5
    with pytest.raises(KeyNotFoundError):
        await repo.list(after="key_nope")
