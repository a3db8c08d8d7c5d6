"""Per-key rate limits and spend budgets, in process or in Redis (see ``base`` for semantics).

``build_limit_store(settings.limits, hold_ttl_s=...)`` gives the gateway its store: the
configured backend wrapped in the configured failure policy. The Redis backend is imported
only when configured, so the embedded default never loads the Redis client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.limits.base import (
    STORE_UNAVAILABLE,
    BudgetState,
    KeyLimits,
    LimitStore,
    LimitStoreUnavailable,
    RateResult,
    ReserveResult,
    SlotResult,
)
from gateway.limits.fail_policy import FailPolicyStore
from gateway.limits.memory import DEFAULT_HOLD_TTL_S, MemoryLimitStore
from gateway.limits.windows import BUDGET_PERIODS, RATE_WINDOW_S, BudgetPeriod, period_window

if TYPE_CHECKING:
    from gateway.limits.redis_store import RedisLimitStore
    from gateway.settings import LimitsSettings

__all__ = [
    "BUDGET_PERIODS",
    "DEFAULT_HOLD_TTL_S",
    "RATE_WINDOW_S",
    "STORE_UNAVAILABLE",
    "BudgetPeriod",
    "BudgetState",
    "FailPolicyStore",
    "KeyLimits",
    "LimitStore",
    "LimitStoreUnavailable",
    "MemoryLimitStore",
    "RateResult",
    "RedisLimitStore",
    "ReserveResult",
    "SlotResult",
    "build_limit_store",
    "period_window",
]


def build_limit_store(
    settings: LimitsSettings,
    *,
    hold_ttl_s: float = DEFAULT_HOLD_TTL_S,
    on_event: Callable[[str], None] | None = None,
) -> FailPolicyStore:
    """The store ``settings`` describe, wrapped in its ``on_store_error`` policy.

    ``hold_ttl_s`` should exceed the longest a request can run (the server's request
    timeout plus a margin): a hold older than that is presumed abandoned and released."""
    inner: LimitStore
    if settings.backend == "redis":
        from gateway.limits.redis_store import RedisLimitStore

        inner = RedisLimitStore(
            settings.redis_url, key_prefix=settings.key_prefix, hold_ttl_s=hold_ttl_s
        )
    else:
        inner = MemoryLimitStore(hold_ttl_s=hold_ttl_s)
    return FailPolicyStore(inner, settings.on_store_error, on_event)


def __getattr__(name: str) -> Any:
    if name == "RedisLimitStore":
        from gateway.limits.redis_store import RedisLimitStore

        return RedisLimitStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
