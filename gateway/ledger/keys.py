"""API keys, database side: create, look up by secret, list, update, rotate, revoke.

The secret (``xr-`` + 43 url-safe characters) is returned once by :meth:`KeyRepository.create`
and never stored: the table keeps its SHA-256, which is also the lookup index. A fast hash
is right here (unlike passwords): the secret has 256 bits of entropy, so there is nothing to
brute-force, and the gateway hashes it on every request.
"""

from __future__ import annotations

import builtins
import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.echo import echo
from gateway.ledger.schema import api_keys
from gateway.limits.base import KeyLimits
from gateway.limits.windows import BUDGET_PERIODS, BudgetPeriod
from pricing import micros_to_usd, usd_to_micros

SECRET_PREFIX = "xr-"
_ID_ATTEMPTS = 5


class KeyRepositoryError(LookupError):
    """Base for key repository errors."""


class DuplicateAliasError(KeyRepositoryError):
    pass


class KeyNotFoundError(KeyRepositoryError):
    pass


class RotateConflictError(KeyRepositoryError):
    """Another rotation of the same key committed first: this one changed nothing, so its
    secret was never valid. The caller may retry (and get a secret that is)."""


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(4)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A key as the gateway sees it. Holds neither the secret nor its hash."""

    key_id: str
    alias: str
    budget_micros: int | None
    budget_period: BudgetPeriod | None
    rpm: int | None
    tpm: int | None
    allowed_models: tuple[str, ...] | None
    allowed_policies: tuple[str, ...] | None
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    revoked_at: datetime | None = None
    expires_at: datetime | None = None
    # Routing defaults for the key's requests: default_policy, cost_weight, max_cost_usd.
    routing: dict[str, Any] | None = field(default=None, hash=False)
    # The key's requests answered at once; None: no bound.
    max_parallel: int | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or datetime.now(UTC))

    @property
    def budget_usd(self) -> float | None:
        return None if self.budget_micros is None else micros_to_usd(self.budget_micros)

    def limits(self) -> KeyLimits:
        """What the limit store enforces for this key."""
        return KeyLimits(
            self.key_id,
            self.budget_micros,
            self.budget_period,
            self.rpm,
            self.tpm,
            self.max_parallel,
        )

    def allows_model(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models

    def allows_policy(self, policy: str) -> bool:
        return self.allowed_policies is None or policy in self.allowed_policies

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the admin API."""
        return {
            "key_id": self.key_id,
            "alias": self.alias,
            "budget_usd": self.budget_usd,
            "budget_micros": self.budget_micros,
            "budget_period": self.budget_period,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "max_parallel": self.max_parallel,
            "allowed_models": list(self.allowed_models)
            if self.allowed_models is not None
            else None,
            "allowed_policies": (
                list(self.allowed_policies) if self.allowed_policies is not None else None
            ),
            "metadata": dict(self.metadata),
            "created_at": self.created_at.isoformat(),
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "revoked": self.revoked,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "expired": self.expired(),
            "routing": dict(self.routing) if self.routing is not None else None,
        }


# Fields update() accepts.
_UPDATABLE = {
    "alias",
    "budget_usd",
    "budget_micros",
    "budget_period",
    "rpm",
    "tpm",
    "max_parallel",
    "allowed_models",
    "allowed_policies",
    "metadata",
    "expires_at",
    "routing",
}

_INFO_COLUMNS = [c for c in api_keys.c if c.name != "key_hash"]


def _row_to_info(row: sa.Row[Any]) -> KeyInfo:
    m = row._mapping
    return KeyInfo(
        key_id=m["key_id"],
        alias=m["alias"],
        budget_micros=m["budget_micros"],
        budget_period=m["budget_period"],
        rpm=m["rpm"],
        tpm=m["tpm"],
        allowed_models=tuple(m["allowed_models"]) if m["allowed_models"] is not None else None,
        allowed_policies=(
            tuple(m["allowed_policies"]) if m["allowed_policies"] is not None else None
        ),
        metadata=dict(m["metadata"] or {}),
        created_at=m["created_at"],
        revoked_at=m["revoked_at"],
        expires_at=m["expires_at"],
        routing=dict(m["routing"]) if m["routing"] else None,
        max_parallel=m["max_parallel"],
    )


def _budget_micros(budget_usd: float | str | Decimal | None) -> int | None:
    if budget_usd is None:
        return None
    micros = usd_to_micros(budget_usd)
    if micros < 0:
        raise ValueError("budget must be >= 0")
    return micros


def _names(value: Any, what: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of names or None")
    return sorted(set(value))


def _positive(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer or None")
    return value


ROUTING_FIELDS = ("default_policy", "cost_weight", "max_cost_usd")


def _routing(value: Any) -> dict[str, Any] | None:
    """The set routing defaults only (an empty set is None: the gateway's defaults)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - set(ROUTING_FIELDS):
        raise ValueError(f"routing takes {', '.join(ROUTING_FIELDS)}")
    kept = {k: v for k, v in value.items() if v is not None}
    return kept or None


def _expiry(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValueError("expires_at must be a datetime or None")
    # Naive times are UTC, as everywhere in the ledger.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _period(value: Any) -> BudgetPeriod | None:
    if value is not None and value not in BUDGET_PERIODS:
        raise ValueError(f"budget_period must be one of {BUDGET_PERIODS} or None")
    return cast("BudgetPeriod | None", value)


def _alias(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise ValueError("alias must be a non-empty string of at most 255 characters")
    return value.strip()


class KeyRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def create(
        self,
        alias: str,
        budget_usd: float | str | Decimal | None = None,
        budget_period: BudgetPeriod | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        max_parallel: int | None = None,
        allowed_models: builtins.list[str] | None = None,
        allowed_policies: builtins.list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        expires_at: datetime | None = None,
        routing: dict[str, Any] | None = None,
    ) -> tuple[KeyInfo, str]:
        """Create a key; return it and its secret (shown once, never stored)."""
        values: dict[str, Any] = {
            "alias": _alias(alias),
            "budget_micros": _budget_micros(budget_usd),
            "budget_period": _period(budget_period),
            "rpm": _positive(rpm, "rpm"),
            "tpm": _positive(tpm, "tpm"),
            "max_parallel": _positive(max_parallel, "max_parallel"),
            "allowed_models": _names(allowed_models, "allowed_models"),
            "allowed_policies": _names(allowed_policies, "allowed_policies"),
            "metadata": dict(metadata or {}),
            "created_at": datetime.now(UTC),
            "revoked_at": None,
            "expires_at": _expiry(expires_at),
            "routing": _routing(routing),
        }
        for _ in range(_ID_ATTEMPTS):
            secret = new_secret()
            key_id = new_key_id()
            try:
                async with self._engine.begin() as conn:
                    await conn.execute(
                        api_keys.insert().values(
                            key_id=key_id, key_hash=hash_secret(secret), **values
                        )
                    )
            except sa_exc.IntegrityError:
                if await self._live_alias_exists(values["alias"]):
                    raise DuplicateAliasError(f"a key with alias {echo(alias)} exists") from None
                continue  # key_id collision (2^32 space): draw another
            info = await self.get(key_id)
            assert info is not None
            return info, secret
        raise RuntimeError("could not allocate a unique key id")

    async def get(self, key_id: str) -> KeyInfo | None:
        """The key, revoked or not."""
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(sa.select(*_INFO_COLUMNS).where(api_keys.c.key_id == key_id))
            ).first()
        return _row_to_info(row) if row is not None else None

    async def by_secret(self, secret: str, include_revoked: bool = False) -> KeyInfo | None:
        """The key a bearer secret belongs to; revoked keys only on request."""
        if not secret.startswith(SECRET_PREFIX):
            return None
        query = sa.select(*_INFO_COLUMNS).where(api_keys.c.key_hash == hash_secret(secret))
        if not include_revoked:
            query = query.where(api_keys.c.revoked_at.is_(None))
        async with self._engine.connect() as conn:
            row = (await conn.execute(query)).first()
        return _row_to_info(row) if row is not None else None

    async def list(
        self,
        include_revoked: bool = False,
        *,
        limit: int | None = None,
        after: str | None = None,
    ) -> builtins.list[KeyInfo]:
        """Keys in creation order (oldest first); at most ``limit``, starting after the key
        ``after`` (a cursor that stays valid as keys are created, unlike an offset).
        Raises ``KeyNotFoundError`` for an ``after`` that names no key."""
        c = api_keys.c
        query = sa.select(*_INFO_COLUMNS).order_by(c.created_at, c.key_id)
        if not include_revoked:
            query = query.where(c.revoked_at.is_(None))
        if limit is not None:
            query = query.limit(limit)
        async with self._engine.connect() as conn:
            if after is not None:
                at = (await conn.execute(sa.select(c.created_at).where(c.key_id == after))).scalar()
                if at is None:
                    raise KeyNotFoundError(after)
                query = query.where(
                    sa.or_(c.created_at > at, sa.and_(c.created_at == at, c.key_id > after))
                )
            rows = (await conn.execute(query)).all()
        return [_row_to_info(r) for r in rows]

    async def count(self, include_revoked: bool = False) -> int:
        query = sa.select(sa.func.count()).select_from(api_keys)
        if not include_revoked:
            query = query.where(api_keys.c.revoked_at.is_(None))
        async with self._engine.connect() as conn:
            return int((await conn.execute(query)).scalar() or 0)

    async def update(self, key_id: str, **fields: Any) -> KeyInfo:
        """Change some fields; ``None`` clears an optional one. ``budget_usd`` (or
        ``budget_micros``) sets the budget. Raises ``KeyNotFoundError`` for an unknown or
        revoked key (a revoked key stays as it was when revoked)."""
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)}; allowed: {sorted(_UPDATABLE)}")
        if "budget_usd" in fields and "budget_micros" in fields:
            raise ValueError("give budget_usd or budget_micros, not both")
        values: dict[str, Any] = {}
        for name, value in fields.items():
            if name == "alias":
                values["alias"] = _alias(value)
            elif name == "budget_usd":
                values["budget_micros"] = _budget_micros(value)
            elif name == "budget_micros":
                if value is not None and (not isinstance(value, int) or value < 0):
                    raise ValueError("budget_micros must be a non-negative integer or None")
                values["budget_micros"] = value
            elif name == "budget_period":
                values["budget_period"] = _period(value)
            elif name in ("rpm", "tpm", "max_parallel"):
                values[name] = _positive(value, name)
            elif name in ("allowed_models", "allowed_policies"):
                values[name] = _names(value, name)
            elif name == "metadata":
                values["metadata"] = dict(value or {})
            elif name == "expires_at":
                values["expires_at"] = _expiry(value)
            elif name == "routing":
                values["routing"] = _routing(value)
        if values:
            try:
                async with self._engine.begin() as conn:
                    result = await conn.execute(
                        api_keys.update()
                        .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                        .values(**values)
                    )
            except sa_exc.IntegrityError:
                raise DuplicateAliasError(
                    f"a key with alias {echo(values.get('alias'))} exists"
                ) from None
            if result.rowcount == 0:
                raise KeyNotFoundError(key_id)
        info = await self.get(key_id)
        if info is None or info.revoked:
            raise KeyNotFoundError(key_id)
        return info

    async def rotate(self, key_id: str) -> tuple[KeyInfo, str]:
        """Give a live key a new secret; the old one stops matching at once. The key keeps
        its id, so its budget, spend and ledger history carry over. Raises
        ``KeyNotFoundError`` for an unknown or revoked key, ``RotateConflictError`` when
        another rotation of the key committed between this one's read and its write."""
        c = api_keys.c
        # Read the current hash outside the write transaction: on SQLite a read snapshot
        # upgraded to a write fails at once ("database is locked") when another writer
        # committed meanwhile; the conditional UPDATE below is what makes this safe.
        async with self._engine.connect() as conn:
            current = (
                await conn.execute(
                    sa.select(c.key_hash).where(c.key_id == key_id, c.revoked_at.is_(None))
                )
            ).scalar()
        if current is None:
            raise KeyNotFoundError(key_id)
        secret = new_secret()
        # Compare-and-set on the hash read: of concurrent rotations exactly one matches (on
        # PostgreSQL the others wait on the row lock, then re-check the WHERE against the
        # committed row; SQLite runs writes one at a time), so no caller is handed a secret
        # that a later write has already replaced.
        async with self._engine.begin() as conn:
            result = await conn.execute(
                api_keys.update()
                .where(c.key_id == key_id, c.revoked_at.is_(None), c.key_hash == current)
                .values(key_hash=hash_secret(secret))
            )
        info = await self.get(key_id)
        if info is None or info.revoked:
            raise KeyNotFoundError(key_id)  # revoked meanwhile (or just now: same answer)
        if result.rowcount == 0:
            raise RotateConflictError(f"key {echo(key_id)} was rotated concurrently; retry")
        return info, secret

    async def revoke(self, key_id: str) -> KeyInfo:
        """Revoke a key (idempotent: the first revocation time is kept). Raises
        ``KeyNotFoundError``."""
        async with self._engine.begin() as conn:
            await conn.execute(
                api_keys.update()
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=datetime.now(UTC))
            )
        info = await self.get(key_id)
        if info is None:
            raise KeyNotFoundError(key_id)
        return info

    async def _live_alias_exists(self, alias: str) -> bool:
        async with self._engine.connect() as conn:
            row = (
                await conn.execute(
                    sa.select(api_keys.c.key_id).where(
                        api_keys.c.alias == alias, api_keys.c.revoked_at.is_(None)
                    )
                )
            ).first()
        return row is not None
