"""Cost-quality metrics of routers: curves, their hull, AIQ, PGR/APGR/CPT, cost to match.

A *point* is one operating point of a router on a table: average cost (USD per prompt),
average score, and how calls were spread over the models. A router traced over cost weights
(or thresholds) gives a set of points; what it can deliver at a cost ``c`` is the upper-left
convex hull of those points (mixing two operating points at random reaches every point of the
chord between them), made non-decreasing (spending more never has to buy less).

AIQ (RouterBench, Hu et al. 2024) is that hull's average height over a cost range::

    AIQ = 1 / (c_max - c_min) * integral_{c_min}^{c_max} R(c) dc

with ``R`` the non-decreasing hull. Conventions used here, the same for every router so
numbers are comparable:

- the range is ``[cost of the cheapest single model, cost of the dearest single model]`` on
  the evaluated rows (``single_model_range``);
- to the right of its last point the curve stays at its best score;
- to the *left* of its first point the curve is 0: a router that cannot operate that cheaply
  gets no credit there (so a sweep should include a cost weight large enough to reach the
  cheap end);
- a degenerate range (``c_min == c_max``) gives the curve's value at ``c_min``.

The no-routing AIQ is the AIQ of the single models' points: random mixes of two models lie
on the chords between them, so that hull covers them too.

PGR (RouteLLM, Ong et al. 2024) is for two-model tables: ``(q - q_weak) / (q_strong -
q_weak)`` as a function of the share of calls to the strong model. APGR is the area under it
over shares 0..1 (trapezoid over the sweep, with the end points "all weak" = (0, 0) and "all
strong" = (1, 1) that every threshold router reaches); a random router's PGR is its share, so
its APGR is 0.5. CPT(x) is the smallest share of strong calls that reaches PGR >= x. A
router that calls the strong model more than once per prompt on average (a multi-call
router that asks it twice) is placed at share 1, where always-strong is and the axis ends;
the bootstrap's resamples are clipped the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Scores and costs are averages of floats: compare with a little slack.
_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class CurvePoint:
    cost: float  # average USD per prompt
    score: float  # average score in [0, 1]
    # Share of prompts whose final answer came from each model.
    shares: Mapping[str, float] = field(default_factory=dict)
    # Calls per prompt to each model (a cascade calls several; can exceed the share).
    calls: Mapping[str, float] = field(default_factory=dict)
    # The cost weight / threshold / configuration index that produced the point.
    param: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "cost_usd": self.cost,
            "score": self.score,
            "shares": dict(self.shares),
            "calls": dict(self.calls),
        }


def frontier(points: Iterable[CurvePoint]) -> list[CurvePoint]:
    """The upper-left convex hull: from the cheapest point (the best one at that cost) up
    the upper hull to the first point with the highest score. Costs strictly increase and
    scores strictly increase along it, with decreasing slopes."""
    pts = sorted(points, key=lambda p: (p.cost, -p.score))
    # At equal cost only the best score can be on the hull. Equal means equal up to float
    # rounding (0.1 + 0.2 against 0.3): the point sorted second there may be the better one.
    unique: list[CurvePoint] = []
    for p in pts:
        if not unique or p.cost > unique[-1].cost + _EPS:
            unique.append(p)
        elif p.score > unique[-1].score:
            unique[-1] = p
    hull: list[CurvePoint] = []
    for p in unique:
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            cross = (a.cost - o.cost) * (p.score - o.score) - (a.score - o.score) * (
                p.cost - o.cost
            )
            if cross >= -_EPS:  # a is on or below the chord o -> p
                hull.pop()
            else:
                break
        hull.append(p)
    if not hull:
        return []
    best = max(range(len(hull)), key=lambda i: (hull[i].score, -i))
    return hull[: best + 1]


def curve_value(hull: Sequence[CurvePoint], cost: float) -> float:
    """The hull's score at ``cost`` (0 left of its first point, flat right of its last)."""
    if not hull or cost < hull[0].cost - _EPS:
        return 0.0
    xs = np.array([p.cost for p in hull])
    ys = np.array([p.score for p in hull])
    return float(np.interp(cost, xs, ys))


def aiq(points: Iterable[CurvePoint], c_min: float, c_max: float) -> float:
    """Average height of the non-decreasing hull of ``points`` over ``[c_min, c_max]``."""
    if c_max < c_min:
        raise ValueError(f"empty cost range [{c_min}, {c_max}]")
    hull = frontier(points)
    if not hull:
        return 0.0
    if c_max - c_min <= _EPS:
        return curve_value(hull, c_min)
    lo = max(c_min, hull[0].cost)
    if lo >= c_max:
        return 0.0
    inner = [p.cost for p in hull if lo < p.cost < c_max]
    xs = np.array([lo, *inner, c_max])
    ys = np.interp(xs, [p.cost for p in hull], [p.score for p in hull])
    area = float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))
    return area / (c_max - c_min)


def single_model_range(single_points: Iterable[CurvePoint]) -> tuple[float, float]:
    """The AIQ cost range: cheapest to dearest single model."""
    costs = [p.cost for p in single_points]
    if not costs:
        raise ValueError("no single-model points")
    return min(costs), max(costs)


def best_single(single_points: Mapping[str, CurvePoint]) -> tuple[str, CurvePoint]:
    """The most accurate single model (the cheaper one on a tie)."""
    if not single_points:
        raise ValueError("no single-model points")
    return max(single_points.items(), key=lambda kv: (kv[1].score, -kv[1].cost, kv[0]))


def cost_to_reach(points: Iterable[CurvePoint], target_score: float) -> float | None:
    """The lowest cost at which the hull reaches ``target_score`` (interpolated along the
    hull), or None if it never does."""
    hull = frontier(points)
    for i, p in enumerate(hull):
        if p.score >= target_score - 1e-9:
            if i == 0:
                return p.cost
            q = hull[i - 1]
            t = (target_score - q.score) / (p.score - q.score)
            return q.cost + t * (p.cost - q.cost)
    return None


def has_gap(q_weak: float, q_strong: float) -> bool:
    """Whether PGR is defined: the strong model scores above the weak one by more than
    rounding. Means of fractional scores summed in another order can differ in the last
    bit, so every caller asks this rather than comparing the two exactly."""
    return q_strong - q_weak > _EPS


def pgr(score: float, q_weak: float, q_strong: float) -> float:
    """Performance gap recovered: 0 at the weak model's score, 1 at the strong one's."""
    if not has_gap(q_weak, q_strong):
        raise ValueError(
            f"PGR needs the strong model to score above the weak one ({q_strong} <= {q_weak})"
        )
    return (score - q_weak) / (q_strong - q_weak)


def _pgr_curve(
    shares_and_scores: Iterable[tuple[float, float]], q_weak: float, q_strong: float
) -> tuple[np.ndarray, np.ndarray]:
    """PGR against the share of strong calls, sorted, end points added, ties averaged."""
    by_share: dict[float, list[float]] = {0.0: [0.0], 1.0: [1.0]}
    for share, score in shares_and_scores:
        if not share >= -_EPS:  # NaN too
            raise ValueError(f"share of strong calls {share} is negative")
        key = round(min(1.0, max(0.0, share)), 12)
        by_share.setdefault(key, []).append(pgr(score, q_weak, q_strong))
    xs = np.array(sorted(by_share))
    ys = np.array([float(np.mean(by_share[x])) for x in xs])
    return xs, ys


def apgr(shares_and_scores: Iterable[tuple[float, float]], q_weak: float, q_strong: float) -> float:
    """Area under PGR vs. the share of calls to the strong model (0..1), by trapezoid."""
    xs, ys = _pgr_curve(shares_and_scores, q_weak, q_strong)
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2.0))


def cpt(
    shares_and_scores: Iterable[tuple[float, float]],
    q_weak: float,
    q_strong: float,
    target_pgr: float,
) -> float | None:
    """Call-performance threshold: the smallest share of strong calls (0..1) at which the
    (linearly interpolated) PGR curve reaches ``target_pgr``; None if it never does."""
    xs, ys = _pgr_curve(shares_and_scores, q_weak, q_strong)
    for i in range(len(xs)):
        if ys[i] >= target_pgr - 1e-9:
            if i == 0:
                return float(xs[0])
            t = (target_pgr - ys[i - 1]) / (ys[i] - ys[i - 1])
            return float(xs[i - 1] + t * (xs[i] - xs[i - 1]))
    return None
