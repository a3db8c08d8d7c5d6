"""A learned escalation policy measured offline on recorded responses: call cheap models
first, and buy more answers (more cheap models, or the strong model) only where a small
classifier says the answers in hand are likely wrong.

Per task (inferred from the prompt at serving time by a nearest-centroid classifier over a
hashed TF-IDF embedding), a *plan* orders up to ``max_cheap`` cheap models and names a final
(strong) model. The states of a prompt are "nothing called yet", "the first ``first`` cheap
models called", "one more cheap model called", ... . In every state the router knows only the
prompt and the responses of the models it has called, and from them:

- a *selector* (logistic regression over candidate answers: which called models voted for it,
  answer kind and letter, code checks such as "the fenced code parses and defines a function",
  token overlap with the other responses) picks the best candidate answer;
- per option (stop here, call up to a later cheap stage, or call the final model), a logistic
  regression on the state's features (the selector's confidence and margin, the agreement
  pattern, each model's answer letter/kind, the prompt length) predicts the probability that
  the option's answer is right.

With cost weight λ the router takes the option with the best ``p̂ − λ · ĉ / cost_scale``
(``ĉ``: the new calls' mean training cost for the task; the additive reward of
``training.reward``), and repeats from the new state. A trajectory's cost is the sum of every
call it made; its score is the score of the answer it returns. The final model's answer is
kept (``combine_final=False``) or re-selected among every answer bought so far.

Everything is fitted on the training split; λ (and the plan's hyper-parameters) are meant to
be chosen on validation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from router.outcomes import OutcomeRecord
from training.evaluation.embedding import HashingTfidfEmbedder, normalize_rows
from training.evaluation.escalation_features import Response, build_state, candidates, response_of
from training.evaluation.logistic import Logistic
from training.evaluation.sweep import RoutedPrompt, RoutingError, table_models
from training.evaluation.utility import BASELINE_REWARD
from training.reward import RewardConfig

ANY_TASK = "*"  # the group of training records without a task label


# -- one task's plan ---------------------------------------------------------------------------


@dataclass
class TaskPlan:
    """Cheap models in call order, how many are called first, and the final model."""

    cheap: tuple[str, ...]
    first: int
    final: str
    # Learned parts (filled by fit).
    selectors: dict[tuple[str, ...], Logistic] = field(default_factory=dict)
    values: dict[tuple[int, int], Logistic] = field(default_factory=dict)
    mean_cost: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.final in self.cheap:
            raise ValueError(f"the final model {self.final!r} is also a cheap model")
        if self.cheap and not 1 <= self.first <= len(self.cheap):
            raise ValueError(f"first must be between 1 and {len(self.cheap)}, got {self.first}")

    @property
    def sizes(self) -> list[int]:
        """Cheap-stage sizes (0 = nothing called yet)."""
        return [0, *range(self.first, len(self.cheap) + 1)] if self.cheap else [0]

    @property
    def final_option(self) -> int:
        return -1

    def called(self, size: int, option: int) -> tuple[str, ...]:
        """Models called after taking ``option`` (a stage size or final) from ``size``."""
        if option == self.final_option:
            return (*self.cheap[:size], self.final)
        return self.cheap[:option]

    def options(self, size: int) -> list[int]:
        return [s for s in self.sizes if s > size] + [self.final_option]

    def extra_cost(self, size: int, option: int) -> float:
        done = set(self.cheap[:size])
        return sum(self.mean_cost[m] for m in self.called(size, option) if m not in done)


@dataclass(slots=True)
class _Prepared:
    """A record's λ-free quantities: per state size, the pick and each option's predicted
    probability of a right answer (``size`` itself = stop)."""

    picks: dict[int, str]
    final_pick: dict[int, str]
    values: dict[int, dict[int, float]]


class EscalationRouter:
    """Learned multi-call escalation; ``route(records, λ)`` returns one trajectory each.

    ``plans`` (task -> cheap models in call order) overrides the automatic choice: per task,
    the ``max_cheap`` most accurate models (on training) whose mean cost is at most
    ``cheap_ratio`` times the final model's, best first. ``final`` defaults to the most
    accurate model of the training table (cheaper on a tie). ``first`` cheap models are called
    together once the router decides to call any. Records without a ``task`` train one
    shared plan.
    """

    def __init__(
        self,
        max_cheap: int = 3,
        first: int = 2,
        cheap_ratio: float = 0.1,
        final: str | None = None,
        plans: Mapping[str, Sequence[str]] | None = None,
        combine_final: bool = False,
        l2: float = 1.0,
        folds: int = 5,
        config: RewardConfig = BASELINE_REWARD,
        name: str = "escalation",
    ) -> None:
        if max_cheap < 0 or first < 1 or cheap_ratio <= 0 or l2 <= 0 or folds < 2:
            raise ValueError(
                "need max_cheap >= 0, first >= 1, cheap_ratio > 0, l2 > 0 and folds >= 2"
            )
        self.max_cheap, self.first, self.cheap_ratio = max_cheap, first, cheap_ratio
        self.final, self.plans_arg, self.combine_final = final, plans, combine_final
        self.l2, self.folds, self.config, self.name = l2, folds, config, name
        self.plans: dict[str, TaskPlan] = {}
        self._responses: dict[tuple[str, str], Response] = {}
        self._prepared: dict[str, _Prepared] = {}
        self._embed: HashingTfidfEmbedder | None = None
        self._centroids = np.zeros((0, 0))
        self._tasks: list[str] = []
        self._task_of: dict[str, str] = {}
        self._train_rows: dict[str, list[OutcomeRecord]] = {}
        self._first_moves: dict[tuple[str, float], int] = {}
        self._model_costs = np.zeros(0)

    # -- serving-time pieces ---------------------------------------------------------------

    def _responses_of(self, record: OutcomeRecord, models: Sequence[str]) -> dict[str, Response]:
        out = {}
        for m in models:
            key = (record.id, m)
            if key not in self._responses:
                self._responses[key] = response_of(record, m)
            out[m] = self._responses[key]
        return out

    def infer_tasks(self, texts: Sequence[str]) -> list[str]:
        """The task of each prompt: the nearest training task centroid (cosine)."""
        if self._embed is None:
            raise RoutingError(f"{self.name}: call fit() on a training split first")
        if len(self._tasks) == 1:
            return [self._tasks[0]] * len(texts)
        sims = normalize_rows(self._embed(list(texts))) @ self._centroids.T
        return [self._tasks[int(i)] for i in sims.argmax(axis=1)]

    # -- fitting -------------------------------------------------------------------------------

    def _auto_plan(self, records: Sequence[OutcomeRecord], models: list[str]) -> TaskPlan:
        score = {m: float(np.mean([r.outcomes[m].score for r in records])) for m in models}
        cost = {m: float(np.mean([r.outcomes[m].cost_usd or 0.0 for r in records])) for m in models}
        final = self.final or max(models, key=lambda m: (score[m], -cost[m]))
        if final not in cost:
            raise RoutingError(f"{self.name}: final model {final!r} is not in the table")
        cheap = [m for m in models if m != final and cost[m] <= self.cheap_ratio * cost[final]]
        cheap.sort(key=lambda m: (-score[m], cost[m]))
        chosen = tuple(cheap[: self.max_cheap])
        return TaskPlan(chosen, min(self.first, len(chosen)) or 1, final)

    def fit(self, records: Sequence[OutcomeRecord]) -> EscalationRouter:
        models = table_models(records)
        if not models:
            raise RoutingError(f"{self.name}: the table has no model with an outcome everywhere")
        groups: dict[str, list[OutcomeRecord]] = {}
        for r in records:
            groups.setdefault(r.task or ANY_TASK, []).append(r)
        self._tasks = sorted(groups)
        self._embed = HashingTfidfEmbedder().fit([r.text for r in records])
        self._centroids = normalize_rows(
            np.stack([self._embed([r.text for r in groups[t]]).mean(axis=0) for t in self._tasks])
        )
        self.plans = {}
        for task, rows in groups.items():
            if self.plans_arg is not None and task in self.plans_arg:
                auto = self._auto_plan(rows, models)
                cheap = tuple(self.plans_arg[task])
                plan = TaskPlan(cheap, min(self.first, len(cheap)) or 1, auto.final)
            else:
                plan = self._auto_plan(rows, models)
            self._fit_plan(plan, rows)
            self.plans[task] = plan
        self._model_costs = np.array(
            [np.mean([r.outcomes[m].cost_usd or 0.0 for r in records]) for m in models]
        )
        self._prepared, self._task_of, self._first_moves = {}, {}, {}
        self._train_rows = {task: list(rows) for task, rows in groups.items()}
        return self

    def _fit_selectors(
        self,
        plan: TaskPlan,
        rows: Sequence[OutcomeRecord],
        responses: Sequence[Mapping[str, Response]],
    ) -> dict[tuple[str, ...], Logistic]:
        """A selector for every called set a trajectory can end in."""
        called_sets = {plan.called(0, s) for s in plan.sizes if s > 0}
        if self.combine_final:
            called_sets |= {plan.called(s, plan.final_option) for s in plan.sizes}
        selectors = {}
        for called in called_sets:
            xs, ys = [], []
            for r, resp in zip(rows, responses, strict=True):
                for c in candidates(resp, called):
                    xs.append(c.features)
                    ys.append(r.outcomes[c.model].score)
            if xs:
                selectors[called] = Logistic(self.l2).fit(np.stack(xs), np.array(ys))
        return selectors

    def _fit_plan(self, plan: TaskPlan, rows: Sequence[OutcomeRecord]) -> None:
        everyone = (*plan.cheap, plan.final)
        plan.mean_cost = {
            m: float(np.mean([r.outcomes[m].cost_usd or 0.0 for r in rows])) for m in everyone
        }
        responses = [self._responses_of(r, everyone) for r in rows]
        plan.selectors = self._fit_selectors(plan, rows, responses)
        # The option values learn from out-of-fold selectors: an in-sample selector looks
        # more often right than it will be on new prompts, which would make stopping early
        # look safer than it is.
        folds = np.arange(len(rows)) % self.folds if len(rows) >= 2 * self.folds else None
        fold_selectors = (
            [
                self._fit_selectors(
                    plan,
                    [r for r, f in zip(rows, folds, strict=True) if f != k],
                    [x for x, f in zip(responses, folds, strict=True) if f != k],
                )
                for k in range(self.folds)
            ]
            if folds is not None
            else None
        )
        for size in plan.sizes:
            feats: list[np.ndarray] = []
            labels: dict[int, list[float]] = {o: [] for o in [size, *plan.options(size)] if o != 0}
            for i, (r, resp) in enumerate(zip(rows, responses, strict=True)):
                sel = (
                    plan.selectors
                    if fold_selectors is None or folds is None
                    else fold_selectors[int(folds[i])]
                )
                feats.append(build_state(r, resp, plan.called(0, size), sel).features)
                for o in labels:
                    pick = self._outcome_pick(plan, sel, r, resp, size, o)
                    labels[o].append(r.outcomes[pick].score)
            for o, y in labels.items():
                plan.values[(size, o)] = Logistic(self.l2).fit(np.stack(feats), np.array(y))

    # -- routing -------------------------------------------------------------------------------

    def _outcome_pick(
        self,
        plan: TaskPlan,
        selectors: Mapping[tuple[str, ...], Logistic],
        record: OutcomeRecord,
        responses: Mapping[str, Response],
        size: int,
        option: int,
    ) -> str:
        """The model whose answer is returned when stopping after ``option`` from ``size``."""
        if option == plan.final_option and not self.combine_final:
            return plan.final
        return build_state(record, responses, plan.called(size, option), selectors).pick

    def _prepare(self, plan: TaskPlan, record: OutcomeRecord) -> _Prepared:
        responses = self._responses_of(record, (*plan.cheap, plan.final))
        picks, final_pick, values = {}, {}, {}
        for size in plan.sizes:
            st = build_state(record, responses, plan.called(0, size), plan.selectors)
            picks[size] = st.pick
            final_pick[size] = self._outcome_pick(
                plan, plan.selectors, record, responses, size, plan.final_option
            )
            values[size] = {
                o: float(model.predict(st.features[None, :])[0])
                for (s, o), model in plan.values.items()
                if s == size
            }
        return _Prepared(picks, final_pick, values)

    def _plan_for(self, task: str) -> TaskPlan:
        if not self.plans:
            raise RoutingError(f"{self.name}: call fit() on a training split first")
        return self.plans.get(task) or self.plans[self._tasks[0]]

    def _prepared_for(self, plan: TaskPlan, task: str, record: OutcomeRecord) -> _Prepared:
        key = f"{task}\x00{record.id}"
        if key not in self._prepared:
            self._prepared[key] = self._prepare(plan, record)
        return self._prepared[key]

    def _walk(
        self,
        plan: TaskPlan,
        prep: _Prepared,
        record: OutcomeRecord,
        cost_weight: float,
        first_option: int | None,
    ) -> RoutedPrompt:
        """Follow the λ rule from "nothing called", taking ``first_option`` first if given."""
        size = 0
        while True:
            # Stopping (size > 0) costs nothing more; ties go to the cheaper option.
            best, best_value = None, -math.inf
            if size > 0:
                best, best_value = size, prep.values[size][size]
            for o in plan.options(size):
                extra = plan.extra_cost(size, o) / self.config.cost_scale
                v = prep.values[size][o] - cost_weight * extra
                if v > best_value + 1e-12:
                    best, best_value = o, v
            if size == 0 and first_option is not None:
                best = first_option
            assert best is not None
            if best == plan.final_option:
                return RoutedPrompt.from_calls(
                    record, plan.called(size, best), prep.final_pick[size]
                )
            if best == size:
                return RoutedPrompt.from_calls(record, plan.called(0, size), prep.picks[size])
            size = best

    def _first_option(self, task: str, cost_weight: float) -> int:
        """The first move for a task at ``cost_weight``: the one whose continuation (the λ rule
        from there on) earns the best mean training reward. The per-prompt rule alone is
        myopic there: it would value "call the cheap models" as if their answer had to be
        kept, ignoring that a doubtful one can still be escalated."""
        key = (task, cost_weight)
        if key not in self._first_moves:
            plan = self._plan_for(task)
            rows = self._train_rows.get(task, [])
            best, best_reward = plan.final_option, -math.inf
            for o in plan.options(0):
                routed = [
                    self._walk(plan, self._prepared_for(plan, task, r), r, cost_weight, o)
                    for r in rows
                ]
                reward = (
                    float(
                        np.mean(
                            [
                                x.score - cost_weight * x.cost_usd / self.config.cost_scale
                                for x in routed
                            ]
                        )
                    )
                    if routed
                    else -math.inf
                )
                # Options run cheapest first, so a tie keeps the cheaper one.
                if reward > best_reward + 1e-12:
                    best, best_reward = o, reward
            self._first_moves[key] = best
        return self._first_moves[key]

    def trajectory(self, record: OutcomeRecord, cost_weight: float, task: str) -> RoutedPrompt:
        if cost_weight < 0:
            raise ValueError("cost_weight must be non-negative")
        plan = self._plan_for(task)
        prep = self._prepared_for(plan, task, record)
        return self._walk(plan, prep, record, cost_weight, self._first_option(task, cost_weight))

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[RoutedPrompt]:
        # A sweep routes the same records once per λ: infer each prompt's task once.
        todo = list({r.id: r.text for r in records if r.id not in self._task_of}.items())
        if todo:
            inferred = self.infer_tasks([text for _, text in todo])
            self._task_of.update(zip((i for i, _ in todo), inferred, strict=True))
        tasks = [self._task_of[r.id] for r in records]
        return [self.trajectory(r, cost_weight, t) for r, t in zip(records, tasks, strict=True)]

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]:
        """0, then λ on a fine geometric grid from "cost barely matters" to "any saving wins"
        (a value difference is at most 1; normalized costs are the plans' mean costs)."""
        costs = [
            c / self.config.cost_scale for p in self.plans.values() for c in p.mean_cost.values()
        ]
        costs = [c for c in costs if c > 0]
        if not costs:
            return [0.0]
        lo, hi = 1e-3 / max(costs), 10.0 / min(costs)
        return [0.0, *np.geomspace(lo, hi, 80).tolist()]


def best_under_budget(
    router: EscalationRouter,
    records: Sequence[OutcomeRecord],
    budget_usd: float,
    params: Sequence[float] | None = None,
) -> tuple[float, float, float] | None:
    """The cost weight whose operating point on ``records`` scores best at a mean cost of at
    most ``budget_usd`` (the cheaper one on a tie), as ``(λ, score, cost)``; None if no point
    is that cheap. Run it on validation to choose the operating point reported on test."""
    best: tuple[float, float, float] | None = None
    for lam in params if params is not None else router.default_sweep(records):
        routed = router.route(records, lam)
        cost = float(np.mean([r.cost_usd for r in routed]))
        score = float(np.mean([r.score for r in routed]))
        if cost > budget_usd + 1e-12:
            continue
        if (
            best is None
            or score > best[1] + 1e-12
            or (abs(score - best[1]) <= 1e-12 and cost < best[2])
        ):
            best = (lam, score, cost)
    return best
