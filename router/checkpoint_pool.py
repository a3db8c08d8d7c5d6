"""Whether a compact checkpoint may serve a configured pool, and how its actions map onto it.

A checkpoint's actions are the models it was trained on, in order; the gateway's pool may
have dropped some of them, added others, or changed their prices since. :func:`check_pool`
decides what the checkpoint can still route (masking the models that are gone) and what the
operator should be warned about; only a pool with none of its models is an error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from router.checkpoint import CheckpointError, CompactCheckpoint
from router.pool import ModelPool

logger = logging.getLogger(__name__)


class CheckpointPoolMismatch(CheckpointError):
    """The configured pool cannot be served by the checkpoint."""


@dataclass(frozen=True, slots=True)
class PoolCheck:
    """How a configured pool maps onto a checkpoint."""

    active: list[str]  # checkpoint models present in the pool, in checkpoint order
    masked: list[str]  # checkpoint models absent from the pool (never chosen)
    # Pool models the checkpoint has no action for (added since it was trained): it never
    # routes to them, but ε-exploration may, so the logs can teach the next checkpoint.
    untrained: list[str] = field(default_factory=list)
    price_changes: dict[str, dict[str, tuple[str | None, str | None]]] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        out = []
        for model, changes in self.price_changes.items():
            desc = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changes.items())
            out.append(f"price of {model!r} changed since training ({desc} USD/1M tokens)")
        return out


def _same_price(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return a == b


def check_pool(ckpt: CompactCheckpoint, pool: ModelPool) -> PoolCheck:
    """Check that ``pool`` can be served by ``ckpt``.

    The checkpoint routes among the models it was trained on that the pool has: checkpoint
    models missing from the pool are masked out, and pool models the checkpoint does not know
    are left to the other policies and to requests that name them (adding a model to a
    running gateway must not take its learned router down). Only a pool with none of the
    checkpoint's models is an error. A changed price is a warning (the policy's trade-offs
    were learned at the old prices); both are logged.
    """
    trained = ckpt.pool
    configured = pool.names
    untrained = [m for m in configured if m not in trained]
    masked = [m for m in trained if m not in pool]
    name = ckpt.metadata.name or (str(ckpt.path) if ckpt.path else "the checkpoint")
    if len(masked) == len(trained):
        raise CheckpointPoolMismatch(
            f"{name} cannot route the configured pool: no model of the pool is in the "
            f"checkpoint; checkpoint pool: {', '.join(trained)}; configured pool: "
            f"{', '.join(configured) or '(empty)'}; retrain on this pool"
        )
    changes: dict[str, dict[str, tuple[str | None, str | None]]] = {}
    now = pool.price_snapshot()
    for model in configured:
        then = ckpt.metadata.prices.get(model)
        if then is None:
            continue
        diff = {
            k: (then.get(k), now[model].get(k))
            for k in ("input", "output")
            if not _same_price(then.get(k), now[model].get(k))
        }
        if diff:
            changes[model] = diff
    result = PoolCheck(
        active=[m for m in trained if m in pool],
        masked=masked,
        untrained=untrained,
        price_changes=changes,
    )
    for w in result.warnings:
        logger.warning("%s: %s", name, w)
    if untrained:
        logger.warning(
            "%s was not trained on %s: it routes among %s only; the new models are served "
            "by name and by the other policies (explore with router.epsilon > 0 to "
            "log them, then retrain)",
            name,
            ", ".join(untrained),
            ", ".join(result.active),
        )
    if masked:
        logger.info("%s: models not in the configured pool are masked: %s", name, ", ".join(masked))
    return result
