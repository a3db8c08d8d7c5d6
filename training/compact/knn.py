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

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from router.checkpoint import Architecture, CheckpointMetadata, save_checkpoint
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.policies.knn import KNNHead
from router.reward import normalized_cost
from training.compact.config import TrainConfig
from training.compact.data import cached_features
from training.compact.trainer import (
    TrainResult,
    evaluate_full,
    mean_reward,
    prepare_table,
    run_metadata,
    write_config,
    write_summary,
)

logger = logging.getLogger(__name__)

DEFAULT_NEIGHBOURS = (25, 50, 100, 200, 400)


def normalized_costs(
    cost: np.ndarray, cfg: TrainConfig, reference: np.ndarray | None
) -> np.ndarray:
    """Every (prompt, model) cost under the run's reward normalization."""
    reward_cfg = cfg.reward_config()
    out = np.empty_like(cost, dtype=np.float64)
    for i in range(cost.shape[0]):
        ref = None if reference is None else float(reference[i])
        for j in range(cost.shape[1]):
            out[i, j] = normalized_cost(float(cost[i, j]), reward_cfg, ref)
    return out


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
    started = time.perf_counter()
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.offpolicy:
        raise ValueError("a kNN checkpoint needs a full-information table (not --offpolicy)")
    if not neighbours or any(k < 1 for k in neighbours):
        raise ValueError(f"neighbour counts must be positive, got {list(neighbours)}")
    table = prepare_table(records, cfg, pool, prices_path)
    cfg, models, arrays = table.cfg, table.models, table.arrays
    train_rows, val_rows = table.splits["train"], table.splits["validation"]
    if not arrays.available[train_rows].all():
        raise ValueError("the training part has unknown outcomes: a kNN checkpoint needs them all")
    val_lambdas = cfg.val_lambdas or (0.0,)
    reward_cfg = cfg.reward_config()

    extractor = extractor or FeatureExtractor.load()
    x = cached_features(
        arrays.conversations, extractor, Path(cache_dir) if cache_dir else out / "cache"
    )
    dims = extractor.embedding.dim if extractor.embedding is not None else extractor.dim
    weights = {
        "examples": x[train_rows, :dims].astype(np.float32),
        "scores": arrays.score[train_rows].astype(np.float32),
        "normalized_costs": normalized_costs(
            arrays.cost[train_rows], cfg, table.reference_of(train_rows)
        ).astype(np.float32),
    }
    val = arrays.subset(val_rows)
    val_ref = table.reference_of(val_rows)
    tried: dict[int, float] = {}
    best: tuple[float, int, Architecture, dict[str, dict[str, Any]]] | None = None
    for k in sorted({min(k, len(train_rows)) for k in neighbours}):
        arch = Architecture(
            kind="knn",
            input_dim=extractor.dim,
            hidden=(),
            n_actions=len(models),
            neighbours=k,
            n_examples=len(train_rows),
            similarity_dims=dims,
        )
        metrics = evaluate_full(
            KNNHead(arch, weights, reward_cfg), x[val_rows], val, val_lambdas, reward_cfg, val_ref
        )
        tried[k] = mean_reward(metrics)
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
        mode="knn",
        name=name,
        description=description,
        command=command,
        table_path=table_path,
    )
    training_meta["neighbours_tried"] = {str(n): v for n, v in tried.items()}
    write_config(out, training_meta, models, extractor)
    metrics_out: dict[str, Any] = {
        "selected_by": f"mean greedy validation reward at λ in {list(val_lambdas)}",
        "neighbours": k,
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
    logger.info("kNN checkpoint with k=%d (validation reward %.4f): %s", k, score, ckpt_path)
    return TrainResult(out, ckpt_path, 0, 0, seconds, val_metrics, {}, None, models, k)
