"""Training configuration of the compact policy (no torch here: the CLI builds it)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from training.reward import RewardConfig, RewardForm

# The reward's defaults are the reward module's, as are the CLI flags' (add_reward_arguments).
_REWARD = RewardConfig()


@dataclass(slots=True)
class TrainConfig:
    """Every knob of a training run; stored in the run's config.json and the checkpoint (a
    kNN or cascade build stores the ones it used and names the rest, ``config_not_used``)."""

    steps: int = 1500
    batch_size: int = 64
    group_size: int = 8
    ppo_epochs: int = 2
    lr: float = 1e-3
    weight_decay: float = 1e-3
    grad_clip: float = 1.0
    clip_eps: float = 0.2
    entropy_coef: float = 0.05
    # Share of uniform exploration mixed into the distribution GRPO groups are drawn from.
    explore_epsilon: float = 0.1
    # Advantages are (r - mean) / max(std, floor). Plain GRPO (floor 0) blows the tiny reward
    # gaps of a group where every model answered correctly (gaps of cost penalty only) up to
    # unit scale, which teaches "always the cheapest" even at small λ; the floor keeps such
    # groups at their true, small weight.
    advantage_std_floor: float = 0.1
    hidden: tuple[int, ...] = (128, 128)
    # Dropout on the hidden layers while training (inference is deterministic).
    dropout: float = 0.1
    activation: Literal["gelu_tanh", "relu", "silu"] = "gelu_tanh"
    # The trained range of cost weights; None = derived from the table's costs (see
    # training.compact.data.auto_lambda_range), so λ spans the trade-offs that exist.
    lambda_min: float | None = None
    lambda_max: float | None = None
    lambda_zero_prob: float = 0.1
    reward_form: RewardForm = _REWARD.form
    reward_K: float = _REWARD.K
    reward_c_max: float = _REWARD.c_max
    cost_scale: float = _REWARD.cost_scale
    # Normalize cost by this model's cost on the same prompt instead of cost_scale.
    reference_model: str | None = None
    # Cost weights validated (and reported) at; None = 0 and each power of ten in the range.
    val_lambdas: tuple[float, ...] | None = None
    eval_every: int = 100
    checkpoint_every: int = 500
    seed: int = 0
    split_seed: int = 0
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)
    offpolicy: bool = False
    estimator: Literal["ips", "snips", "dr"] = "snips"
    ips_clip: float = 10.0
    # Off-policy steps score each batch at this many λ (stratified over the range).
    offpolicy_lambdas: int = 4
    # The off-policy estimates are scaled to unit reward spread, so their entropy bonus
    # lives on another scale than GRPO's; it must keep the policy soft long enough to learn
    # how the best action depends on λ (importance weights of abandoned actions vanish).
    offpolicy_entropy_coef: float = 0.1
    reward_model_steps: int = 300
    report_test: bool = False
    threads: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        # Every float knob (and tuple of them) must be finite: NaN passes the range checks
        # below, since every comparison with it is false, and inf overflows the λ grid or
        # turns the weights into NaN; either way the run would go on producing nonsense.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            items = value if isinstance(value, tuple) else (value,)
            if any(isinstance(v, float) and not math.isfinite(v) for v in items):
                raise ValueError(f"{f.name} must be finite, got {value}")
        if self.steps < 1 or self.batch_size < 1 or self.ppo_epochs < 1:
            raise ValueError("steps, batch_size and ppo_epochs must be positive")
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2 (advantages are relative to the group)")
        if any(lam is not None and not lam > 0 for lam in (self.lambda_min, self.lambda_max)):
            raise ValueError("lambda_min and lambda_max must be positive")
        if (
            self.lambda_min is not None
            and self.lambda_max is not None
            and self.lambda_min >= self.lambda_max
        ):
            raise ValueError("need 0 < lambda_min < lambda_max")
        # One check a field: the message names the value that is wrong (a bad --dropout was
        # answered with a line that began with --lambda-zero-prob).
        if not 0.0 <= self.lambda_zero_prob <= 1.0:
            raise ValueError(f"lambda_zero_prob must be in [0, 1], got {self.lambda_zero_prob}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.val_lambdas is not None and (
            not self.val_lambdas or any(lam < 0 for lam in self.val_lambdas)
        ):
            raise ValueError("val_lambdas must be non-empty and non-negative")
        if self.ips_clip <= 0:
            raise ValueError("ips_clip must be positive")
        if self.eval_every < 1:
            raise ValueError("eval_every must be positive")
        if self.checkpoint_every < 0:
            raise ValueError("checkpoint_every must be 0 (never) or positive")
        if self.reward_form not in ("gated", "additive"):
            raise ValueError(f"unknown reward form {self.reward_form!r}")
        self.reward_config()  # K, c_max and the cost scale, checked where the reward is defined
        if not self.lr > 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if not self.clip_eps > 0:
            raise ValueError(f"clip_eps must be positive, got {self.clip_eps}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be non-negative, got {self.weight_decay}")
        if self.entropy_coef < 0 or self.offpolicy_entropy_coef < 0:
            raise ValueError("entropy bonuses must be non-negative")
        if not 0.0 <= self.explore_epsilon <= 1.0:
            raise ValueError(f"explore_epsilon must be in [0, 1], got {self.explore_epsilon}")
        if self.advantage_std_floor < 0:
            raise ValueError(
                f"advantage_std_floor must be non-negative, got {self.advantage_std_floor}"
            )
        if any(h < 1 for h in self.hidden):  # () is a linear policy
            raise ValueError(f"hidden widths must be positive, got {list(self.hidden)}")

    @property
    def lambda_range(self) -> tuple[float, float]:
        """(λ_min, λ_max); only valid once resolved (``training.compact.data.resolve_lambdas``)."""
        if self.lambda_min is None or self.lambda_max is None:
            raise ValueError("the λ range is not resolved yet")
        return self.lambda_min, self.lambda_max

    def reward_config(self) -> RewardConfig:
        return RewardConfig(
            form=self.reward_form,
            K=self.reward_K,
            c_max=self.reward_c_max,
            cost_scale=self.cost_scale,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
