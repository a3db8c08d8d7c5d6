"""The reward's configuration: settings that would make every reward meaningless are
refused where the reward is defined, so every entry point (train, eval, verl-data) refuses
them."""

from __future__ import annotations

import math

import pytest

from router.reward import RewardConfig, compute_reward


@pytest.mark.parametrize("field", ["K", "c_max", "cost_scale"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_setting_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"{field} must be a finite number"):
        RewardConfig(**{field: value})  # type: ignore[arg-type]


def test_finite_settings_give_finite_rewards() -> None:
    terms = compute_reward(1.0, 0.002, 1.0, RewardConfig(K=2.0, c_max=0.5, cost_scale=0.01))
    assert terms.reward == pytest.approx(2.0 - 0.2)
