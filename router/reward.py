"""The one reward definition, used in training, validation, evaluation and by served
policies that rank models by expected reward (the kNN checkpoint kind). It lives with the
router so serving needs nothing from ``training``; ``training.reward`` re-exports it.

Two forms, both on a trajectory's quality ``s`` in [0, 1] and cost ``C`` in USD:

- ``gated`` (the xRouter paper's): ``r = s · (K − min(λ·C̃, c_max))``; a wrong answer earns
  nothing however cheap, a right one earns up to ``K`` minus a capped cost penalty;
- ``additive``: ``r = s − λ·C̃``.

``C̃`` is the normalized cost: ``C / reference_cost`` (a reference model's cost on the same
prompt) when a reference is given, else ``C / cost_scale`` (a fixed USD scale), so that λ
keeps its meaning when prices change. Every term is returned separately for logging.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from pricing.money import MAX_USD

RewardForm = Literal["gated", "additive"]


# The fixed cost scale's range, USD per unit of normalized cost. Within it, every cost an
# outcome table or the ledger holds (0 to MAX_USD) normalizes to a finite C̃ that is not
# subnormal either (the λ ranges and grids divide by it), with room for λ·C̃: past it,
# 1e-310 made C̃ infinite and 1e308 made it subnormal, and the λ grid overflowed.
MIN_COST_SCALE = 1e-12
MAX_COST_SCALE = MAX_USD


def cost_scale_problem(value: float) -> str | None:
    """Why ``value`` cannot be a cost scale (NaN included), or None."""
    if MIN_COST_SCALE <= value <= MAX_COST_SCALE:
        return None
    return (
        f"must be between {MIN_COST_SCALE:g} and {MAX_COST_SCALE:g} (USD per unit of "
        f"normalized cost), got {value:g}"
    )


@dataclass(frozen=True, slots=True)
class RewardConfig:
    form: RewardForm = "gated"
    K: float = 1.0
    c_max: float = 1.0
    # USD that counts as one unit of normalized cost when no reference cost is given.
    cost_scale: float = 0.001

    def __post_init__(self) -> None:
        # NaN passes every comparison below (and inf overflows): either would make every
        # reward NaN or infinite, and training or evaluation run on without complaint.
        for name in ("K", "c_max", "cost_scale"):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if (problem := cost_scale_problem(self.cost_scale)) is not None:
            raise ValueError(f"cost_scale {problem}")
        if self.c_max < 0 or self.K < 0:
            raise ValueError("K and c_max must be non-negative")
        if self.form == "gated" and self.K == 0:
            # s·(0 − penalty) ≤ 0: a right answer would never earn more than a wrong one
            # (0), and a policy trained on it learns to be cheap, not right.
            raise ValueError(
                "K must be positive for the gated reward: with K = 0 a right answer earns "
                "at most what a wrong one does (0)"
            )


@dataclass(frozen=True, slots=True)
class RewardTerms:
    reward: float
    score: float
    cost_usd: float
    normalized_cost: float
    penalty: float
    cost_weight: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def normalized_cost(
    cost_usd: float, config: RewardConfig, reference_cost_usd: float | None = None
) -> float:
    if reference_cost_usd is None:
        return cost_usd / config.cost_scale
    # A free reference makes C / reference undefined; falling back to the fixed scale for
    # that prompt alone would score it in other units than the rest, silently.
    if not (math.isfinite(reference_cost_usd) and reference_cost_usd > 0):
        raise ValueError(
            f"a reference cost must be a positive number of USD, got {reference_cost_usd}: "
            "cost cannot be normalized by a free reference model"
        )
    return cost_usd / reference_cost_usd


def compute_reward(
    score: float,
    cost_usd: float,
    cost_weight: float,
    config: RewardConfig | None = None,
    reference_cost_usd: float | None = None,
) -> RewardTerms:
    """Reward of one trajectory, with every term."""
    cfg = config or RewardConfig()
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score must be in [0, 1], got {score}")
    if cost_usd < 0 or cost_weight < 0:
        raise ValueError("cost and cost_weight must be non-negative")
    c_tilde = normalized_cost(cost_usd, cfg, reference_cost_usd)
    penalty = _penalty(cost_weight * c_tilde, cfg)
    reward = _combine(score, penalty, cfg)
    return RewardTerms(float(reward), score, cost_usd, c_tilde, float(penalty), cost_weight)


def expected_reward(
    score: np.ndarray, c_tilde: np.ndarray, cost_weight: float | np.ndarray, config: RewardConfig
) -> np.ndarray:
    """The same reward on arrays of (expected) scores and normalized costs: what a policy
    that estimates both per model ranks the models by. ``cost_weight`` broadcasts (one λ, or
    one per row as a column)."""
    penalty = _penalty(np.asarray(cost_weight) * c_tilde, config)
    return np.asarray(_combine(score, penalty, config))


# The two forms, written once for floats and arrays alike.


def _penalty(weighted_cost: Any, cfg: RewardConfig) -> Any:
    return np.minimum(weighted_cost, cfg.c_max) if cfg.form == "gated" else weighted_cost


def _combine(score: Any, penalty: Any, cfg: RewardConfig) -> Any:
    return score * (cfg.K - penalty) if cfg.form == "gated" else score - penalty
