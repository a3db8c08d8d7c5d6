"""Comparison routers from the literature, for offline evaluation.

- ``SingleModelRouter``: every prompt to one model (one point);
- ``RandomMixRouter``: a share ``p`` of prompts (chosen by id hash) to the strong model, the
  rest to the weak one: the points on the chord between them (RouteLLM's random router);
- ``OracleRouter``: knows every outcome; at λ = 0 the cheapest model with the top score per
  prompt, for λ > 0 the best true reward (an upper bound, not a deployable router);
- ``KNNRouter`` (RouterBench, RouteLLM): a model's score on a prompt is predicted as its mean
  score on the ``k`` most similar training prompts (cosine over an embedding);
- ``MFRouter`` (RouteLLM's matrix factorization, pointwise): ``score ≈ σ(w2 · (v_m ⊙ W x) +
  b_m)`` with model embeddings ``v_m``, a projection ``W`` of the prompt embedding ``x`` and a
  per-model bias (so that with an uninformative prompt it falls back to each model's mean).

The learned ones are fitted on a training split only and route by the highest expected reward
(``training.evaluation.utility``), i.e. ``argmax_m pred_score_m - λ · normcost_m`` with the
default additive reward.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from router.outcomes import OutcomeRecord
from training.datasets.splits import hash_unit
from training.evaluation.embedding import Embed, HashingTfidfEmbedder, normalize_rows
from training.evaluation.sweep import OutcomeMatrix, RoutingError
from training.evaluation.utility import BASELINE_REWARD, choose, expected_reward, lambda_grid
from training.reward import RewardConfig


class SingleModelRouter:
    def __init__(self, model: str) -> None:
        self.model = model
        self.name = f"single:{model}"

    def fit(self, records: Sequence[OutcomeRecord]) -> SingleModelRouter:
        return self

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        return [self.model] * len(records)

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]:
        return [0.0]


class RandomMixRouter:
    """``cost_weight`` is read as the share of prompts sent to the strong model (0..1).
    Which prompts go is decided by a hash of the id, so the sets are nested as the share
    grows and the result does not depend on record order."""

    def __init__(
        self,
        weak: str | None = None,
        strong: str | None = None,
        seed: int = 0,
        name: str = "random",
    ) -> None:
        self.weak, self.strong, self.seed, self.name = weak, strong, seed, name
        # Hash positions of the last record list routed (a sweep routes it once per share).
        self._units_key: tuple[str, ...] | None = None
        self._units: list[float] = []

    def fit(self, records: Sequence[OutcomeRecord]) -> RandomMixRouter:
        """Without explicit models: weak = cheapest on average, strong = most accurate."""
        if self.weak is None or self.strong is None:
            m = OutcomeMatrix.from_records(records)
            cost, score = m.costs.mean(axis=0), m.scores.mean(axis=0)
            self.weak = self.weak or m.models[int(np.lexsort((-score, cost))[0])]
            self.strong = self.strong or m.models[int(np.lexsort((cost, -score))[0])]
        return self

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        if self.weak is None or self.strong is None:
            raise RoutingError(f"{self.name}: call fit() or name the weak and strong models")
        share = min(1.0, max(0.0, cost_weight))
        key = tuple(r.id for r in records)
        if key != self._units_key:
            # Salted apart from the split's hash (``split_of``, the same function): with
            # the same seed, the test part is exactly the ids hashed past 0.8, and every
            # share up to 0.8 sent none of them to the strong model.
            self._units = [hash_unit(r.id, f"random-mix:{self.seed}") for r in records]
            self._units_key = key
        strong, weak = self.strong, self.weak
        return [strong if u < share else weak for u in self._units]

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]:
        return np.linspace(0.0, 1.0, 21).tolist()


class OracleRouter:
    name = "oracle"

    def __init__(self, config: RewardConfig = BASELINE_REWARD) -> None:
        self.config = config

    def fit(self, records: Sequence[OutcomeRecord]) -> OracleRouter:
        return self

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        m = OutcomeMatrix.from_records(records)
        idx = choose(expected_reward(m.scores, m.costs, cost_weight, self.config), m.costs)
        return [m.models[j] for j in idx]

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]:
        return lambda_grid(OutcomeMatrix.from_records(records).costs.mean(axis=0), self.config)


class _PredictiveRouter:
    """Shared machinery: predict (score, cost) per model once per record list, then pick
    the best expected reward for each cost weight."""

    name = "predictive"
    config: RewardConfig = BASELINE_REWARD
    models: list[str]
    _train_costs: np.ndarray

    def __init__(self) -> None:
        self._cache_key: tuple[str, ...] | None = None
        self._cache: tuple[np.ndarray, np.ndarray] | None = None

    def _predict(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def predict(self, records: Sequence[OutcomeRecord]) -> tuple[np.ndarray, np.ndarray]:
        """Predicted scores and costs, (n, M) each, in ``self.models`` order."""
        if not hasattr(self, "models"):
            raise RoutingError(f"{self.name}: call fit() on a training split first")
        key = tuple(r.id for r in records)
        if self._cache_key != key or self._cache is None:
            self._cache = self._predict([r.text for r in records])
            self._cache_key = key
        return self._cache

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        scores, costs = self.predict(records)
        idx = choose(expected_reward(scores, costs, cost_weight, self.config), costs)
        return [self.models[j] for j in idx]

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]:
        return lambda_grid(self._train_costs.mean(axis=0), self.config)


class KNNRouter(_PredictiveRouter):
    def __init__(
        self,
        k: int = 50,
        embed: Embed | None = None,
        config: RewardConfig = BASELINE_REWARD,
        name: str = "knn",
        embed_dim: int = 2048,
    ) -> None:
        super().__init__()
        if k < 1:
            raise ValueError("k must be at least 1")
        self.k, self.config, self.name = k, config, name
        self._embed_arg, self._embed_dim = embed, embed_dim

    def fit(self, records: Sequence[OutcomeRecord]) -> KNNRouter:
        m = OutcomeMatrix.from_records(records)
        self._embed = self._embed_arg or HashingTfidfEmbedder(self._embed_dim).fit(m.texts)
        self._train_emb = normalize_rows(self._embed(m.texts))
        self._train_scores, self._train_costs = m.scores, m.costs
        self.models = m.models
        self._cache_key = None
        return self

    def _predict(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        k = min(self.k, len(self._train_emb))
        scores = np.empty((len(texts), len(self.models)))
        costs = np.empty_like(scores)
        # Blocks keep the similarity matrix small for large tables.
        for start in range(0, len(texts), 1024):
            emb = normalize_rows(self._embed(texts[start : start + 1024]))
            sims = emb @ self._train_emb.T
            nearest = np.argpartition(-sims, k - 1, axis=1)[:, :k]
            scores[start : start + len(emb)] = self._train_scores[nearest].mean(axis=1)
            costs[start : start + len(emb)] = self._train_costs[nearest].mean(axis=1)
        return scores, costs


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free


class MFRouter(_PredictiveRouter):
    """Trained by full-batch Adam on the binary cross-entropy of every (prompt, model) score
    of the training split (soft labels for partial scores), with L2 on the factors."""

    def __init__(
        self,
        dim: int = 32,
        epochs: int = 100,
        lr: float = 0.01,
        l2: float = 1e-3,
        seed: int = 0,
        embed: Embed | None = None,
        config: RewardConfig = BASELINE_REWARD,
        name: str = "mf",
        embed_dim: int = 2048,
    ) -> None:
        super().__init__()
        if dim < 1 or epochs < 1 or not lr > 0 or l2 < 0:
            raise ValueError("need dim >= 1, epochs >= 1, lr > 0 and l2 >= 0")
        self.dim, self.epochs, self.lr, self.l2, self.seed = dim, epochs, lr, l2, seed
        self.config, self.name = config, name
        self._embed_arg, self._embed_dim = embed, embed_dim

    def fit(self, records: Sequence[OutcomeRecord]) -> MFRouter:
        m = OutcomeMatrix.from_records(records)
        self._embed = self._embed_arg or HashingTfidfEmbedder(self._embed_dim).fit(m.texts)
        # float32 halves the matrix-product time; the loss needs no more precision.
        x = np.asarray(self._embed(m.texts), dtype=np.float32)
        self._params = self._train(x, m.scores.astype(np.float32))
        self._train_costs = m.costs
        self._mean_costs = m.costs.mean(axis=0)
        self.models = m.models
        self._cache_key = None
        return self

    def _train(self, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        """Full-batch Adam on the mean binary cross-entropy over all (prompt, model) pairs."""
        n, d = x.shape
        n_models = y.shape[1]
        rng = np.random.default_rng(self.seed)
        mean = np.clip(y.mean(axis=0), 1e-3, 1 - 1e-3)
        params = {
            "W": rng.normal(0.0, 1.0 / np.sqrt(d), (d, self.dim)).astype(np.float32),
            "V": rng.normal(0.0, 1.0 / np.sqrt(self.dim), (n_models, self.dim)).astype(np.float32),
            "w2": np.ones(self.dim, dtype=np.float32),
            # Start at each model's mean score, so the factors only learn the deviations.
            "b": np.log(mean / (1.0 - mean)).astype(np.float32),
        }
        moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
        beta1, beta2 = 0.9, 0.999
        for step in range(1, self.epochs + 1):
            z = x @ params["W"]  # (n, h)
            a = params["V"] * params["w2"]  # (M, h)
            g = (_sigmoid(z @ a.T + params["b"]) - y) / (n * n_models)  # dLoss/dlogit
            ga = g.T @ z  # (M, h)
            grads = {
                "W": x.T @ (g @ a) + self.l2 * params["W"],
                "V": ga * params["w2"] + self.l2 * params["V"],
                "w2": (ga * params["V"]).sum(axis=0) + self.l2 * params["w2"],
                "b": g.sum(axis=0),
            }
            for key, grad in grads.items():
                m1, m2 = moments[key]
                m1 *= beta1
                m1 += (1 - beta1) * grad
                m2 *= beta2
                m2 += (1 - beta2) * grad * grad
                step_size = self.lr * np.sqrt(1 - beta2**step) / (1 - beta1**step)
                params[key] -= step_size * m1 / (np.sqrt(m2) + 1e-8)
        return params

    def _predict(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        p = self._params
        x = np.asarray(self._embed(texts), dtype=np.float32)
        logits = (x @ p["W"]) @ (p["V"] * p["w2"]).T + p["b"]
        # MF models quality only; each model's cost is its training mean.
        return _sigmoid(logits), np.broadcast_to(self._mean_costs, logits.shape).copy()
