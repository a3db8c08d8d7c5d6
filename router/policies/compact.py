"""The compact learned policy: features → MLP → a distribution over the pool, conditioned
on the cost weight λ, evaluated in numpy (no GPU, no torch) in well under a millisecond.

One checkpoint serves every trade-off: λ enters the network through ``encode_lambda``
(log-scaled, Fourier and saturating encodings), so raising λ moves decisions toward cheaper
models without retraining. The forward pass here is the reference; the torch trainer
(``training/compact``) implements the same function and a test checks they agree.

Behaviour and propensities (what off-policy learning needs):

- greedy (default): the argmax of the policy over the allowed models. Deterministic, so
  the logged propensity is 1.0;
- ``sample=True``: draw from ``softmax(logits / temperature)``;
- ``epsilon > 0``: with probability ε pick uniformly among the allowed models instead —
  pool models the checkpoint was not trained on included (the policy itself gives them
  probability 0), so that logged traffic covers a model added since training and the next
  checkpoint can learn it.

The decision records the chosen model with its probability under the behaviour
distribution actually used (ε mixing included) and that whole behaviour distribution, so
``distribution[action] == propensity`` always. The policy's own softmax (what greedy mode
ranks by) goes to ``state.notes["compact"]`` for diagnostics.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from router.checkpoint import (
    Architecture,
    CheckpointError,
    CompactCheckpoint,
    LambdaEncoding,
)
from router.features import FeatureExtractor
from router.policies.checkpointed import CheckpointPolicy
from router.policies.knn import KNNHead
from router.policy import Call, LoopState, RouteContext, Select, Step, ToolCall
from router.pool import ModelPool

logger = logging.getLogger(__name__)

NOTE_KEY = "compact"


def encode_lambda(
    cost_weights: float | Sequence[float] | np.ndarray, spec: LambdaEncoding
) -> np.ndarray:
    """``(n, spec.dim)`` float32 encoding of cost weights λ ≥ 0. A λ above the trained range
    is encoded as its top: the network never saw more, and its Fourier terms, extrapolated,
    oscillate — a higher λ could then buy a dearer model."""
    lam = np.asarray(cost_weights, dtype=np.float64).reshape(-1, 1)
    if lam.size and (not np.all(np.isfinite(lam)) or np.any(lam < 0)):
        raise ValueError("cost weights must be finite and non-negative")
    lam = np.minimum(lam, spec.lambda_max)
    u = np.log1p(lam / spec.lambda_scale) / spec.log_scale
    angles = u * (np.pi * np.asarray(spec.fourier_freqs, dtype=np.float64))
    sincos = np.stack([np.sin(angles), np.cos(angles)], axis=2).reshape(len(lam), -1)
    # 1 - exp(-λ/c): 0 at λ = 0, saturating at 1.
    monotone = -np.expm1(-lam / np.asarray(spec.monotone_scales, dtype=np.float64))
    return np.concatenate([u, sincos, monotone], axis=1).astype(np.float32)


_GELU_C = np.float32(0.7978845608028654)  # sqrt(2 / pi)
_GELU_A = np.float32(0.044715)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    # torch.nn.functional.gelu(x, approximate="tanh"): numpy has no erf for the exact form.
    # In place on a scratch array: half the ufunc calls of the textbook expression.
    y = x * x
    y *= x
    y *= _GELU_A
    y += x
    y *= _GELU_C
    np.tanh(y, out=y)
    y += 1.0
    y *= x
    y *= 0.5
    return y


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.float32(0.0))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu_tanh": _gelu_tanh,
    "relu": _relu,
    "silu": _silu,
}

_F32 = np.float32


def _t32(w: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(w.T, dtype=_F32)


class CompactHead:
    """The network of a checkpoint, in numpy float32. Immutable and thread-safe.

    The same function as the torch model, rearranged for one-row latency: the input
    standardization is folded into the first layer's weights, and the λ-encoding's
    contributions to the first layer and to the output layer (which depend only on λ) are
    computed once per distinct cost weight and cached.
    """

    _CACHE_SIZE = 256

    def __init__(self, architecture: Architecture, weights: dict[str, np.ndarray]) -> None:
        self.architecture = architecture
        self._act = _ACTIVATIONS[architecture.activation]
        d, e = architecture.input_dim, architecture.lambda_encoding.dim
        mean = weights["input_mean"].astype(np.float64)
        inv_std = 1.0 / weights["input_std"].astype(np.float64)
        n_hidden = len(architecture.hidden)
        # The first affine map sees [x_std, enc] (and, without hidden layers, enc again).
        first_w = weights["layers.0.weight" if n_hidden else "head.weight"].astype(np.float64)
        first_b = weights["layers.0.bias" if n_hidden else "head.bias"].astype(np.float64)
        wx = first_w[:, :d] * inv_std
        we = first_w[:, d : d + e] if n_hidden else first_w[:, d : d + e] + first_w[:, d + e :]
        self._wx = _t32(wx)
        self._first_we = _t32(we)
        self._first_b = (first_b - wx @ mean).astype(_F32)
        self._layers = [
            (_t32(weights[f"layers.{i}.weight"]), weights[f"layers.{i}.bias"].astype(_F32))
            for i in range(1, n_hidden)
        ]
        self._n_hidden = n_hidden
        if n_hidden:
            head_w = weights["head.weight"]
            last = architecture.hidden[-1]
            self._head_wh = _t32(head_w[:, :last])
            self._head_we = _t32(head_w[:, last:])
            self._head_b = weights["head.bias"].astype(_F32)
        self._cache: dict[float, tuple[np.ndarray, np.ndarray | None]] = {}

    @classmethod
    def from_checkpoint(cls, ckpt: CompactCheckpoint) -> CompactHead:
        return cls(ckpt.architecture, ckpt.weights)

    def _lambda_terms(self, enc: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        first = enc @ self._first_we + self._first_b
        head = enc @ self._head_we + self._head_b if self._n_hidden else None
        return first, head

    def _terms_for(
        self, cost_weights: float | Sequence[float] | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if isinstance(cost_weights, int | float):
            key = float(cost_weights)
            hit = self._cache.get(key)
            if hit is None:
                hit = self._lambda_terms(encode_lambda(key, self.architecture.lambda_encoding))
                if len(self._cache) >= self._CACHE_SIZE:
                    self._cache.clear()  # many distinct λ: a cheap reset beats an LRU here
                self._cache[key] = hit
            return hit
        return self._lambda_terms(encode_lambda(cost_weights, self.architecture.lambda_encoding))

    def logits(
        self, features: np.ndarray, cost_weights: float | Sequence[float] | np.ndarray
    ) -> np.ndarray:
        """``(n, n_actions)`` logits for ``(n, input_dim)`` features and one λ or n of them."""
        x = np.atleast_2d(np.asarray(features, dtype=_F32))
        if x.shape[1] != self.architecture.input_dim:
            raise ValueError(
                f"features have {x.shape[1]} columns, the head expects {self.architecture.input_dim}"
            )
        first, head = self._terms_for(cost_weights)
        if first.shape[0] not in (1, x.shape[0]):
            raise ValueError("need one cost weight, or one per row of features")
        h = x @ self._wx
        h += first
        if not self._n_hidden:
            return h
        h = self._act(h)
        for w, b in self._layers:
            h = h @ w
            h += b
            h = self._act(h)
        out: np.ndarray = h @ self._head_wh
        out += head
        return out


def head_for(ckpt: CompactCheckpoint) -> CompactHead | KNNHead:
    """The head that serves ``ckpt``: its network, or its stored neighbours."""
    if ckpt.architecture.kind == "knn":
        return KNNHead.from_checkpoint(ckpt)
    if ckpt.architecture.kind == "cascade":
        raise CheckpointError(
            "a cascade checkpoint ranks multi-call plans, not single models: serve it with "
            "router.policies.planned.PlannedPolicy (policy_for_checkpoint picks the right one)"
        )
    return CompactHead.from_checkpoint(ckpt)


def masked_softmax(logits: np.ndarray, mask: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of ``logits / temperature`` over the ``True`` entries of ``mask``
    (masked entries get probability 0), in float64."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    z = np.asarray(logits, dtype=np.float64)
    if temperature != 1.0:
        z = z / temperature
    z = np.where(mask, z, -np.inf)
    z -= z.max(axis=-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    return z


def _list_price(ctx: RouteContext, model: str) -> float:
    m = ctx.pool.get(model)
    return float(m.price.input + m.price.output) if m is not None else float("inf")


class CompactPolicy(CheckpointPolicy):
    """Routes each request to one pool model chosen by a compact checkpoint (kinds ``mlp``
    and ``knn``; ``cascade`` checkpoints are served by ``router.policies.planned``).

    Construction reads the checkpoint and the embedding table (blocking file I/O): build it
    at startup, or with :meth:`aload` from async code.
    """

    name = "compact"

    def __init__(
        self,
        checkpoint: CompactCheckpoint | str | Path,
        pool: ModelPool,
        *,
        epsilon: float = 0.0,
        temperature: float = 1.0,
        sample: bool = False,
        executor: Executor | None = None,
        seed: int | None = None,
        extractor: FeatureExtractor | None = None,
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError("epsilon must be in [0, 1]")
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        super().__init__(checkpoint, pool, executor=executor, extractor=extractor)
        self._head = head_for(self.checkpoint)
        self.epsilon = float(epsilon)
        self.temperature = float(temperature)
        self.sample = bool(sample)
        self._rng = np.random.default_rng(seed)

    # -- synchronous API (offline evaluation, tests, benchmarks) ------------------------

    def policy_probs(
        self,
        messages: Sequence[dict[str, Any]],
        cost_weight: float,
        mask: np.ndarray,
        tools: Sequence[Any] | None = None,
    ) -> np.ndarray:
        """The policy's softmax over ``self.actions`` (CPU work: runs in a worker thread)."""
        x = self.extractor.extract(messages, tools=tools)
        logits = self._head.logits(x, cost_weight)
        probs: np.ndarray = masked_softmax(logits, mask, self.temperature)[0]
        return probs

    def distribution(
        self,
        messages: Sequence[dict[str, Any]],
        cost_weight: float,
        allowed: Sequence[str] | ModelPool | None = None,
        *,
        tools: Sequence[Any] | None = None,
    ) -> dict[str, float]:
        """The policy's distribution over the allowed models (temperature applied)."""
        mask = self.mask_for(allowed)
        probs = self.policy_probs(messages, cost_weight, mask, tools)
        return {m: float(probs[i]) for i, m in enumerate(self.actions) if mask[i]}

    def distribution_batch(
        self,
        features: np.ndarray,
        cost_weights: float | Sequence[float] | np.ndarray,
        allowed: Sequence[str] | ModelPool | None = None,
    ) -> np.ndarray:
        """``(n, len(self.actions))`` probabilities for precomputed features."""
        logits = self._head.logits(features, cost_weights)
        return masked_softmax(logits, self.mask_for(allowed), self.temperature)

    def route_batch(
        self,
        features: np.ndarray,
        cost_weights: float | Sequence[float] | np.ndarray,
        allowed: Sequence[str] | ModelPool | None = None,
    ) -> list[str]:
        """Greedy choices for precomputed features (offline evaluation)."""
        probs = self.distribution_batch(features, cost_weights, allowed)
        return [self.actions[i] for i in probs.argmax(axis=1)]

    def behaviour(self, probs: np.ndarray, mask: np.ndarray, n_untrained: int = 0) -> np.ndarray:
        """The distribution actions are actually drawn from (greedy or sampled, ε mixed), over
        ``self.actions`` followed by ``n_untrained`` allowed pool models the checkpoint has no
        action for, which only ε reaches."""
        if self.sample:
            base = probs
        else:
            base = np.zeros_like(probs)
            base[int(np.argmax(np.where(mask, probs, -1.0)))] = 1.0
        base = np.concatenate([base, np.zeros(n_untrained)])
        if self.epsilon > 0:
            support = np.concatenate([mask, np.ones(n_untrained, dtype=bool)])
            base = (1.0 - self.epsilon) * base + self.epsilon * support / support.sum()
        return base

    def choose(
        self, probs: np.ndarray, mask: np.ndarray, n_untrained: int = 0
    ) -> tuple[int, float, np.ndarray, bool]:
        """(action index, propensity, behaviour distribution, explored); an index past
        ``self.actions`` is one of the ``n_untrained`` models that follow them."""
        beh = self.behaviour(probs, mask, n_untrained)
        greedy = int(np.argmax(np.where(mask, probs, -1.0)))
        if not self.sample and self.epsilon == 0.0:
            return greedy, 1.0, beh, False
        idx = int(self._rng.choice(len(beh), p=beh / beh.sum()))
        return idx, float(beh[idx]), beh, idx != greedy

    # -- the Policy interface --------------------------------------------------------

    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        state.decision.feature_version = self.feature_version
        state.decision.checkpoint = self.checkpoint.version
        if self.knows_none_of(ctx.pool):
            return await self.uninformed_step(ctx, state)
        note = state.notes.get(NOTE_KEY)
        if note is None:
            return await self._first_step(ctx, state)
        return self._after_failure(ctx, state, note)

    async def _first_step(self, ctx: RouteContext, state: LoopState) -> Step:
        mask = self.mask_for(ctx.pool)
        loop = asyncio.get_running_loop()
        # No tools: outcome tables (research data, ledger exports) carry none, so the
        # features' tool columns are 0 on every training prompt and their weights untrained;
        # serving with them set would score prompts the network never saw (train/serve skew).
        probs = await loop.run_in_executor(
            self._pool_executor(), self.policy_probs, ctx.messages, ctx.cost_weight, mask, None
        )
        untrained = self.untrained_in(ctx.pool) if self.epsilon > 0 else []
        idx, propensity, beh, explored = self.choose(probs, mask, len(untrained))
        candidates = [*self.actions, *untrained]
        model = candidates[idx]
        allowed = [i for i in range(len(self.actions)) if mask[i]]
        support = [*allowed, *range(len(self.actions), len(candidates))]
        state.decision.record(model, propensity, {candidates[i]: float(beh[i]) for i in support})
        state.decision.explored = explored
        ranking = sorted(allowed, key=lambda i: -probs[i])
        state.notes[NOTE_KEY] = {
            "policy_distribution": {self.actions[i]: float(probs[i]) for i in allowed},
            "ranking": [self.actions[i] for i in ranking],
            "mode": "sample" if self.sample else "greedy",
            "epsilon": self.epsilon,
            "temperature": self.temperature,
        }
        return Call((ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", model=model),), final=True)

    def _after_failure(self, ctx: RouteContext, state: LoopState, note: dict[str, Any]) -> Step:
        ranking: list[str] = note["ranking"]
        rank = {m: i for i, m in enumerate(ranking)}
        ok = state.successful()
        if ok:
            # An earlier call succeeded (e.g. through a provider fallback): use the best one.
            best = min(ok, key=lambda o: rank.get(o.model or o.call.model, len(rank)))
            return Select(best.call.id)
        tried: set[str] = set()
        for o in state.outcomes:
            tried.update(m for m in (o.call.model, o.model, o.fallback_from) if m)
        remaining = [m for m in ranking if m not in tried]
        last = state.outcomes[-1] if state.outcomes else None
        if last is not None and last.error_kind == "budget":
            # Refused for its worst-case cost: only cheaper models can still fit.
            ceiling = _list_price(ctx, last.call.model)
            remaining = [m for m in remaining if _list_price(ctx, m) < ceiling]
        if remaining and len(state.outcomes) < ctx.max_turns:
            # Deterministic given the failure, hence propensity 1.0 for this step.
            state.decision.record(remaining[0], 1.0)
            return Call(
                (ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", model=remaining[0]),), final=True
            )
        if not state.outcomes:  # the loop called us again without any call: nothing to select
            raise RuntimeError("compact policy: no call outcome to select from")
        # Nothing left to try: hand back the last failure so the loop reports its error.
        return Select(state.outcomes[-1].call.id)
