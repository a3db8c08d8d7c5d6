"""Building a cascade checkpoint: multi-call plans measured on the recorded responses, the
plan picked per prompt by its neighbours, the number of neighbours picked on validation.

``xrouter train --cascade 100,200,400`` enumerates the plans of the evaluation's cascade
family on the training part (every single model; every set of two to ``max_cheap`` of the
most accurate cheaper models, called cheapest first, two together in the first round,
accepted when two answers agree, with or without the most accurate model as the last
escalation; each cheap model called together with that model, the cheap answer kept when
the two agree), replays each plan on every training
prompt's recorded responses (``router.plans``: the code the gateway runs them with) and
stores each plan's score and normalized cost there, next to the prompts' static embeddings.
It keeps the number of neighbours with the best mean validation reward over the validation
cost weights, the criterion that picks the policy network's best step and the kNN
checkpoint's k. The result is an ordinary compact checkpoint of kind ``cascade``: served
(``router.policies.planned``), evaluated through the loop, deployed and hot-reloaded like
the others. It needs a full-information table with responses.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from router.checkpoint import Architecture, PlanSpec
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.plans import CascadePlan
from router.policies.planned import PlanHead
from router.reward import RewardConfig, expected_reward
from training.compact.config import TrainConfig
from training.compact.run import TrainResult
from training.compact.stored import (
    Metrics,
    finish_build,
    normalized_costs,
    pick_neighbours,
    start_build,
)
from training.evaluation.cascade import CascadeFamilyRouter, CascadeRouter

logger = logging.getLogger(__name__)

DEFAULT_NEIGHBOURS = (50, 100, 200, 400)
DEFAULT_MAX_CHEAP = 4
# The gateway's default ``max_turns``: a plan needs one turn per round.
MAX_ROUNDS = 4


def candidate_plans(
    train: Sequence[OutcomeRecord], max_cheap: int = DEFAULT_MAX_CHEAP
) -> list[CascadePlan]:
    """The evaluation family's plans on ``train`` that fit in ``MAX_ROUNDS`` rounds."""
    family = CascadeFamilyRouter(max_cheap=max_cheap, batch_sizes=(2,), quorums=(2,))
    configs = family.candidates(train)
    return [c.plan for c in configs if c.plan.rounds <= MAX_ROUNDS]


def plan_outcomes(
    plans: Sequence[CascadePlan], records: Sequence[OutcomeRecord]
) -> tuple[np.ndarray, np.ndarray]:
    """Every plan's score and cost (USD) on every record, replayed on the recorded
    responses: two ``(n_records, n_plans)`` arrays."""
    scores = np.empty((len(records), len(plans)))
    costs = np.empty((len(records), len(plans)))
    for j, plan in enumerate(plans):
        router = CascadeRouter(plan.order, plan.k, plan.quorum)
        for i, r in enumerate(records):
            routed = router.trajectory(r)
            scores[i, j], costs[i, j] = routed.score, routed.cost_usd
    return scores, costs


def _greedy_metrics(
    head: PlanHead,
    x: np.ndarray,
    scores: np.ndarray,
    costs: np.ndarray,
    norm_costs: np.ndarray,
    lambdas: Sequence[float],
    reward: RewardConfig,
) -> Metrics:
    """Greedy reward, score and cost of the served decision per λ (the plan each
    prompt would run, scored on that prompt's own replayed outcome)."""
    rows = np.arange(x.shape[0])
    out: Metrics = {}
    for lam in lambdas:
        choice = head.rewards(x, float(lam)).argmax(axis=1)
        r = expected_reward(scores[rows, choice], norm_costs[rows, choice], float(lam), reward)
        top = Counter(head.plans[i].name for i in choice).most_common(5)
        out[f"{lam:g}"] = {
            "reward": float(np.mean(r)),
            "score": float(scores[rows, choice].mean()),
            "cost_usd": float(costs[rows, choice].mean()),
            "plans": {name: round(n / len(rows), 4) for name, n in top},
        }
    return out


def build_cascade(
    records: Sequence[OutcomeRecord],
    cfg: TrainConfig,
    run_dir: str | Path,
    neighbours: Sequence[int] = DEFAULT_NEIGHBOURS,
    *,
    max_cheap: int = DEFAULT_MAX_CHEAP,
    pool: Sequence[str] | None = None,
    prices_path: str | Path | None = None,
    extractor: FeatureExtractor | None = None,
    cache_dir: str | Path | None = None,
    command: str = "",
    name: str = "",
    description: str = "",
    table_path: str | Path | None = None,
) -> TrainResult:
    if max_cheap < 1:
        raise ValueError(f"max_cheap must be at least 1, got {max_cheap}")
    build = start_build(
        "cascade",
        records,
        cfg,
        run_dir,
        neighbours,
        pool=pool,
        prices_path=prices_path,
        extractor=extractor,
        cache_dir=cache_dir,
    )
    table, models = build.table, build.table.models
    # Plans replay only the pool's models.
    kept = [
        r.model_copy(update={"outcomes": {m: r.outcomes[m] for m in models if m in r.outcomes}})
        for r in table.records
    ]
    missing = sum(1 for r in kept for o in r.outcomes.values() if o.response is None)
    if missing:
        raise ValueError(
            f"{missing} outcomes have no recorded response: a cascade checkpoint replays the "
            "responses to see whether cheap answers agree"
        )
    train_records = [kept[i] for i in build.train_rows]
    plans = candidate_plans(train_records, max_cheap)
    logger.info("%d plans over %d models", len(plans), len(models))
    train_scores, train_costs = plan_outcomes(plans, train_records)
    weights = {
        "examples": build.examples(),
        "plan_scores": train_scores.astype(np.float32),
        "plan_normalized_costs": normalized_costs(
            train_costs, build.cfg, table.reference_of(build.train_rows)
        ).astype(np.float32),
    }
    specs = tuple(PlanSpec(order=p.order, k=p.k, quorum=p.quorum) for p in plans)
    reward_cfg = build.cfg.reward_config()
    # Each part's plans are replayed once, not once per k tried.
    replayed: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def evaluate(arch: Architecture, part_rows: np.ndarray) -> Metrics:
        key = part_rows.tobytes()
        if key not in replayed:
            scores, costs = plan_outcomes(plans, [kept[i] for i in part_rows])
            replayed[key] = (
                scores,
                costs,
                normalized_costs(costs, build.cfg, table.reference_of(part_rows)),
            )
        scores, costs, norm = replayed[key]
        head = PlanHead(arch, weights, reward_cfg)
        return _greedy_metrics(
            head, build.x[part_rows], scores, costs, norm, build.val_lambdas, reward_cfg
        )

    arch, val_metrics, tried = pick_neighbours(
        build, neighbours, lambda k: build.architecture(k, plans=specs), evaluate
    )
    return finish_build(
        build,
        arch,
        val_metrics,
        tried,
        weights,
        evaluate=evaluate,
        training_extra={"max_cheap": max_cheap},
        metrics_extra={"plans": len(plans)},
        name=name,
        description=description,
        command=command,
        table_path=table_path,
    )
