"""The kNN checkpoint kind: route by what the most similar training prompts say.

A ``knn`` checkpoint stores the training prompts' static embeddings (the first
``similarity_dims`` columns of the feature vector) and every model's score and normalized
cost on each of them. For a request it finds the ``neighbours`` most similar training
prompts (cosine), averages each model's score and normalized cost over them, and ranks the
models by the expected reward of ``router.reward`` at the request's λ: the same decision
as the kNN baseline of the evaluation, served by the compact policy's machinery (masking,
exploration, logged propensities, fallbacks, hot reload). On small routing tables this
plug-in estimate generalizes better than a policy network (README, Results).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from router.checkpoint import Architecture, CompactCheckpoint
from router.reward import RewardConfig, expected_reward

# Logits are expected rewards divided by this: a reward gap of 0.02 is one nat, so the
# policy's softmax (sampling mode, logged distributions) prefers clearly better models and
# stays undecided between near ties.
REWARD_TEMPERATURE = 0.02
# Per unit of normalized cost: orders equal rewards by cost, far below any real reward gap.
_TIE_BREAK = 1e-9


def reward_config_of(reward: Mapping[str, Any]) -> RewardConfig:
    """The reward a checkpoint was built for, from its metadata."""
    default = RewardConfig()
    return RewardConfig(
        form="additive" if reward.get("form") == "additive" else "gated",
        K=float(reward.get("K", default.K)),
        c_max=float(reward.get("c_max", default.c_max)),
        cost_scale=float(reward.get("cost_scale", default.cost_scale)),
    )


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32)


class NeighbourIndex:
    """The stored training prompts of a ``knn`` or ``cascade`` checkpoint: averages per-prompt
    tables over each request's ``k`` most similar stored prompts (cosine over the first
    ``similarity_dims`` feature columns)."""

    def __init__(self, architecture: Architecture, examples: np.ndarray) -> None:
        self.architecture = architecture
        self._examples = _unit_rows(np.asarray(examples, dtype=np.float64))
        self._k = architecture.neighbours

    def means(self, features: np.ndarray, *tables: np.ndarray) -> list[np.ndarray]:
        """Each ``(n_examples, m)`` table averaged over each feature row's neighbours:
        ``(n, m)`` arrays, one per table."""
        x = np.atleast_2d(np.asarray(features, dtype=np.float64))
        if x.shape[1] != self.architecture.input_dim:
            raise ValueError(
                f"features have {x.shape[1]} columns, the head expects {self.architecture.input_dim}"
            )
        sims = _unit_rows(x[:, : self.architecture.similarity_dims]) @ self._examples.T
        nearest = np.argpartition(-sims, self._k - 1, axis=1)[:, : self._k]
        return [t[nearest].mean(axis=1) for t in tables]


def ranked_rewards(
    score: np.ndarray,
    cost: np.ndarray,
    cost_weights: float | Sequence[float] | np.ndarray,
    reward: RewardConfig,
) -> np.ndarray:
    """Expected rewards of ``(n, m)`` estimated scores and normalized costs at one λ or one
    per row, with equal rewards ordered by cost."""
    lam = np.asarray(cost_weights, dtype=np.float64)
    if np.any(lam < 0):
        raise ValueError("cost weights must be non-negative")
    if lam.ndim == 1:
        if lam.shape[0] not in (1, score.shape[0]):
            raise ValueError("need one cost weight, or one per row of features")
        lam = lam[:, None]
    # Equal expected rewards (the gated form's capped penalty makes every option earn 0 at
    # a large λ) go to the cheaper option: a router should never pay for nothing.
    out: np.ndarray = expected_reward(score, cost, lam, reward) - _TIE_BREAK * cost
    return out


class KNNHead:
    """Immutable and thread-safe, like ``CompactHead``, with the same ``logits``."""

    def __init__(
        self, architecture: Architecture, weights: dict[str, np.ndarray], reward: RewardConfig
    ) -> None:
        if architecture.kind != "knn":
            raise ValueError(f"a KNNHead needs a knn architecture, got {architecture.kind!r}")
        self.architecture = architecture
        self.reward = reward
        self._index = NeighbourIndex(architecture, weights["examples"])
        self._scores = np.asarray(weights["scores"], dtype=np.float64)
        self._costs = np.asarray(weights["normalized_costs"], dtype=np.float64)

    @classmethod
    def from_checkpoint(cls, ckpt: CompactCheckpoint) -> KNNHead:
        return cls(ckpt.architecture, ckpt.weights, reward_config_of(ckpt.metadata.reward))

    def estimates(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each model's mean score and mean normalized cost over each row's neighbours:
        two (n, n_actions) arrays."""
        score, cost = self._index.means(features, self._scores, self._costs)
        return score, cost

    def logits(
        self, features: np.ndarray, cost_weights: float | Sequence[float] | np.ndarray
    ) -> np.ndarray:
        """``(n, n_actions)`` expected rewards / ``REWARD_TEMPERATURE`` for one λ or one per
        row."""
        score, cost = self.estimates(features)
        return ranked_rewards(score, cost, cost_weights, self.reward) / REWARD_TEMPERATURE
