"""Vectorized expected reward for cost-aware baselines, and the default cost-weight grid.

Baselines that trade quality for cost (oracle, kNN, MF, the cascade family) choose the model
with the highest *expected reward* under ``training.reward``: with a predicted score ``p`` in
[0, 1] and a known cost, both reward forms are linear in the score, so the expected reward is
``compute_reward(p, cost, λ)``, which ``router.reward.expected_reward`` evaluates on arrays,
so λ means the same thing for baselines as for the policies trained on that reward.
"""

from __future__ import annotations

import numpy as np

from router import reward
from router.reward import RewardConfig

# Baselines rank models by the additive form by default: the gated form's capped penalty
# makes every wrong-or-expensive choice tie at 0 for large λ, which flattens the curve.
BASELINE_REWARD = RewardConfig(form="additive")


def expected_reward(
    pred_score: np.ndarray,
    cost_usd: np.ndarray,
    cost_weight: float,
    config: RewardConfig = BASELINE_REWARD,
) -> np.ndarray:
    """``compute_reward(p, c, λ, config).reward`` element-wise (no reference cost)."""
    if cost_weight < 0:
        raise ValueError("cost_weight must be non-negative")
    c_tilde = np.asarray(cost_usd, dtype=float) / config.cost_scale
    return reward.expected_reward(np.asarray(pred_score, dtype=float), c_tilde, cost_weight, config)


def choose(utility: np.ndarray, cost_usd: np.ndarray) -> np.ndarray:
    """Per row, the column with the highest utility; ties go to the cheaper model (so a
    router never pays for nothing)."""
    u = np.asarray(utility, dtype=float)
    c = np.broadcast_to(np.asarray(cost_usd, dtype=float), u.shape)
    best = u.max(axis=1, keepdims=True)
    tied = u >= best - 1e-12
    return np.where(tied, c, np.inf).argmin(axis=1)


def lambda_grid(
    model_costs_usd: np.ndarray,
    config: RewardConfig = BASELINE_REWARD,
    n: int = 41,
) -> list[float]:
    """Cost weights that sweep a cost-aware router from "best quality" to "cheapest".

    ``model_costs_usd`` are the models' average costs. A score difference is at most 1, so
    below ``1e-3 / max c̃`` cost barely matters and above ``10 / (smallest gap between two
    models' c̃)`` even the smallest saving outweighs any score; the grid is 0 plus ``n - 1``
    geometric steps between those.
    """
    c = np.unique(np.asarray(model_costs_usd, dtype=float) / config.cost_scale)
    c = c[c > 0]
    if c.size == 0:
        return [0.0]
    gaps = np.diff(np.concatenate([[0.0], c]))
    lo = 1e-3 / float(c.max())
    hi = 10.0 / float(gaps[gaps > 0].min())
    return [0.0, *np.geomspace(lo, max(hi, lo * 10), n - 1).tolist()]
