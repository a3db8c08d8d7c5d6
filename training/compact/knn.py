"""Building a kNN checkpoint: the training prompts and their outcomes, k picked on
validation.

``xrouter train --knn 25,50,100,200,400`` stores the training part of a full-information
table — each prompt's static embedding, each model's score and normalized cost (under the
run's reward normalization) — and keeps the number of neighbours with the best mean greedy
validation reward over the validation cost weights, the same criterion that picks the
policy network's best step. The checkpoint is an ordinary compact checkpoint of kind
``knn``: served, evaluated, deployed and hot-reloaded like the network
(``router.policies.knn``). No policy-gradient steps: a few seconds.

From logged traffic (``--offpolicy --knn ...``), where each prompt has only the chosen
model's outcome, it stores the logged prompts with doubly-robust estimates of every model's
score and cost on each (a reward model fitted to the logged outcomes, corrected by the
importance-weighted residual on the logged action: ``training.compact.offpolicy``), and
picks k on the validation part's off-policy estimate (SNIPS, or DR with ``--estimator
dr``). Averaging over k neighbours is what tames the per-prompt variance of those
estimates.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from router.checkpoint import Architecture
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.policies.knn import KNNHead
from training.compact.config import TrainConfig
from training.compact.data import standardization
from training.compact.offpolicy import (
    doubly_robust_outcomes,
    evaluate_logged,
    fit_reward_model,
)
from training.compact.run import TrainResult, evaluate_full
from training.compact.stored import (
    Metrics,
    finish_build,
    normalized_costs,
    pick_neighbours,
    start_build,
)

DEFAULT_NEIGHBOURS = (25, 50, 100, 200, 400)


def build_knn(
    records: Sequence[OutcomeRecord],
    cfg: TrainConfig,
    run_dir: str | Path,
    neighbours: Sequence[int] = DEFAULT_NEIGHBOURS,
    *,
    pool: Sequence[str] | None = None,
    prices_path: str | Path | None = None,
    extractor: FeatureExtractor | None = None,
    cache_dir: str | Path | None = None,
    command: str = "",
    name: str = "",
    description: str = "",
    table_path: str | Path | None = None,
) -> TrainResult:
    build = start_build(
        "knn",
        records,
        cfg,
        run_dir,
        neighbours,
        pool=pool,
        prices_path=prices_path,
        extractor=extractor,
        cache_dir=cache_dir,
    )
    table, rows, cfg = build.table, build.train_rows, build.cfg
    reward_model = None
    if cfg.offpolicy:
        mean, std = standardization(build.x[rows])
        reward_model = fit_reward_model(
            build.x, table.arrays, rows, mean, std, steps=cfg.reward_model_steps, seed=cfg.seed
        )
        scores, costs = doubly_robust_outcomes(
            reward_model, build.x, table.arrays, rows, cfg.ips_clip
        )
    else:
        scores, costs = table.arrays.score[rows], table.arrays.cost[rows]
    weights = {
        "examples": build.examples(),
        "scores": scores.astype(np.float32),
        "normalized_costs": normalized_costs(costs, cfg, table.reference_of(rows)).astype(
            np.float32
        ),
    }
    reward_cfg = cfg.reward_config()
    # Off-policy estimates on logged parts: DR with the same reward model, as the network's
    # trainer does with --estimator dr, else SNIPS.
    estimate_with = reward_model if cfg.estimator == "dr" else None

    def evaluate(arch: Architecture, part_rows: np.ndarray) -> Metrics:
        head = KNNHead(arch, weights, reward_cfg)
        part, ref, x = (
            table.arrays.subset(part_rows),
            table.reference_of(part_rows),
            build.x[part_rows],
        )
        if part.available.all():
            return evaluate_full(head, x, part, build.val_lambdas, reward_cfg, ref)
        return evaluate_logged(
            head, x, part, build.val_lambdas, reward_cfg, cfg.ips_clip, estimate_with
        )

    arch, val_metrics, tried = pick_neighbours(build, neighbours, build.architecture, evaluate)
    return finish_build(
        build,
        arch,
        val_metrics,
        tried,
        weights,
        evaluate=evaluate,
        # What the stored outcome tables are: recorded, or estimated from logged traffic.
        training_extra={"stored_outcomes": "doubly_robust" if cfg.offpolicy else "recorded"},
        name=name,
        description=description,
        command=command,
        table_path=table_path,
    )
