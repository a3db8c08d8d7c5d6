"""Cascades measured offline on recorded responses: "call cheap first, escalate on
disagreement" (the xRouter idea), with the same answer normalization and selection rule as
the online ``router.policies.baselines.CascadePolicy``.

``CascadeRouter(order, k, quorum=2)`` is one configuration: call the first ``k`` models of
``order``; while no ``quorum`` answers called so far agree (``router.answers.normalize_answer``:
same final answer, not same wording), call the next model; when they agree, the cheapest
agreeing model's answer (earliest in ``order``) is final; when the order is exhausted, the
last model's answer is. ``quorum=2`` is exactly the online policy's "any two agree". With a ``check``
instead, models are called one at a time and the first answer that passes the check is final
(the last model is accepted unconditionally). Cost = the sum of every call made.

``CascadeFamilyRouter`` enumerates configurations built from the training split (cheap
models ranked by training accuracy, followed or not by the most accurate model as a
fallback, and each single model), measures each on the training split, and for a cost weight
λ runs the configuration with the best mean reward there: a λ sweep traces the family's curve.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from router.answers import normalize_answer
from router.outcomes import OutcomeRecord
from router.plans import Accept, CascadePlan
from training.evaluation.embedding import Embed, HashingTfidfEmbedder, normalize_rows
from training.evaluation.sweep import OutcomeMatrix, RoutedPrompt, RoutingError, recorded_response
from training.evaluation.utility import BASELINE_REWARD, expected_reward, lambda_grid
from training.reward import RewardConfig

# (record, model, response) -> accept this answer without escalating?
Check = Callable[[OutcomeRecord, str, str], bool]


def nonempty_check(record: OutcomeRecord, model: str, response: str) -> bool:
    """Accept any non-empty answer (the online policy's ``nonempty`` check, minus the
    finish-reason test: the tables do not record it)."""
    return bool(response.strip())


def _response(record: OutcomeRecord, model: str) -> str:
    return recorded_response(record, model, "a cascade needs responses to check agreement")


class CascadeRouter:
    def __init__(
        self,
        order: Sequence[str],
        k: int = 2,
        quorum: int = 2,
        check: Check | None = None,
        name: str | None = None,
    ) -> None:
        if check is not None and k != 1:
            raise ValueError("a checked cascade calls one model at a time (k=1)")
        # The plan validates the order, k and quorum, and decides agreement exactly as the
        # served policy does (``router.policies.planned``).
        self.plan = CascadePlan(tuple(order), k, quorum)
        self.check = check
        self.name = name or self.plan.name

    @property
    def order(self) -> list[str]:
        return list(self.plan.order)

    @property
    def k(self) -> int:
        return self.plan.k

    @property
    def quorum(self) -> int:
        return self.plan.quorum

    def fit(self, records: Sequence[OutcomeRecord]) -> CascadeRouter:
        return self

    def trajectory(self, record: OutcomeRecord) -> RoutedPrompt:
        called = list(self.plan.first)
        if self.check is not None:
            while True:
                last = called[-1]
                order = self.plan.order
                if self.check(record, last, _response(record, last)) or len(called) == len(order):
                    return RoutedPrompt.from_calls(record, called, last)
                called.append(order[len(called)])
        answers: dict[str, str] = {}
        while True:
            for m in called:
                if m not in answers:
                    answers[m] = normalize_answer(_response(record, m))
            step = self.plan.advance(called, answers)
            if isinstance(step, Accept):
                return RoutedPrompt.from_calls(record, called, step.model)
            called.append(step.model)

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[RoutedPrompt]:
        return [self.trajectory(r) for r in records]

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]:
        return [0.0]


def _best_first(models: Sequence[str], score: np.ndarray, cost: np.ndarray) -> list[str]:
    """Models by training accuracy (cheaper first on ties)."""
    order = np.lexsort((cost, -score))
    return [models[i] for i in order]


class CascadeFamilyRouter:
    """A family of cascades; the cost weight picks the member.

    ``local_k=None``: one member for every prompt, the one with the best mean training reward.
    ``local_k=k``: per prompt, the member with the best mean reward on the ``k`` most similar
    training prompts (cosine over ``embed``, hashed TF-IDF by default), so that "cheap first"
    is used where cheap answers that agree tend to be right, and the strong model is called
    directly where they do not.
    """

    def __init__(
        self,
        max_cheap: int = 4,
        batch_sizes: int | Sequence[int] = (2,),
        quorums: int | Sequence[int] = (2,),
        fallback: str | None = None,
        local_k: int | None = None,
        embed: Embed | None = None,
        config: RewardConfig = BASELINE_REWARD,
        name: str = "cascade",
    ) -> None:
        if max_cheap < 1:
            raise ValueError("max_cheap must be at least 1")
        if local_k is not None and local_k < 1:
            raise ValueError("local_k must be at least 1")
        self.max_cheap = max_cheap
        self.batch_sizes = (batch_sizes,) if isinstance(batch_sizes, int) else tuple(batch_sizes)
        self.quorums = (quorums,) if isinstance(quorums, int) else tuple(quorums)
        self.fallback, self.local_k, self.config, self.name = fallback, local_k, config, name
        self._embed_arg = embed
        self.configs: list[CascadeRouter] = []
        # Neighbour weights of the last record list routed (a sweep routes it once per λ).
        self._weights_key: tuple[str, ...] | None = None
        self._weights = np.zeros((0, 0))

    def _candidates(self, m: OutcomeMatrix) -> list[CascadeRouter]:
        score, cost = m.scores.mean(axis=0), m.costs.mean(axis=0)
        price = dict(zip(m.models, cost, strict=True))
        ranked = _best_first(m.models, score, cost)
        fallback = self.fallback or ranked[0]
        if fallback not in price:
            raise RoutingError(f"{self.name}: fallback model {fallback!r} is not in the table")
        cheap = [x for x in ranked if price[x] < price[fallback]][: self.max_cheap]
        configs = [CascadeRouter([x], 1) for x in m.models]
        seen = {c.name for c in configs}
        for size in range(2, len(cheap) + 1):
            for subset in itertools.combinations(cheap, size):
                chain = sorted(subset, key=lambda x: (price[x], x))
                for k, q in itertools.product(self.batch_sizes, self.quorums):
                    if q > size or k > size:
                        continue
                    for order in (chain, [*chain, fallback]):
                        cfg = CascadeRouter(order, max(k, q), q)
                        if cfg.name not in seen:
                            seen.add(cfg.name)
                            configs.append(cfg)
        # One cheap model, escalating to the fallback when they disagree.
        configs.extend(CascadeRouter([x, fallback], 2) for x in cheap)
        return configs

    def candidates(self, records: Sequence[OutcomeRecord]) -> list[CascadeRouter]:
        """The family's members for a training split (before any is measured)."""
        return self._candidates(OutcomeMatrix.from_records(records))

    def fit(self, records: Sequence[OutcomeRecord]) -> CascadeFamilyRouter:
        m = OutcomeMatrix.from_records(records)
        self.configs = self._candidates(m)
        n = len(records)
        self._scores = np.empty((len(self.configs), n))
        self._costs = np.empty((len(self.configs), n))
        for i, cfg in enumerate(self.configs):
            routed = cfg.route(records, 0.0)
            self._scores[i] = [r.score for r in routed]
            self._costs[i] = [r.cost_usd for r in routed]
        self._model_costs = m.costs.mean(axis=0)
        if self.local_k is not None:
            self._embed = self._embed_arg or HashingTfidfEmbedder().fit(m.texts)
            self._train_emb = normalize_rows(self._embed(m.texts))
        return self

    def _best(self, reward: np.ndarray, cost: np.ndarray) -> int:
        best = reward.max()
        tied = np.flatnonzero(reward >= best - 1e-12)
        return int(tied[np.argmin(cost[tied])])

    def select(self, cost_weight: float) -> CascadeRouter:
        """The member with the best mean training reward at ``cost_weight`` (the cheaper one
        on a tie)."""
        if not self.configs:
            raise RoutingError(f"{self.name}: call fit() on a training split first")
        reward = expected_reward(self._scores, self._costs, cost_weight, self.config).mean(axis=1)
        return self.configs[self._best(reward, self._costs.mean(axis=1))]

    def _neighbours(self, records: Sequence[OutcomeRecord]) -> np.ndarray:
        """(n, n_train) averaging weights over each record's ``local_k`` nearest training
        prompts."""
        k = min(self.local_k or 1, self._train_emb.shape[0])
        emb = normalize_rows(self._embed([r.text for r in records]))
        sims = emb @ self._train_emb.T
        nearest = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        weights = np.zeros_like(sims, dtype=float)
        np.put_along_axis(weights, nearest, 1.0 / k, axis=1)
        return weights

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[RoutedPrompt]:
        if self.local_k is None:
            return self.select(cost_weight).route(records, cost_weight)
        if not self.configs:
            raise RoutingError(f"{self.name}: call fit() on a training split first")
        key = tuple(r.id for r in records)
        if self._weights_key != key:
            self._weights, self._weights_key = self._neighbours(records), key
        weights = self._weights
        reward = weights @ expected_reward(self._scores, self._costs, cost_weight, self.config).T
        cost = weights @ self._costs.T
        return [
            self.configs[self._best(reward[i], cost[i])].trajectory(r)
            for i, r in enumerate(records)
        ]

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]:
        return lambda_grid(self._model_costs, self.config)
