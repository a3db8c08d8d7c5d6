"""The one reward (``router.reward``, re-exported as ``training.reward``): worked examples
of both forms computed by hand, every term reported; and settings that would make every
reward meaningless refused where the reward is defined, so every entry point (train, eval,
verl-data) refuses them."""

from __future__ import annotations

import math

import pytest

from router.reward import RewardConfig, compute_reward


@pytest.mark.parametrize("field", ["K", "c_max", "cost_scale"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_setting_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"{field} must be a finite number"):
        RewardConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1e-310, 0.0, -0.001, 1e-13, 1.1e12, 1e308])
def test_a_cost_scale_outside_its_range_is_refused(value: float) -> None:
    # 1e-310 (subnormal) made every normalized cost of a table infinite, 1e308 every one
    # subnormal; as a gateway setting, the feedback reward was then infinite too.
    with pytest.raises(ValueError, match=r"cost_scale must be between 1e-12 and 1e\+12"):
        RewardConfig(cost_scale=value)
    for bound in (1e-12, 1e12):
        c_tilde = compute_reward(1.0, 1e12, 1.0, RewardConfig(cost_scale=bound)).normalized_cost
        assert math.isfinite(c_tilde) and c_tilde > 0


def test_finite_settings_give_finite_rewards() -> None:
    terms = compute_reward(1.0, 0.002, 1.0, RewardConfig(K=2.0, c_max=0.5, cost_scale=0.01))
    assert terms.reward == pytest.approx(2.0 - 0.2)


# Worked examples, by hand. Gated: r = s·(K − min(λ·C̃, c_max)); additive: r = s − λ·C̃;
# C̃ = C / reference cost when one is given, else C / cost_scale.


@pytest.mark.parametrize(
    ("score", "cost", "lam", "reference", "config", "c_tilde", "penalty", "reward"),
    [
        # $0.002 at the default $0.001 scale is C̃ = 2; λ = 0.25 → penalty 0.5; r = 1·(1 − 0.5).
        (1.0, 0.002, 0.25, None, RewardConfig(), 2.0, 0.5, 0.5),
        # A wrong answer earns nothing, however cheap.
        (0.0, 0.000001, 0.25, None, RewardConfig(), 0.001, 0.00025, 0.0),
        # The penalty is capped: λ·C̃ = 10 > c_max = 1, so r = 1·(1 − 1) = 0, not −9.
        (1.0, 0.01, 1.0, None, RewardConfig(), 10.0, 1.0, 0.0),
        # K = 2, c_max = 0.5: a right answer keeps at least K − c_max = 1.5.
        (1.0, 0.01, 1.0, None, RewardConfig(K=2.0, c_max=0.5), 10.0, 0.5, 1.5),
        # A partial score scales the whole bracket: 0.5·(1 − 0.2) = 0.4.
        (0.5, 0.0004, 0.5, None, RewardConfig(), 0.4, 0.2, 0.4),
        # Against a reference model's cost: $0.003 where the reference paid $0.006 is C̃ = 0.5.
        (1.0, 0.003, 0.4, 0.006, RewardConfig(), 0.5, 0.2, 0.8),
        # Additive: no gate, no cap: 1 − 1·10 = −9; a wrong answer still pays its cost.
        (1.0, 0.01, 1.0, None, RewardConfig(form="additive"), 10.0, 10.0, -9.0),
        (0.0, 0.0005, 0.2, None, RewardConfig(form="additive"), 0.5, 0.1, -0.1),
        # λ = 0: cost is ignored and the reward is the score (either form).
        (0.7, 0.05, 0.0, None, RewardConfig(), 50.0, 0.0, 0.7),
        (0.7, 0.05, 0.0, None, RewardConfig(form="additive"), 50.0, 0.0, 0.7),
    ],
)
def test_worked_examples(
    score: float,
    cost: float,
    lam: float,
    reference: float | None,
    config: RewardConfig,
    c_tilde: float,
    penalty: float,
    reward: float,
) -> None:
    terms = compute_reward(score, cost, lam, config, reference)
    assert terms.normalized_cost == pytest.approx(c_tilde)
    assert terms.penalty == pytest.approx(penalty)
    assert terms.reward == pytest.approx(reward)
    # Every term is reported, as given or derived.
    assert terms.as_dict() == pytest.approx(
        {
            "reward": reward,
            "score": score,
            "cost_usd": cost,
            "normalized_cost": c_tilde,
            "penalty": penalty,
            "cost_weight": lam,
        }
    )


@pytest.mark.parametrize("reference", [0.0, -0.001, float("nan"), float("inf")])
def test_a_reference_cost_that_cannot_normalize_is_refused(reference: float) -> None:
    """A free reference (a self-hosted model) cannot normalize. It used to fall back to the
    fixed scale for that prompt alone: C̃ = 2 for it beside C̃ = 0.002 / 1e-4 = 20 for a
    prompt whose reference cost $0.0001, two units in one table and no word of it."""
    with pytest.raises(ValueError, match="free reference model"):
        compute_reward(1.0, 0.002, 0.25, RewardConfig(), reference)
    # No reference at all is the fixed scale, as documented.
    assert compute_reward(1.0, 0.002, 0.25, RewardConfig(), None).normalized_cost == 2.0


@pytest.mark.parametrize(
    ("score", "cost", "lam"),
    [(1.5, 0.0, 0.0), (-0.1, 0.0, 0.0), (1.0, -0.001, 0.0), (1.0, 0.0, -1.0)],
)
def test_out_of_range_inputs_are_refused(score: float, cost: float, lam: float) -> None:
    with pytest.raises(ValueError):
        compute_reward(score, cost, lam)


def test_the_gated_form_needs_a_positive_K() -> None:
    # s·(0 − penalty) ≤ 0: a right answer would earn at most a wrong one's 0.
    with pytest.raises(ValueError, match="K must be positive for the gated reward"):
        RewardConfig(form="gated", K=0.0)
    # The additive form has no K: any value is harmless there.
    assert compute_reward(1.0, 0.0, 0.0, RewardConfig(form="additive", K=0.0)).reward == 1.0
