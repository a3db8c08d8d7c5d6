"""What the checkpoint kinds that store their training prompts share (``knn``, ``cascade``):
the checks and features before, the choice of the number of neighbours on validation, and
the run files after.

Both store the training part's static embeddings next to per-prompt outcomes and answer a
request from its ``k`` most similar stored prompts; ``k`` is the one with the best mean
greedy validation reward over the validation cost weights, the criterion that picks the
policy network's best step. No gradient steps, so no torch work.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from router.checkpoint import Architecture, CheckpointMetadata, save_checkpoint
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.reward import normalized_cost
from training.compact.config import TrainConfig
from training.compact.data import cached_features
from training.compact.run import (
    RunTable,
    TrainResult,
    keep_seen_prompts,
    prepare_table,
    run_metadata,
    seen_hashes,
    write_config,
    write_summary,
)
from training.compact.support import reward_ceiling, validation_support

logger = logging.getLogger(__name__)

Metrics = dict[str, dict[str, Any]]
StoredKind = Literal["knn", "cascade"]
# Greedy metrics per cost weight of an architecture on some rows of the table (validation to
# pick k; test, with ``--report-test``, to report it).
Evaluate = Callable[[Architecture, np.ndarray], Metrics]


def normalized_costs(
    cost: np.ndarray, cfg: TrainConfig, reference: np.ndarray | None
) -> np.ndarray:
    """Every (prompt, option) cost under the run's reward normalization."""
    reward_cfg = cfg.reward_config()
    out = np.empty_like(cost, dtype=np.float64)
    for i in range(cost.shape[0]):
        ref = None if reference is None else float(reference[i])
        for j in range(cost.shape[1]):
            out[i, j] = normalized_cost(float(cost[i, j]), reward_cfg, ref)
    return out


@dataclass(slots=True)
class StoredBuild:
    """A build in progress: the prepared table, its split and every prompt's features."""

    kind: StoredKind
    out: Path
    started: float
    table: RunTable
    train_rows: np.ndarray
    val_rows: np.ndarray
    extractor: FeatureExtractor
    x: np.ndarray
    similarity_dims: int

    @property
    def cfg(self) -> TrainConfig:
        return self.table.cfg

    @property
    def val_lambdas(self) -> tuple[float, ...]:
        return tuple(self.cfg.val_lambdas or (0.0,))

    def examples(self) -> np.ndarray:
        """The training prompts' static embeddings, as stored."""
        return self.x[self.train_rows, : self.similarity_dims].astype(np.float32)

    def architecture(self, k: int, **fields: Any) -> Architecture:
        return Architecture(
            kind=self.kind,
            input_dim=self.extractor.dim,
            hidden=(),
            n_actions=len(self.table.models),
            neighbours=k,
            n_examples=len(self.train_rows),
            similarity_dims=self.similarity_dims,
            **fields,
        )


def start_build(
    kind: StoredKind,
    records: Sequence[OutcomeRecord],
    cfg: TrainConfig,
    run_dir: str | Path,
    neighbours: Sequence[int],
    *,
    pool: Sequence[str] | None = None,
    prices_path: str | Path | None = None,
    extractor: FeatureExtractor | None = None,
    cache_dir: str | Path | None = None,
) -> StoredBuild:
    started = time.perf_counter()
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.offpolicy and kind != "knn":
        raise ValueError(f"a {kind} checkpoint needs a full-information table (not --offpolicy)")
    if not neighbours or any(k < 1 for k in neighbours):
        raise ValueError(f"neighbour counts must be positive, got {list(neighbours)}")
    table = prepare_table(records, cfg, pool, prices_path)
    train_rows, val_rows = table.splits["train"], table.splits["validation"]
    if cfg.offpolicy:
        # Logged traffic: the stored prompts are the logged ones (multi-call requests have
        # no single logged action and are left out, as the network's learner does).
        train_rows = train_rows[table.arrays.logged_action[train_rows] >= 0]
        if not len(train_rows):
            raise ValueError("no logged records (with a `logged` action) to learn from")
    elif not table.arrays.available[train_rows].all():
        raise ValueError(
            f"the training part has unknown outcomes: a {kind} checkpoint needs them all"
        )
    extractor = extractor or FeatureExtractor.load()
    x = cached_features(
        table.arrays.conversations, extractor, Path(cache_dir) if cache_dir else out / "cache"
    )
    dims = extractor.embedding.dim if extractor.embedding is not None else extractor.dim
    return StoredBuild(kind, out, started, table, train_rows, val_rows, extractor, x, dims)


def pick_neighbours(
    build: StoredBuild,
    neighbours: Sequence[int],
    make_architecture: Callable[[int], Architecture],
    evaluate: Evaluate,
) -> tuple[Architecture, Metrics, dict[int, float]]:
    """The architecture whose number of neighbours has the best mean validation reward (a
    count above the training part's size means all of it), its validation metrics, and the
    mean reward of every count tried."""
    tried: dict[int, float] = {}
    best: tuple[float, Architecture, Metrics] | None = None
    n_train = len(build.train_rows)
    if any(k > n_train for k in neighbours):
        logger.warning(
            "only %d training prompts: neighbour counts above it are tried as %d", n_train, n_train
        )
    for k in sorted({min(k, n_train) for k in neighbours}):
        arch = make_architecture(k)
        metrics = evaluate(arch, build.val_rows)
        tried[k] = float(np.mean([m["reward"] for m in metrics.values()]))
        logger.info("k=%d: mean validation reward %.4f", k, tried[k])
        if best is None or tried[k] > best[0]:
            best = (tried[k], arch, metrics)
    assert best is not None
    return best[1], best[2], tried


def finish_build(
    build: StoredBuild,
    arch: Architecture,
    val_metrics: Metrics,
    tried: dict[int, float],
    weights: dict[str, np.ndarray],
    *,
    evaluate: Evaluate,
    training_extra: dict[str, Any] | None = None,
    metrics_extra: dict[str, Any] | None = None,
    name: str = "",
    description: str = "",
    command: str = "",
    table_path: str | Path | None = None,
) -> TrainResult:
    """Write the run files and the checkpoint (with the test part's metrics when the config
    asks to report them)."""
    table, models = build.table, build.table.models
    base_meta, training_meta = run_metadata(
        build.cfg,
        arch,
        models,
        table.prices,
        build.extractor,
        table.records,
        table.splits,
        mode=f"{build.kind}-offpolicy" if build.cfg.offpolicy else build.kind,
        name=name,
        description=description,
        command=command,
        table_path=table_path,
        ids_sha256=table.ids_sha256,
    )
    training_meta["neighbours_tried"] = {str(n): v for n, v in tried.items()}
    training_meta.update(training_extra or {})
    write_config(build.out, training_meta, models, build.extractor)
    k = arch.neighbours
    metrics_out: dict[str, Any] = {
        "selected_by": f"mean greedy validation reward at λ in {list(build.val_lambdas)}",
        "neighbours": k,
        **(metrics_extra or {}),
        "validation_mean_reward": tried[k],
        "validation": val_metrics,
    }
    ceiling = reward_ceiling(build.cfg.reward_form, build.cfg.reward_K)
    if (support := validation_support(val_metrics, ceiling)) is not None:
        metrics_out["validation_support"] = support
    test_metrics = _test_metrics(build, arch, evaluate)
    if test_metrics is not None:
        metrics_out["test_mean_reward"] = float(
            np.mean([m["reward"] for m in test_metrics.values()])
        )
        metrics_out["test"] = test_metrics
    ckpt_path = build.out / "checkpoint"
    seconds = time.perf_counter() - build.started
    save_checkpoint(
        ckpt_path,
        CheckpointMetadata(
            **base_meta,
            training={**training_meta, "seconds": round(seconds, 2)},
            metrics=metrics_out,
        ),
        weights,
    )
    keep_seen_prompts(ckpt_path, seen_hashes(table))
    write_summary(build.out, ckpt_path, seconds, metrics_out)
    logger.info(
        "%s checkpoint with k=%d (validation reward %.4f): %s", build.kind, k, tried[k], ckpt_path
    )
    return TrainResult(
        build.out, ckpt_path, 0, 0, seconds, val_metrics, {}, test_metrics, models, k
    )


def _test_metrics(build: StoredBuild, arch: Architecture, evaluate: Evaluate) -> Metrics | None:
    rows = build.table.splits["test"]
    if not build.cfg.report_test or not len(rows):
        return None
    return evaluate(arch, rows)
