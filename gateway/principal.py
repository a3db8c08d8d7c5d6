"""Who is calling, as authentication resolved it: what the rest of a request's handling
(routing, limits, the ledger, the model list) needs to know about its key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.limits.base import KeyLimits


@dataclass(slots=True)
class Principal:
    """Who is calling: an API key, or nobody when auth is off."""

    key_id: str | None = None
    alias: str | None = None
    allowed_models: list[str] | None = None
    allowed_policies: list[str] | None = None
    limits: KeyLimits | None = None
    expires_at: float | None = None  # Unix time after which the key is refused
    # The key's routing defaults: what its requests get when they do not say.
    default_policy: str | None = None
    cost_weight: float | None = None
    max_cost_micros: int | None = None
