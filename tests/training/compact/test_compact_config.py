"""TrainConfig's λ range: either end may be given alone, and a bad one is refused in words
before any arithmetic runs on it."""

from __future__ import annotations

import numpy as np
import pytest

from training.compact.config import TrainConfig
from training.compact.data import TableArrays, auto_lambda_range, resolve_lambdas


def _arrays() -> TableArrays:
    # Two models, mean costs $0.001 and $0.01 per prompt.
    cost = np.array([[0.001, 0.01], [0.001, 0.01]])
    return TableArrays(
        ids=["a", "b"],
        conversations=[[], []],
        models=["cheap", "dear"],
        score=np.array([[0.0, 1.0], [1.0, 1.0]]),
        cost=cost,
        logged_action=np.array([-1, -1]),
        logged_propensity=np.ones(2),
    )


@pytest.mark.parametrize("bad", [{"lambda_max": -1.0}, {"lambda_max": 0.0}, {"lambda_min": 0.0}])
def test_a_non_positive_lambda_bound_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        TrainConfig(**bad)  # type: ignore[arg-type]


def test_either_bound_alone_resolves_to_a_range_around_it() -> None:
    arrays = _arrays()
    lo, hi = auto_lambda_range(arrays.cost, TrainConfig().reward_config())
    assert lo < hi
    # λ_max below the automatic λ_min: the range is put under it, not refused.
    small = resolve_lambdas(TrainConfig(lambda_max=lo / 10), arrays)
    assert small.lambda_range == pytest.approx((lo / 1000, lo / 10))
    # λ_max above it keeps the automatic λ_min.
    wide = resolve_lambdas(TrainConfig(lambda_max=hi * 10), arrays)
    assert wide.lambda_range == pytest.approx((lo, hi * 10))
    # λ_min alone: two decades above it at least.
    high = resolve_lambdas(TrainConfig(lambda_min=hi * 10), arrays)
    assert high.lambda_range == pytest.approx((hi * 10, hi * 1000))
    # Every validation λ lies in the range, after λ = 0.
    for cfg in (small, wide, high):
        assert cfg.val_lambdas is not None and cfg.val_lambdas[0] == 0.0
        assert all(cfg.lambda_range[0] <= lam <= cfg.lambda_range[1] for lam in cfg.val_lambdas[1:])
