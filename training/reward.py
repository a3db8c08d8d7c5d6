"""The reward, as training code has always imported it: the definition is
``router.reward`` (the served kNN policy ranks models by it too)."""

from router.reward import (
    RewardConfig,
    RewardForm,
    RewardTerms,
    compute_reward,
    expected_reward,
    normalized_cost,
)

__all__ = [
    "RewardConfig",
    "RewardForm",
    "RewardTerms",
    "compute_reward",
    "expected_reward",
    "normalized_cost",
]
