"""Does a router's cost fall as the cost weight λ grows?

A cost-penalized policy asked to weigh cost more should spend no more: a sweep whose
average cost rises between consecutive λ points (beyond a small tolerance, for the noise
of ties and near-equal models) points to an under-trained or badly validated policy. The
eval says so; the metrics themselves are left as measured.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from training.evaluation.metrics import CurvePoint

# A rise counts when it exceeds this share of the cost at the smaller λ: below it, a few
# prompts switching between near-equal models.
RELATIVE_TOLERANCE = 0.01


def cost_rises(
    points: Sequence[CurvePoint], tolerance: float = RELATIVE_TOLERANCE
) -> dict[str, Any] | None:
    """The steps of increasing λ (``CurvePoint.param``) where the average cost rose by more
    than ``tolerance`` of the cost before: how many of how many, and the largest rise (in
    USD, with the λ pair). None when there is none, or fewer than two λ points."""
    swept = sorted((p for p in points if p.param is not None), key=lambda p: float(p.param or 0))
    rises: list[tuple[float, CurvePoint, CurvePoint]] = []
    for a, b in itertools.pairwise(swept):
        if b.cost - a.cost > tolerance * a.cost and b.cost > a.cost:
            rises.append((b.cost - a.cost, a, b))
    if not rises:
        return None
    rise, a, b = max(rises, key=lambda r: r[0])
    return {
        "steps": len(rises),
        "of": len(swept) - 1,
        "largest_rise_usd": rise,
        "largest_rise_from": a.param,
        "largest_rise_to": b.param,
        "tolerance": tolerance,
    }


def cost_rise_note(router: str, rises: dict[str, Any]) -> str:
    """The report's note on a router whose cost rose with λ (``cost_rises``)."""
    return (
        f"{router}: average cost rose with λ at {rises['steps']} of its {rises['of']} steps "
        f"of increasing λ (by more than {100 * rises['tolerance']:g}% of the cost before; the "
        f"largest rise ${rises['largest_rise_usd']:.6f}, from λ {rises['largest_rise_from']:g} "
        f"to {rises['largest_rise_to']:g}): a cost-penalized policy should spend less as λ "
        "grows, so it is likely under-trained or badly validated"
    )
