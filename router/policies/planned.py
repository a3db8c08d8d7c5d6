"""Serving multi-call plans: the ``cascade`` checkpoint kind.

A ``cascade`` checkpoint stores the training prompts' static embeddings and, for each of its
plans (``router.plans.CascadePlan``: cheap models first, escalate until answers agree), the
plan's score and normalized cost on every training prompt, measured on the recorded
responses. For a request, :class:`PlanHead` averages each plan's score and cost over the
``neighbours`` most similar training prompts and ranks the plans by the expected reward of
``router.reward`` at the request's λ; :class:`PlannedPolicy` then runs the best plan whose
models are all in the allowed pool, round by round, through the orchestration loop. So
"call cheap first" is used where cheap answers that agree tend to be right, and the strong
model is called directly where they do not: the offline evaluation's best router
(``training.evaluation.cascade.CascadeFamilyRouter`` with ``local_k``), served.

Plans are deterministic, so every call is logged with propensity 1.0; exploration settings
(ε, sampling) apply to single-call checkpoints only.

The rounds themselves are run by ``router.plans.start_plan`` and ``continue_plan``, which
the ``cascade`` baseline policy uses too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from router.checkpoint import Architecture, CompactCheckpoint
from router.features import FeatureExtractor
from router.plans import CascadePlan, continue_plan, start_plan
from router.policies.checkpointed import CheckpointPolicy
from router.policies.knn import NeighbourIndex, ranked_rewards, reward_config_of
from router.policy import LoopState, RouteContext, Step
from router.pool import ModelPool
from router.reward import RewardConfig

logger = logging.getLogger(__name__)

NOTE_KEY = "planned"


class PlanHead:
    """A ``cascade`` checkpoint's plans and neighbours. Immutable and thread-safe."""

    def __init__(
        self, architecture: Architecture, weights: dict[str, np.ndarray], reward: RewardConfig
    ) -> None:
        if architecture.kind != "cascade":
            raise ValueError(f"a PlanHead needs a cascade architecture, got {architecture.kind!r}")
        self.architecture = architecture
        self.reward = reward
        self.plans = tuple(CascadePlan(p.order, p.k, p.quorum) for p in architecture.plans)
        self._index = NeighbourIndex(architecture, weights["examples"])
        self._scores = np.asarray(weights["plan_scores"], dtype=np.float64)
        self._costs = np.asarray(weights["plan_normalized_costs"], dtype=np.float64)

    @classmethod
    def from_checkpoint(cls, ckpt: CompactCheckpoint) -> PlanHead:
        return cls(ckpt.architecture, ckpt.weights, reward_config_of(ckpt.metadata.reward))

    def estimates(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each plan's mean score and mean normalized cost over each row's neighbours: two
        ``(n, n_plans)`` arrays."""
        score, cost = self._index.means(features, self._scores, self._costs)
        return score, cost

    def rewards(
        self, features: np.ndarray, cost_weights: float | Sequence[float] | np.ndarray
    ) -> np.ndarray:
        """``(n, n_plans)`` expected rewards (equal ones ordered by cost)."""
        score, cost = self.estimates(features)
        return ranked_rewards(score, cost, cost_weights, self.reward)


class PlannedPolicy(CheckpointPolicy):
    """Runs, per request, the plan of a ``cascade`` checkpoint with the best expected reward
    among those whose models are all allowed."""

    name = "compact"  # served under the compact policy's name, like every checkpoint kind

    def __init__(
        self,
        checkpoint: CompactCheckpoint | str | Path,
        pool: ModelPool,
        *,
        exploring: bool = False,
        executor: Executor | None = None,
        extractor: FeatureExtractor | None = None,
    ) -> None:
        super().__init__(checkpoint, pool, executor=executor, extractor=extractor)
        self._head = PlanHead.from_checkpoint(self.checkpoint)
        self.plans = self._head.plans
        if exploring:
            logger.warning(
                "cascade checkpoint %s runs its plans greedily: router.epsilon and "
                "router.sample apply to single-call checkpoints only",
                self.checkpoint.version,
            )

    def plan_mask(self, allowed: Sequence[str] | ModelPool | None) -> np.ndarray:
        """Plans whose every model is allowed (and configured)."""
        mask = self.mask_for(allowed)
        ok = {m for m, keep in zip(self.actions, mask, strict=True) if keep}
        usable = np.array([set(p.order) <= ok for p in self.plans], dtype=bool)
        if not usable.any():
            # Unreachable for checkpoints built by ``xrouter train --cascade``, which hold a
            # one-model plan for every pool model.
            raise ValueError("no plan of this checkpoint uses only the allowed models")
        return usable

    def plan_rewards(
        self,
        messages: Sequence[dict[str, Any]],
        cost_weight: float,
        tools: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """Every plan's expected reward for one request (CPU work: runs in a worker thread)."""
        x = self.extractor.extract(messages, tools=tools)
        rewards: np.ndarray = self._head.rewards(x, cost_weight)[0]
        return rewards

    def choose(self, rewards: np.ndarray, usable: np.ndarray) -> int:
        return int(np.argmax(np.where(usable, rewards, -np.inf)))

    def route_batch(
        self,
        features: np.ndarray,
        cost_weights: float | Sequence[float] | np.ndarray,
        allowed: Sequence[str] | ModelPool | None = None,
    ) -> list[CascadePlan]:
        """The plan each row of precomputed features would run (offline analysis)."""
        usable = self.plan_mask(allowed)
        rewards = self._head.rewards(features, cost_weights)
        return [self.plans[i] for i in np.where(usable, rewards, -np.inf).argmax(axis=1)]

    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        state.decision.feature_version = self.feature_version
        state.decision.checkpoint = self.checkpoint.version
        if self.knows_none_of(ctx.pool):
            return await self.uninformed_step(ctx, state)
        note = state.notes.get(NOTE_KEY)
        if note is not None:
            return continue_plan(self.plans[note["index"]], ctx, state)
        usable = self.plan_mask(ctx.pool)
        loop = asyncio.get_running_loop()
        rewards = await loop.run_in_executor(
            self._pool_executor(), self.plan_rewards, ctx.messages, ctx.cost_weight, ctx.tools
        )
        idx = self.choose(rewards, usable)
        ranked = sorted(np.flatnonzero(usable), key=lambda i: -rewards[i])[:5]
        state.notes[NOTE_KEY] = {
            "index": idx,
            "plan": self.plans[idx].name,
            "expected_rewards": {self.plans[i].name: round(float(rewards[i]), 6) for i in ranked},
        }
        return start_plan(self.plans[idx], state)
