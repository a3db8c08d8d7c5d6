"""What every checkpoint-served policy shares: binding a checkpoint to the configured pool
and to its feature extractor, the allowed-model mask, and a small thread pool for the CPU
work of a decision.

Two policies build on it: ``CompactPolicy`` (one model per request, from a network or
stored neighbours) and ``PlannedPolicy`` (a multi-call plan per request).
:func:`policy_for_checkpoint` picks the one a checkpoint's kind needs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import numpy as np

from router.checkpoint import CheckpointError, CompactCheckpoint, load_checkpoint
from router.checkpoint_pool import CheckpointPoolMismatch, PoolCheck, check_pool
from router.features import FeatureConfig, FeatureExtractor
from router.policies.baselines import CheapestPolicy
from router.policy import LoopState, Policy, RouteContext, Step
from router.pool import ModelPool


class CheckpointPolicy(Policy):
    """A policy served from a compact checkpoint.

    Construction reads the checkpoint and the embedding table (blocking file I/O): build it
    at startup, or with :meth:`aload` from async code.
    """

    def __init__(
        self,
        checkpoint: CompactCheckpoint | str | Path,
        pool: ModelPool,
        *,
        executor: Executor | None = None,
        extractor: FeatureExtractor | None = None,
    ) -> None:
        ckpt = (
            checkpoint if isinstance(checkpoint, CompactCheckpoint) else load_checkpoint(checkpoint)
        )
        self.checkpoint = ckpt
        self.pool_check: PoolCheck = check_pool(ckpt, pool)
        if extractor is None:
            extractor = FeatureExtractor.load(FeatureConfig.from_dict(ckpt.metadata.feature_config))
        if extractor.feature_version != ckpt.feature_version:
            raise CheckpointError(
                f"checkpoint features {ckpt.feature_version} differ from this extractor's "
                f"{extractor.feature_version} (embedding table or feature code changed): retrain"
            )
        if extractor.dim != ckpt.architecture.input_dim:
            raise CheckpointError(
                f"checkpoint expects {ckpt.architecture.input_dim} features, extractor gives {extractor.dim}"
            )
        self.extractor = extractor
        self.feature_version = ckpt.feature_version
        self.actions: list[str] = ckpt.pool
        self._configured = np.array([m in pool for m in self.actions], dtype=bool)
        # Pool models the checkpoint has no action for: never chosen by the checkpoint.
        self.untrained: list[str] = self.pool_check.untrained
        self._uninformed = CheapestPolicy()
        self._executor = executor
        self._own_executor: ThreadPoolExecutor | None = None

    @classmethod
    async def aload(cls, checkpoint: str | Path, pool: ModelPool, **kwargs: Any) -> Self:
        """Build the policy in a worker thread (for reloads from a running event loop)."""
        return await asyncio.to_thread(lambda: cls(checkpoint, pool, **kwargs))

    def mask_for(self, allowed: Sequence[str] | ModelPool | None) -> np.ndarray:
        """Actions that may be chosen: in the configured pool and in ``allowed``."""
        if allowed is None:
            return self._configured.copy()
        names = allowed.names if isinstance(allowed, ModelPool) else list(allowed)
        wanted = set(names)
        mask = np.array([m in wanted for m in self.actions], dtype=bool) & self._configured
        if not mask.any():
            raise CheckpointPoolMismatch(
                f"none of the allowed models ({', '.join(names) or 'none'}) is served by this "
                f"checkpoint (pool: {', '.join(self.actions)})"
            )
        return mask

    def untrained_in(self, allowed: ModelPool) -> list[str]:
        """The untrained pool models that ``allowed`` (a request's pool) holds."""
        return [m for m in self.untrained if m in allowed]

    def knows_none_of(self, allowed: ModelPool) -> bool:
        """True when a request allows only pool models this checkpoint has no action for."""
        return len(self.untrained_in(allowed)) == len(allowed)

    async def uninformed_step(self, ctx: RouteContext, state: LoopState) -> Step:
        """A request whose allow-list holds only models the checkpoint was not trained on:
        it cannot rank them, so the cheapest answers (as ``xrouter/cheapest`` would, failing
        over in price order), logged with propensity 1."""
        return await self._uninformed.step(ctx, state)

    def _pool_executor(self) -> Executor:
        if self._executor is not None:
            return self._executor
        if self._own_executor is None:
            # A small dedicated pool: the tokenizer releases the GIL, and keeping it apart
            # from the default executor stops file I/O elsewhere from queueing decisions.
            self._own_executor = ThreadPoolExecutor(
                max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="xrouter-compact"
            )
        return self._own_executor

    async def aclose(self) -> None:
        if self._own_executor is not None:
            self._own_executor.shutdown(wait=False, cancel_futures=True)
            self._own_executor = None


def policy_for_checkpoint(
    checkpoint: CompactCheckpoint | str | Path,
    pool: ModelPool,
    *,
    epsilon: float = 0.0,
    temperature: float = 1.0,
    sample: bool = False,
    executor: Executor | None = None,
    seed: int | None = None,
    extractor: FeatureExtractor | None = None,
) -> CheckpointPolicy:
    """The policy that serves ``checkpoint``'s kind: ``PlannedPolicy`` for ``cascade``
    checkpoints, ``CompactPolicy`` otherwise. Blocking file I/O, like the constructors."""
    from router.policies.compact import CompactPolicy
    from router.policies.planned import PlannedPolicy

    ckpt = checkpoint if isinstance(checkpoint, CompactCheckpoint) else load_checkpoint(checkpoint)
    if ckpt.architecture.kind == "cascade":
        return PlannedPolicy(
            ckpt, pool, exploring=epsilon > 0 or sample, executor=executor, extractor=extractor
        )
    return CompactPolicy(
        ckpt,
        pool,
        epsilon=epsilon,
        temperature=temperature,
        sample=sample,
        executor=executor,
        seed=seed,
        extractor=extractor,
    )
