"""Building a kNN checkpoint: the training prompts and their outcomes, k picked on
validation.

``xrouter train --knn 25,50,100,200,400`` stores the training part of a full-information
table — each prompt's static embedding, each model's score and normalized cost (under the
run's reward normalization) — and keeps the number of neighbours with the best mean greedy
validation reward over the validation cost weights, the same criterion that picks the
policy network's best step. The checkpoint is an ordinary compact checkpoint of kind
``knn``: served, evaluated, deployed and hot-reloaded like the network
(``router.policies.knn``). No gradient steps, so no torch work and a few seconds.
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
from training.compact.stored import (
    Metrics,
    finish_build,
    normalized_costs,
    pick_neighbours,
    start_build,
)
from training.compact.trainer import TrainResult, evaluate_full

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
    table, rows = build.table, build.train_rows
    weights = {
        "examples": build.examples(),
        "scores": table.arrays.score[rows].astype(np.float32),
        "normalized_costs": normalized_costs(
            table.arrays.cost[rows], build.cfg, table.reference_of(rows)
        ).astype(np.float32),
    }
    reward_cfg = build.cfg.reward_config()

    def evaluate(arch: Architecture, rows: np.ndarray) -> Metrics:
        head = KNNHead(arch, weights, reward_cfg)
        part, ref = table.arrays.subset(rows), table.reference_of(rows)
        return evaluate_full(head, build.x[rows], part, build.val_lambdas, reward_cfg, ref)

    arch, val_metrics, tried = pick_neighbours(build, neighbours, build.architecture, evaluate)
    return finish_build(
        build,
        arch,
        val_metrics,
        tried,
        weights,
        evaluate=evaluate,
        name=name,
        description=description,
        command=command,
        table_path=table_path,
    )
