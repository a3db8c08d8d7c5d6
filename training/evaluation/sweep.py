"""Running routers over an outcome table: what was routed where, what it cost, what it scored.

A router for offline evaluation is anything with a ``name`` and ``route(records,
cost_weight)`` that says, for each record, which model's answer is final: a model name, a
list of the models called in order (the last one's answer is final), or a ``RoutedPrompt``
for trajectories that select an earlier answer. Scores and costs always come from the
recorded outcomes; a multi-call trajectory costs the sum of the calls it made.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from router.outcomes import ModelOutcome, OutcomeRecord
from training.evaluation.metrics import CurvePoint


class RoutingError(ValueError):
    """A router's decision cannot be evaluated on the table (unknown model, wrong count)."""


def recorded_response(record: OutcomeRecord, model: str, needed_for: str) -> str:
    """``model``'s recorded answer on ``record``, for multi-call routers that read answers;
    ``needed_for`` says why in the error when the table lacks it."""
    outcome = record.outcomes.get(model)
    if outcome is None:
        raise RoutingError(f"record {record.id!r} has no outcome for model {model!r}")
    if outcome.response is None:
        raise RoutingError(
            f"record {record.id!r}: model {model!r} has no recorded response ({needed_for})"
        )
    return outcome.response


@dataclass(frozen=True, slots=True)
class RoutedPrompt:
    """One prompt's trajectory: the model whose answer was final, every model called (in
    order), the total cost and the final answer's score."""

    final_model: str
    models_called: tuple[str, ...]
    cost_usd: float
    score: float

    @classmethod
    def from_calls(
        cls, record: OutcomeRecord, models_called: Sequence[str], final_model: str | None = None
    ) -> RoutedPrompt:
        """Score and cost from the record: the final model's score, the sum of the calls'
        costs (each model counted once per call)."""
        if not models_called:
            raise RoutingError(f"record {record.id!r}: a trajectory must call at least one model")
        final = final_model if final_model is not None else models_called[-1]
        if final not in models_called:
            raise RoutingError(f"record {record.id!r}: final model {final!r} was never called")
        cost = 0.0
        for m in models_called:
            cost += _outcome_cost(record, m)
        return cls(final, tuple(models_called), cost, _outcome(record, final).score)


Route = str | Sequence[str] | RoutedPrompt


@runtime_checkable
class OfflineRouter(Protocol):
    name: str

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> Sequence[Route]:
        """One route per record, in order."""
        ...


@runtime_checkable
class SweepDefaults(Protocol):
    """Routers whose parameter is not a cost weight (random mixes: the share of strong
    calls; single models: nothing) say which values trace their curve."""

    def default_sweep(self, records: Sequence[OutcomeRecord]) -> list[float]: ...


def _outcome(record: OutcomeRecord, model: str) -> ModelOutcome:
    try:
        return record.outcomes[model]
    except KeyError:
        raise RoutingError(f"record {record.id!r} has no outcome for model {model!r}") from None


def _outcome_cost(record: OutcomeRecord, model: str) -> float:
    cost = _outcome(record, model).cost_usd
    if cost is None:
        raise RoutingError(f"record {record.id!r}: model {model!r} has no cost_usd")
    return cost


def resolve(record: OutcomeRecord, route: Route) -> RoutedPrompt:
    if isinstance(route, RoutedPrompt):
        return route
    if isinstance(route, str):
        return RoutedPrompt.from_calls(record, (route,))
    return RoutedPrompt.from_calls(record, tuple(route))


def summarize(routed: Sequence[RoutedPrompt], param: float | None = None) -> CurvePoint:
    """The operating point of a list of trajectories."""
    if not routed:
        raise RoutingError("no prompts to evaluate")
    n = len(routed)
    finals: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    cost = score = 0.0
    for r in routed:
        finals[r.final_model] += 1
        calls.update(r.models_called)
        cost += r.cost_usd
        score += r.score
    return CurvePoint(
        cost / n,
        score / n,
        {m: c / n for m, c in sorted(finals.items())},
        {m: c / n for m, c in sorted(calls.items())},
        param,
    )


def evaluate_routes(
    records: Sequence[OutcomeRecord], routes: Sequence[Route], param: float | None = None
) -> CurvePoint:
    return evaluate_prompts(records, routes, param).point


@dataclass(frozen=True, slots=True)
class PromptResults:
    """One operating point and what it was made of: each prompt's score and cost (in the
    records' order), which resampling for confidence intervals needs."""

    point: CurvePoint
    scores: np.ndarray  # (n,)
    costs: np.ndarray  # (n,) USD
    # Calls each prompt made to each model (models never called are absent), for the share
    # of strong calls that PGR is measured against.
    calls: dict[str, np.ndarray] = field(default_factory=dict)

    def calls_to(self, model: str) -> np.ndarray:
        found = self.calls.get(model)
        return np.zeros(len(self.scores)) if found is None else found.astype(np.float64)


def evaluate_prompts(
    records: Sequence[OutcomeRecord], routes: Sequence[Route], param: float | None = None
) -> PromptResults:
    if len(routes) != len(records):
        raise RoutingError(f"{len(routes)} routes for {len(records)} records")
    if not records:
        raise RoutingError("no prompts to evaluate")
    models = [r for r in routes if isinstance(r, str)]
    if len(models) != len(routes):
        routed = [resolve(rec, r) for rec, r in zip(records, routes, strict=True)]
        calls: dict[str, np.ndarray] = {}
        for i, r in enumerate(routed):
            for m in r.models_called:
                calls.setdefault(m, np.zeros(len(routed), np.uint16))[i] += 1
        return PromptResults(
            summarize(routed, param),
            np.fromiter((r.score for r in routed), float, len(routed)),
            np.fromiter((r.cost_usd for r in routed), float, len(routed)),
            calls,
        )
    # Fast path for single-call routes (most routers), without per-prompt objects: a sweep
    # over a large table evaluates hundreds of thousands of them.
    n = len(records)
    codes: dict[str, int] = {}
    chosen = np.empty(n, np.int32)
    scores = np.empty(n)
    costs = np.empty(n)
    for i, (rec, model) in enumerate(zip(records, models, strict=True)):
        outcome = _outcome(rec, model)
        if outcome.cost_usd is None:
            raise RoutingError(f"record {rec.id!r}: model {model!r} has no cost_usd")
        chosen[i] = codes.setdefault(model, len(codes))
        scores[i] = outcome.score
        costs[i] = outcome.cost_usd
    calls = {m: (chosen == k).astype(np.uint16) for m, k in sorted(codes.items())}
    shares = {m: int(c.sum()) / n for m, c in calls.items()}
    point = CurvePoint(float(costs.sum()) / n, float(scores.sum()) / n, shares, dict(shares), param)
    return PromptResults(point, scores, costs, calls)


@dataclass(frozen=True, slots=True)
class SweepResult:
    name: str
    points: list[CurvePoint]
    # Per point, each prompt's score and cost (same order as ``points``).
    prompts: list[PromptResults] = field(default_factory=list)


def sweep(
    router: OfflineRouter,
    records: Sequence[OutcomeRecord],
    params: Iterable[float] | None = None,
) -> SweepResult:
    """Evaluate ``router`` at each cost weight (or the router's own sweep values)."""
    if params is None:
        params = router.default_sweep(records) if isinstance(router, SweepDefaults) else [0.0]
    results = [evaluate_prompts(records, router.route(records, float(p)), float(p)) for p in params]
    return SweepResult(router.name, [r.point for r in results], results)


def table_models(records: Sequence[OutcomeRecord]) -> list[str]:
    """Models with an outcome on every record, in the first record's order."""
    if not records:
        return []
    common = set(records[0].outcomes)
    for r in records[1:]:
        common &= set(r.outcomes)
    return [m for m in records[0].outcomes if m in common]


def is_full_information(records: Sequence[OutcomeRecord]) -> bool:
    """True when every record has an outcome for every model of the table (research data),
    False for partial feedback (logged traffic), which needs off-policy estimates — also
    when it holds one model only (an export of a gateway that served one)."""
    if not records or any(r.partial_feedback for r in records):
        return False
    union: set[str] = set()
    for r in records:
        union |= set(r.outcomes)
    return len(table_models(records)) == len(union)


def restrict_models(records: Sequence[OutcomeRecord], models: Sequence[str]) -> list[OutcomeRecord]:
    """The table with only ``models``' outcomes (for two-model PGR slices). A logged action
    outside the slice is dropped from the copy."""
    keep = list(models)
    out = []
    for r in records:
        missing = [m for m in keep if m not in r.outcomes]
        if missing:
            raise RoutingError(f"record {r.id!r} has no outcome for {', '.join(missing)}")
        # Keep the table's model order (it is the action order of learned policies).
        update: dict[str, object] = {"outcomes": {m: o for m, o in r.outcomes.items() if m in keep}}
        if r.logged is not None and r.logged.action not in keep:
            update["logged"] = None
        out.append(r.model_copy(update=update))
    return out


@dataclass(frozen=True, slots=True)
class OutcomeMatrix:
    """A full-information table as arrays (rows = records, columns = models)."""

    ids: list[str]
    texts: list[str]
    models: list[str]
    scores: np.ndarray  # (n, M)
    costs: np.ndarray  # (n, M) USD

    @classmethod
    def from_records(
        cls, records: Sequence[OutcomeRecord], models: Sequence[str] | None = None
    ) -> OutcomeMatrix:
        names = list(models) if models is not None else table_models(records)
        if not names:
            raise RoutingError("the table has no model with an outcome on every record")
        scores = np.empty((len(records), len(names)))
        costs = np.empty((len(records), len(names)))
        for i, r in enumerate(records):
            for j, m in enumerate(names):
                scores[i, j] = _outcome(r, m).score
                costs[i, j] = _outcome_cost(r, m)
        return cls([r.id for r in records], [r.text for r in records], names, scores, costs)
