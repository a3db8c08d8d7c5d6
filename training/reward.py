"""The reward, as training code has always imported it: the definition is
``router.reward`` (the served kNN policy ranks models by it too); and the command-line
flags that set it, the same for ``xrouter train`` and ``xrouter verl-data``."""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Mapping

from router.reward import (
    MAX_COST_SCALE,
    MIN_COST_SCALE,
    RewardConfig,
    RewardForm,
    RewardTerms,
    compute_reward,
    cost_scale_problem,
    expected_reward,
    normalized_cost,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_COST_SCALE",
    "MIN_COST_SCALE",
    "RewardConfig",
    "RewardForm",
    "RewardTerms",
    "add_reward_arguments",
    "check_reference_costs",
    "compute_reward",
    "cost_scale_arg",
    "expected_reward",
    "normalized_cost",
    "reward_config_from_args",
    "warn_if_wrong_beats_right",
]


def cost_scale_arg(text: str) -> float:
    """argparse ``type`` of ``--cost-scale`` (``xrouter train``, ``verl-data``, ``eval``):
    refused as a bad argument, before any table is read, where the reward would overflow
    (1e-310 made every normalized cost infinite, 1e308 a traceback in train's λ range)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    problem = cost_scale_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def add_reward_arguments(parser: argparse.ArgumentParser) -> None:
    """``--reward --K --c-max --cost-scale --reference-model``, defaulting to RewardConfig's."""
    d = RewardConfig()
    parser.add_argument(
        "--reward",
        choices=["gated", "additive"],
        default=d.form,
        help=f"s*(K - min(lambda*C, c_max)) or s - lambda*C, C the normalized cost ({d.form})",
    )
    parser.add_argument(
        "--K",
        type=float,
        default=d.K,
        help=f"K of the gated reward: what a right answer earns before cost ({d.K:g})",
    )
    parser.add_argument(
        "--c-max",
        type=float,
        default=d.c_max,
        help=f"c_max of the gated reward: the most cost can take off ({d.c_max:g})",
    )
    parser.add_argument(
        "--cost-scale",
        type=cost_scale_arg,
        default=d.cost_scale,
        help=f"USD per unit of normalized cost, {MIN_COST_SCALE:g} to {MAX_COST_SCALE:g} "
        f"({d.cost_scale:g})",
    )
    parser.add_argument(
        "--reference-model", help="normalize cost by this model's cost on the same prompt"
    )


def reward_config_from_args(args: argparse.Namespace) -> RewardConfig:
    """The reward the flags of ``add_reward_arguments`` ask for (``--reference-model`` is
    the caller's: it changes how costs are normalized, not the reward's terms)."""
    config = RewardConfig(form=args.reward, K=args.K, c_max=args.c_max, cost_scale=args.cost_scale)
    warn_if_wrong_beats_right(config)
    return config


def warn_if_wrong_beats_right(config: RewardConfig) -> None:
    """Warn when the gated reward can pay a wrong answer more than a right one: with
    ``K < c_max``, once λ·C̃ passes K a right answer earns below 0, what a wrong one earns
    whatever it cost. Allowed (a setting may mean it), but rarely meant."""
    if config.form == "gated" and config.K < config.c_max:
        logger.warning(
            "--K %g is below --c-max %g: where the cost penalty exceeds K, a right answer "
            "earns less than a wrong one (0)",
            config.K,
            config.c_max,
        )


def check_reference_costs(model: str, costs: Mapping[str, float | None]) -> None:
    """Refuse a reference model that cannot normalize every record's cost: C̃ = C / its
    cost on the same prompt needs that cost, and a positive one. ``costs``: record id ->
    the model's cost there once priced (None or NaN where it has none)."""
    bad = [
        rid for rid, cost in costs.items() if cost is None or not (math.isfinite(cost) and cost > 0)
    ]
    if bad:
        raise ValueError(
            f"reference model {model!r} has no positive cost on {len(bad)} of {len(costs)} "
            f"records (first: {bad[0]!r}): cost is normalized by it on every prompt; pick a "
            "reference model priced on every record, or drop --reference-model to normalize "
            "by --cost-scale"
        )
