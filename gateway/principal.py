"""Who is calling, as authentication resolved it: what the rest of a request's handling
(routing, limits, the ledger, the model list) needs to know about its key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.limits.base import KeyLimits

FIXED_PREFIX = "fixed:"


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

    def may_use_model(self, name: str) -> bool:
        return self.allowed_models is None or name in self.allowed_models

    def may_use_policy(self, name: str) -> bool:
        """``fixed:<model>`` calls that one model, so it takes the model's permission as
        well as the policy's: a key kept off a model is kept off its fixed policy too."""
        if self.allowed_policies is not None and name not in self.allowed_policies:
            return False
        return not name.startswith(FIXED_PREFIX) or self.may_use_model(name[len(FIXED_PREFIX) :])
