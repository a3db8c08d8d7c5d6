"""Building a cascade checkpoint: multi-call plans measured on the recorded responses, the
plan picked per prompt by its neighbours, the number of neighbours picked on validation.

``xrouter train --cascade 100,200,400`` enumerates the plans of the evaluation's cascade
family on the training part (every single model; every set of two to ``max_cheap`` of the
most accurate cheaper models, called cheapest first, two together in the first round,
accepted when two answers agree, with or without the most accurate model as the last
escalation; each cheap model followed by that model), replays each plan on every training
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
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from router.checkpoint import Architecture, CheckpointMetadata, PlanSpec, save_checkpoint
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.plans import CascadePlan
from router.policies.planned import PlanHead
from router.reward import RewardConfig, expected_reward
from training.compact.config import TrainConfig
from training.compact.data import cached_features
from training.compact.knn import normalized_costs
from training.compact.trainer import (
    TrainResult,
    prepare_table,
    run_metadata,
    write_config,
    write_summary,
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


def _validation_metrics(
    head: PlanHead,
    x: np.ndarray,
    scores: np.ndarray,
    costs: np.ndarray,
    norm_costs: np.ndarray,
    lambdas: Sequence[float],
    reward: RewardConfig,
) -> dict[str, dict[str, Any]]:
    """Greedy reward, score and cost of the served decision per λ (the plan each validation
    prompt would run, scored on that prompt's own replayed outcome)."""
    rows = np.arange(x.shape[0])
    out: dict[str, dict[str, Any]] = {}
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
    started = time.perf_counter()
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.offpolicy:
        raise ValueError("a cascade checkpoint needs a full-information table (not --offpolicy)")
    if not neighbours or any(k < 1 for k in neighbours):
        raise ValueError(f"neighbour counts must be positive, got {list(neighbours)}")
    if max_cheap < 1:
        raise ValueError(f"max_cheap must be at least 1, got {max_cheap}")
    table = prepare_table(records, cfg, pool, prices_path)
    cfg, models, arrays = table.cfg, table.models, table.arrays
    train_rows, val_rows = table.splits["train"], table.splits["validation"]
    if not arrays.available[train_rows].all():
        raise ValueError(
            "the training part has unknown outcomes: a cascade checkpoint needs them all"
        )
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
    train_records = [kept[i] for i in train_rows]
    val_records = [kept[i] for i in val_rows]
    plans = candidate_plans(train_records, max_cheap)
    logger.info("%d plans over %d models", len(plans), len(models))
    val_lambdas = cfg.val_lambdas or (0.0,)
    reward_cfg = cfg.reward_config()

    extractor = extractor or FeatureExtractor.load()
    x = cached_features(
        arrays.conversations, extractor, Path(cache_dir) if cache_dir else out / "cache"
    )
    dims = extractor.embedding.dim if extractor.embedding is not None else extractor.dim
    train_scores, train_costs = plan_outcomes(plans, train_records)
    weights = {
        "examples": x[train_rows, :dims].astype(np.float32),
        "plan_scores": train_scores.astype(np.float32),
        "plan_normalized_costs": normalized_costs(
            train_costs, cfg, table.reference_of(train_rows)
        ).astype(np.float32),
    }
    val_scores, val_costs = plan_outcomes(plans, val_records)
    val_norm = normalized_costs(val_costs, cfg, table.reference_of(val_rows))
    specs = tuple(PlanSpec(order=p.order, k=p.k, quorum=p.quorum) for p in plans)
    tried: dict[int, float] = {}
    best: tuple[float, int, Architecture, dict[str, dict[str, Any]]] | None = None
    for k in sorted({min(k, len(train_rows)) for k in neighbours}):
        arch = Architecture(
            kind="cascade",
            input_dim=extractor.dim,
            hidden=(),
            n_actions=len(models),
            neighbours=k,
            n_examples=len(train_rows),
            similarity_dims=dims,
            plans=specs,
        )
        metrics = _validation_metrics(
            PlanHead(arch, weights, reward_cfg),
            x[val_rows],
            val_scores,
            val_costs,
            val_norm,
            val_lambdas,
            reward_cfg,
        )
        tried[k] = float(np.mean([m["reward"] for m in metrics.values()]))
        logger.info("k=%d: mean validation reward %.4f", k, tried[k])
        if best is None or tried[k] > best[0]:
            best = (tried[k], k, arch, metrics)
    assert best is not None
    score, k, arch, val_metrics = best
    base_meta, training_meta = run_metadata(
        cfg,
        arch,
        models,
        table.prices,
        extractor,
        table.records,
        table.splits,
        mode="cascade",
        name=name,
        description=description,
        command=command,
        table_path=table_path,
    )
    training_meta["neighbours_tried"] = {str(n): v for n, v in tried.items()}
    training_meta["max_cheap"] = max_cheap
    write_config(out, training_meta, models, extractor)
    metrics_out: dict[str, Any] = {
        "selected_by": f"mean greedy validation reward at λ in {list(val_lambdas)}",
        "neighbours": k,
        "plans": len(plans),
        "validation_mean_reward": score,
        "validation": val_metrics,
    }
    ckpt_path = out / "checkpoint"
    seconds = time.perf_counter() - started
    save_checkpoint(
        ckpt_path,
        CheckpointMetadata(
            **base_meta,
            training={**training_meta, "seconds": round(seconds, 2)},
            metrics=metrics_out,
        ),
        weights,
    )
    write_summary(out, ckpt_path, seconds, metrics_out)
    logger.info(
        "cascade checkpoint with %d plans, k=%d (validation reward %.4f): %s",
        len(plans),
        k,
        score,
        ckpt_path,
    )
    return TrainResult(out, ckpt_path, 0, 0, seconds, val_metrics, {}, None, models, k)
