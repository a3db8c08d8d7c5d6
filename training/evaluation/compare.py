"""Run several routers over one table and compute the comparison metrics.

Full-information tables (every model's outcome on every prompt) are evaluated directly: each
router is swept, and its curve is summarized by AIQ over the single-model cost range, its best
score, the cost at which its hull first matches the best single model's score, and, on
two-model tables, APGR and CPT. Logged tables (one outcome per prompt) are evaluated
off-policy (``off_policy``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from router.outcomes import OutcomeRecord
from training.evaluation import metrics
from training.evaluation.baselines import SingleModelRouter
from training.evaluation.bootstrap import (
    AIQIntervals,
    APGRIntervals,
    Interval,
    PromptCurve,
    aiq_intervals,
    apgr_intervals,
)
from training.evaluation.metrics import CurvePoint
from training.evaluation.ope import (
    OPEError,
    all_estimates,
    cost_reward,
    deterministic_probs,
    logged_bandit,
    logged_mean,
    score_reward,
)
from training.evaluation.sweep import (
    OfflineRouter,
    RoutedPrompt,
    RoutingError,
    SweepResult,
    sweep,
    table_models,
)

logger = logging.getLogger(__name__)

CPT_LEVELS = (0.5, 0.8)


@dataclass(frozen=True, slots=True)
class Entry:
    """A router to compare, its kind (``single``, ``baseline``, ``policy``) and the cost
    weights to sweep (None: the router's own default)."""

    router: OfflineRouter
    kind: str = "baseline"
    params: Sequence[float] | None = None


@dataclass(slots=True)
class RouterCurve:
    name: str
    kind: str
    points: list[CurvePoint]
    hull: list[CurvePoint]
    aiq: float
    max_score: float
    min_cost: float
    cost_to_best: float | None
    cost_to_best_pct: float | None
    apgr: float | None = None
    cpt: dict[str, float | None] = field(default_factory=dict)
    # Paired-bootstrap intervals (``compare(bootstrap=N)``): AIQ, AIQ minus no routing, and
    # this router's AIQ minus the reference router's.
    aiq_ci: Interval | None = None
    gain_ci: Interval | None = None
    vs_reference_ci: Interval | None = None
    apgr_ci: Interval | None = None
    apgr_vs_reference_ci: Interval | None = None

    def to_dict(self) -> dict[str, Any]:
        intervals = {
            k: v.to_dict()
            for k, v in (
                ("aiq", self.aiq_ci),
                ("aiq_minus_no_routing", self.gain_ci),
                ("aiq_minus_reference", self.vs_reference_ci),
                ("apgr", self.apgr_ci),
                ("apgr_minus_reference", self.apgr_vs_reference_ci),
            )
            if v is not None
        }
        return {
            "name": self.name,
            "kind": self.kind,
            "aiq": self.aiq,
            "max_score": self.max_score,
            "min_cost_usd": self.min_cost,
            "cost_to_best_usd": self.cost_to_best,
            "cost_to_best_pct": self.cost_to_best_pct,
            "apgr": self.apgr,
            "cpt": self.cpt,
            "intervals": intervals,
            "points": [p.to_dict() for p in self.points],
            "hull": [p.to_dict() for p in self.hull],
        }


@dataclass(slots=True)
class Comparison:
    n_records: int
    models: list[str]
    cost_range: tuple[float, float]
    best_model: str
    best_score: float
    best_cost: float
    no_routing_aiq: float
    curves: list[RouterCurve]
    strong: str | None = None
    weak: str | None = None
    notes: list[str] = field(default_factory=list)
    bootstrap: AIQIntervals | None = None
    apgr_bootstrap: APGRIntervals | None = None

    def curve(self, name: str) -> RouterCurve:
        for c in self.curves:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_records": self.n_records,
            "models": self.models,
            "aiq_cost_range_usd": list(self.cost_range),
            "best_single_model": {
                "name": self.best_model,
                "score": self.best_score,
                "cost_usd": self.best_cost,
            },
            "no_routing_aiq": self.no_routing_aiq,
            "pgr_pair": {"strong": self.strong, "weak": self.weak} if self.strong else None,
            "routers": [c.to_dict() for c in self.curves],
            "bootstrap": None
            if self.bootstrap is None
            else {
                "samples": self.bootstrap.samples,
                "level": self.bootstrap.level,
                "reference": self.bootstrap.reference,
                "no_routing_aiq": self.bootstrap.no_routing.to_dict(),
            },
            "notes": self.notes,
        }


def _summarize(
    name: str,
    kind: str,
    points: list[CurvePoint],
    cost_range: tuple[float, float],
    best: CurvePoint,
) -> RouterCurve:
    reach = metrics.cost_to_reach(points, best.score)
    return RouterCurve(
        name=name,
        kind=kind,
        points=points,
        hull=metrics.frontier(points),
        aiq=metrics.aiq(points, *cost_range),
        max_score=max(p.score for p in points),
        min_cost=min(p.cost for p in points),
        cost_to_best=reach,
        cost_to_best_pct=None if reach is None or best.cost <= 0 else 100.0 * reach / best.cost,
    )


def _add_pgr(curve: RouterCurve, strong: str, q_weak: float, q_strong: float) -> None:
    pairs = [(p.calls.get(strong, 0.0), p.score) for p in curve.points]
    curve.apgr = metrics.apgr(pairs, q_weak, q_strong)
    curve.cpt = {f"{int(x * 100)}": metrics.cpt(pairs, q_weak, q_strong, x) for x in CPT_LEVELS}


def compare(
    entries: Sequence[Entry],
    records: Sequence[OutcomeRecord],
    strong: str | None = None,
    weak: str | None = None,
    bootstrap: int = 0,
    bootstrap_seed: int = 0,
    reference: str | None = None,
) -> Comparison:
    """Every single model plus ``entries`` on ``records`` (a full-information table). On a
    two-model table, PGR metrics are added (strong = ``strong`` or the more accurate one).
    With ``bootstrap`` > 0, each router's AIQ gets a paired-bootstrap interval over the
    prompts, as do its gain over no routing and its difference from the ``reference``
    router (by name; default: the first entry of kind ``policy``)."""
    models = table_models(records)
    if not models:
        raise RoutingError("the table has no model with an outcome on every record")
    single_sweeps = {m: sweep(SingleModelRouter(m), records, [0.0]) for m in models}
    singles = {m: s.points[0] for m, s in single_sweeps.items()}
    cost_range = metrics.single_model_range(singles.values())
    best_name, best = metrics.best_single(singles)
    curves = [
        _summarize(f"single:{m}", "single", [p], cost_range, best) for m, p in singles.items()
    ]
    notes: list[str] = []
    swept: dict[str, SweepResult] = {}
    for entry in entries:
        try:
            result = sweep(entry.router, records, entry.params)
        except RoutingError as exc:
            notes.append(f"{entry.router.name}: not evaluated ({exc})")
            logger.warning("%s: not evaluated: %s", entry.router.name, exc)
            continue
        curves.append(_summarize(result.name, entry.kind, result.points, cost_range, best))
        swept[result.name] = result
        for note in getattr(entry.router, "notes", ()):  # e.g. router-model failures
            notes.append(note)
            logger.warning("%s", note)
    comparison = Comparison(
        n_records=len(records),
        models=models,
        cost_range=cost_range,
        best_model=best_name,
        best_score=best.score,
        best_cost=best.cost,
        no_routing_aiq=metrics.aiq(singles.values(), *cost_range),
        curves=curves,
        notes=notes,
    )
    if bootstrap > 0:
        per_prompt = {k: PromptCurve.from_results(r.prompts) for k, r in swept.items()}
        _add_intervals(comparison, per_prompt, single_sweeps, bootstrap, bootstrap_seed, reference)
    if len(models) == 2:
        strong = strong or best_name
        weak = weak or next(m for m in models if m != strong)
        if {strong, weak} != set(models):
            raise RoutingError(
                f"strong/weak {strong!r}/{weak!r} are not the table's models {models}"
            )
        q_strong, q_weak = singles[strong].score, singles[weak].score
        if not metrics.has_gap(q_weak, q_strong):
            notes.append(
                f"no PGR metrics: {strong} does not score above {weak} ({q_strong:.4f} <= {q_weak:.4f})"
            )
        else:
            comparison.strong, comparison.weak = strong, weak
            # A single model is one end point of the PGR axis, not a curve.
            for c in curves:
                if c.kind != "single":
                    _add_pgr(c, strong, q_weak, q_strong)
            if bootstrap > 0:
                _add_pgr_intervals(
                    comparison, swept, single_sweeps, bootstrap, bootstrap_seed, reference
                )
    return comparison


def _reference(comparison: Comparison, reference: str | None) -> str | None:
    """The router others are compared with: the named one, else the first policy."""
    if reference is not None:
        return reference
    return next((c.name for c in comparison.curves if c.kind == "policy"), None)


def _add_intervals(
    comparison: Comparison,
    per_prompt: dict[str, PromptCurve],
    single_sweeps: dict[str, SweepResult],
    samples: int,
    seed: int,
    reference: str | None,
) -> None:
    singles = {f"single:{m}": PromptCurve.from_results(s.prompts) for m, s in single_sweeps.items()}
    curves = {**singles, **per_prompt}
    reference = _reference(comparison, reference)
    if reference is not None and reference not in curves:
        raise RoutingError(f"reference router {reference!r} was not evaluated")
    ivs = aiq_intervals(curves, singles, samples, seed, reference=reference)
    comparison.bootstrap = ivs
    for c in comparison.curves:
        c.aiq_ci = ivs.aiq.get(c.name)
        c.gain_ci = ivs.gain.get(c.name)
        c.vs_reference_ci = ivs.vs_reference.get(c.name)


def _add_pgr_intervals(
    comparison: Comparison,
    swept: dict[str, SweepResult],
    single_sweeps: dict[str, SweepResult],
    samples: int,
    seed: int,
    reference: str | None,
) -> None:
    """APGR intervals on the same resamples as the AIQ intervals (same seed)."""
    strong, weak = comparison.strong, comparison.weak
    assert strong is not None and weak is not None
    curves = {k: PromptCurve.from_results(r.prompts, strong) for k, r in swept.items()}
    reference = _reference(comparison, reference)
    ivs = apgr_intervals(
        curves,
        PromptCurve.from_results(single_sweeps[strong].prompts),
        PromptCurve.from_results(single_sweeps[weak].prompts),
        samples,
        seed,
        reference=reference if reference in curves else None,
    )
    comparison.apgr_bootstrap = ivs
    if ivs.dropped:
        comparison.notes.append(
            f"APGR intervals: {ivs.dropped} of {samples} resamples left out ({strong} did not "
            f"score above {weak} on them)"
        )
    for c in comparison.curves:
        c.apgr_ci = ivs.apgr.get(c.name)
        c.apgr_vs_reference_ci = ivs.vs_reference.get(c.name)


@dataclass(frozen=True, slots=True)
class OffPolicyRow:
    router: str
    param: float | None  # the cost weight; None: each record's logged one
    estimates: dict[str, dict[str, Any]]  # quantity ("score", "cost_usd") -> estimator -> Estimate
    # Records where the router's choice had logging probability 0 (no data for it).
    unsupported: int = 0
    # The importance weights' mean and its standard error: 1 in expectation when the logged
    # propensities are right and the router has support everywhere (less without it).
    mean_weight: float = 1.0
    mean_weight_stderr: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "router": self.router,
            "param": self.param,
            "estimates": self.estimates,
            "unsupported": self.unsupported,
            "mean_weight": self.mean_weight,
            "mean_weight_stderr": self.mean_weight_stderr,
        }


def _first_choices(entry: Entry, records: Sequence[OutcomeRecord], lam: float | None) -> list[str]:
    """The one model ``entry`` picks per record at ``lam`` (None: at each record's logged
    cost weight, routing each group of equal weights together)."""
    if lam is None:
        groups: dict[float, list[int]] = {}
        for i, r in enumerate(records):
            assert r.logged is not None and r.logged.cost_weight is not None
            groups.setdefault(float(r.logged.cost_weight), []).append(i)
        out = [""] * len(records)
        for weight, idx in groups.items():
            for i, choice in zip(
                idx, _first_choices(entry, [records[i] for i in idx], weight), strict=True
            ):
                out[i] = choice
        return out
    choices = []
    for route in entry.router.route(records, lam):
        if isinstance(route, RoutedPrompt):
            if len(route.models_called) != 1:
                raise OPEError("multi-call trajectories cannot be evaluated off-policy")
            choices.append(route.final_model)
        elif isinstance(route, str):
            choices.append(route)
        else:
            if len(route) != 1:
                raise OPEError("multi-call trajectories cannot be evaluated off-policy")
            choices.append(route[0])
    return choices


def off_policy(
    entries: Sequence[Entry],
    records: Sequence[OutcomeRecord],
    params: Sequence[float] = (0.0,),
    max_weight: float = 10.0,
    models: Sequence[str] = (),
) -> tuple[list[OffPolicyRow], list[str]]:
    """Off-policy estimates of each router's mean score and mean cost on logged records,
    for routers that pick one model per prompt (a multi-call trajectory cannot be evaluated
    from single-action logs). ``models``: the actions a router may choose beyond those
    logged in ``records`` (the whole table's, of which ``records`` is a part): a choice of
    one that no record here logged has no support — IPS counts it 0, SNIPS leaves it out,
    DR relies on its reward model — rather than leaving the router without an estimate."""
    logged = [r for r in records if r.logged is not None]
    notes: list[str] = []
    if not logged:
        raise OPEError("no record has `logged`: cannot evaluate off-policy")
    multi = sum(1 for r in logged if r.logged is not None and r.logged.multi_call)
    if multi:
        notes.append(
            f"{multi} of {len(logged)} logged records are multi-call trajectories (several "
            "models called for one request, as a cascade's plan) and were skipped: their "
            "outcome is no single model's"
        )
    # The estimators' rows: the single-call records, in order (routed below, too).
    logged = [r for r in logged if r.logged is not None and not r.logged.multi_call]
    logged_models = sorted({r.logged.action for r in logged if r.logged is not None})
    actions = [*logged_models, *sorted(set(models) - set(logged_models))]
    by_quantity = {
        "score": logged_bandit(logged, actions, reward=score_reward),
        "cost_usd": logged_bandit(logged, actions, reward=cost_reward, bounds=(0.0, math.inf)),
    }
    bandit = by_quantity["score"]
    # A record logged with propensity 1 (a request that named its model, or a greedy
    # router) gave every other model probability 0: a target choosing another model there
    # has no data, so IPS counts it as 0, SNIPS leaves it out and DR relies on its reward
    # model alone.
    deterministic = bandit.propensities >= 1.0 - 1e-9
    singles = [Entry(SingleModelRouter(m), "single", [0.0]) for m in logged_models]
    named = {e.router.name for e in singles}
    rows: list[OffPolicyRow] = []
    unlogged: dict[str, int] = {}  # router -> most prompts it sends to an unlogged model
    # Each router at each swept λ (a `--policy single:MODEL` is already among the single-
    # model rows); a --policy also at the cost weights the logged requests asked for (what
    # it would have done with this traffic), when they carry them.
    as_logged = all(r.logged is not None and r.logged.cost_weight is not None for r in logged)
    for entry in [*singles, *(e for e in entries if e.router.name not in named)]:
        grid: list[float | None] = list(entry.params if entry.params is not None else params)
        if as_logged and entry.kind == "policy":
            grid.append(None)
        for lam in grid:
            try:
                target = deterministic_probs(_first_choices(entry, logged, lam), actions)
            except (OPEError, RoutingError) as exc:
                notes.append(f"{entry.router.name}: no off-policy estimate ({exc})")
                break
            estimates = {
                q: {
                    k: e.to_dict()
                    for k, e in all_estimates(d, target, max_weight=max_weight).items()
                }
                for q, d in by_quantity.items()
            }
            taken = target[np.arange(len(bandit)), bandit.actions]
            unsupported = int((deterministic & ~(taken > 0)).sum())
            weights = taken / bandit.propensities
            spread = (
                float(weights.std(ddof=1) / math.sqrt(len(weights))) if len(weights) > 1 else 0.0
            )
            rows.append(
                OffPolicyRow(
                    entry.router.name, lam, estimates, unsupported, float(weights.mean()), spread
                )
            )
            never = int(target[:, len(logged_models) :].sum())
            if never:
                unlogged[entry.router.name] = max(unlogged.get(entry.router.name, 0), never)
    if unlogged:
        notes.append(
            _support_note(
                len(bandit),
                unlogged,
                "a model no record here logged",
                "there (the mean logged reward). Evaluate on more traffic, or log with "
                "exploration (router.epsilon)",
            )
        )
    worst: dict[str, int] = {}
    for row in rows:
        if row.unsupported:
            worst[row.router] = max(worst.get(row.router, 0), row.unsupported)
    if worst:
        notes.append(
            _support_note(
                len(bandit),
                worst,
                "a model the logging policy could not have taken there",
                "there. Log with exploration (router.epsilon) for unbiased estimates",
                why="logged with propensity 1 for another model: a request that named its "
                "model, or a greedy router",
            )
        )
    heavy = _heavy_weights(rows)
    if heavy:
        notes.append(heavy)
    return rows, notes


# A mean importance weight this many standard errors above 1, and at least this far above
# it, is not chance: the propensities are wrong (see _heavy_weights).
_HEAVY_SES = 3.0
_HEAVY_EXCESS = 0.05


def _heavy_weights(rows: Sequence[OffPolicyRow]) -> str | None:
    """The note on routers whose importance weights average clearly above 1. Their mean is
    1 in expectation when every logged propensity is the probability the logging policy
    really gave its choice (less where a router has no support), whatever the router: one
    well above 1 says the propensities understate those probabilities — recorded by another
    policy than the one that chose, or rounded down — and IPS reads high by about that
    factor, which SNIPS divides out (IPS above SNIPS is the same sign)."""
    worst: dict[str, OffPolicyRow] = {}
    for row in rows:
        excess = row.mean_weight - 1.0
        if excess > _HEAVY_EXCESS and excess > _HEAVY_SES * row.mean_weight_stderr:
            if row.router not in worst or row.mean_weight > worst[row.router].mean_weight:
                worst[row.router] = row
    if not worst:
        return None
    listed = ", ".join(
        f"{name} {row.mean_weight:.2f} ± {row.mean_weight_stderr:.2f}"
        for name, row in worst.items()
    )
    return (
        f"off-policy propensities: the importance weights average well above 1 (at most: "
        f"{listed}), where they average 1 when the logged propensities are the probabilities "
        "the logging policy gave its choices: these propensities understate them (logged by "
        "another policy than the one that chose, or rounded down). IPS and clipped IPS read "
        "high by about that factor; SNIPS divides it out, and DR's correction term is "
        "inflated alike"
    )


def logging_baseline(records: Sequence[OutcomeRecord]) -> dict[str, Any]:
    """What the logging policy achieved on the single-call logged ``records`` that
    ``off_policy`` estimates on: the mean logged score and cost, with intervals
    (``logged_mean``) — the baseline a router's estimates must beat."""
    logged = [r for r in records if r.logged is not None and not r.logged.multi_call]
    score = logged_mean(logged_bandit(logged, reward=score_reward))
    cost = logged_mean(logged_bandit(logged, reward=cost_reward, bounds=(0.0, math.inf)))
    return {"n": score.n, "score": score.to_dict(), "cost_usd": cost.to_dict()}


def _support_note(n: int, counts: dict[str, int], what: str, dr: str, why: str = "") -> str:
    """The note on records where routers choose ``what``: the most per router (``counts``),
    and what each estimator makes of them."""
    listed = ", ".join(f"{name} {k}" for name, k in counts.items())
    return (
        f"off-policy support: on some of the {n} logged records these routers choose {what} "
        f"(at most: {listed}{'; ' + why if why else ''}): IPS counts those records as 0 and "
        f"SNIPS leaves them out, so both estimates are biased; DR rests on its reward model {dr}"
    )
