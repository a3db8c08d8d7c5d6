"""A training run's table, directory and validation metrics, shared by every way of building
a compact checkpoint (GRPO, off-policy, kNN, cascade).

``prepare_table`` checks a table and turns it into arrays with their id-hash split and the
λ range resolved on the training part; ``evaluate_full`` is the greedy validation every
builder picks its checkpoint by; ``run_metadata``, ``write_config`` and ``write_summary``
write what a run directory and its checkpoint say about themselves.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from router.checkpoint import Architecture, is_single_file
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.policies.compact import CompactHead, masked_softmax
from router.policies.knn import KNNHead
from training.cli_errors import not_a_model
from training.compact.config import TrainConfig
from training.compact.data import (
    TableArrays,
    pool_of,
    resolve_lambdas,
    resolve_prices,
    reward_matrix,
)
from training.datasets.splits import split_of
from training.evaluation.overlap import (
    ids_fingerprint,
    seen_keys,
    seen_prompt_hashes,
    write_seen_prompts,
)
from training.reward import RewardConfig, check_reference_costs

logger = logging.getLogger(__name__)


# -- validation -------------------------------------------------------------------------


def evaluate_full(
    head: CompactHead | KNNHead,
    x: np.ndarray,
    arrays: TableArrays,
    lambdas: Sequence[float],
    config: RewardConfig,
    reference: np.ndarray | None = None,
) -> dict[str, dict[str, Any]]:
    """Greedy and expected reward, score and cost of the policy per λ, with the best single
    model and the per-prompt oracle for scale (full-information tables only)."""
    mask = arrays.available
    out: dict[str, dict[str, Any]] = {}
    rows = np.arange(len(arrays.ids))
    for lam in lambdas:
        probs = masked_softmax(head.logits(x, float(lam)), mask)
        choice = probs.argmax(axis=1)
        r = reward_matrix(arrays.score, arrays.cost, np.full(len(rows), lam), config, reference)
        r0 = np.nan_to_num(r, nan=0.0)
        counts = np.bincount(choice, minlength=len(arrays.models)) / max(len(rows), 1)
        out[f"{lam:g}"] = {
            "reward": float(r0[rows, choice].mean()),
            "expected_reward": float((probs * r0).sum(axis=1).mean()),
            "score": float(arrays.score[rows, choice].mean()),
            "cost_usd": float(arrays.cost[rows, choice].mean()),
            "best_single_reward": float(np.nanmean(r, axis=0).max()),
            "best_single_model": arrays.models[int(np.nanmean(r, axis=0).argmax())],
            "oracle_reward": float(np.nanmax(r, axis=1).mean()),
            "choices": {
                m: round(float(c), 4) for m, c in zip(arrays.models, counts, strict=True) if c
            },
        }
    return out


def run_metadata(
    cfg: TrainConfig,
    arch: Architecture,
    models: list[str],
    prices: dict[str, dict[str, str]],
    extractor: FeatureExtractor,
    records: Sequence[OutcomeRecord],
    splits: dict[str, np.ndarray],
    *,
    mode: str,
    name: str = "",
    description: str = "",
    command: str = "",
    table_path: str | Path | None = None,
    ids_sha256: str = "",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a run's checkpoint says about itself: the fixed metadata (pool, prices,
    features, architecture, reward) and how it was trained (mode, command, configuration,
    the table and its split sizes)."""
    reward_cfg = cfg.reward_config()
    base_meta: dict[str, Any] = {
        "name": name,
        "description": description,
        "pool": models,
        "prices": prices,
        "feature_version": extractor.feature_version,
        "feature_config": extractor.config.to_dict(),
        "architecture": arch,
        "reward": {
            **dataclasses.asdict(reward_cfg),
            "cost_normalization": "reference" if cfg.reference_model else "scale",
            "reference_model": cfg.reference_model,
        },
    }
    table_info: dict[str, Any] = {
        "records": len(records),
        **{f"n_{k}": len(v) for k, v in splits.items()},
        # Split by each record's group where it has one (``split_key``): what `xrouter
        # eval` must follow to tell the prompts this run saw. Absent from checkpoints made
        # before groups, which split by id.
        "split_by": "group",
    }
    if ids_sha256:
        table_info["ids_sha256"] = ids_sha256
    if table_path is not None:
        table_info["path"] = str(table_path)
        table_info["sha256"] = hashlib.sha256(Path(table_path).read_bytes()).hexdigest()
    config, unused = config_used(cfg, arch.kind)
    training_meta: dict[str, Any] = {
        "mode": mode,
        "command": command,
        "config": config,
        "table": table_info,
        "torch": torch.__version__,
    }
    if unused:
        training_meta["config_not_used"] = unused
    return base_meta, training_meta


# What a checkpoint that stores its training prompts (kind knn or cascade: no gradient
# steps) never reads of the configuration: the network's optimization, its schedule and the
# torch/progress plumbing. Recorded, they would read as settings that shaped it.
_NETWORK_ONLY = (
    "steps", "batch_size", "group_size", "ppo_epochs", "lr", "weight_decay", "grad_clip",
    "clip_eps", "entropy_coef", "explore_epsilon", "advantage_std_floor", "hidden", "dropout",
    "activation", "lambda_zero_prob", "eval_every", "checkpoint_every", "offpolicy_lambdas",
    "offpolicy_entropy_coef", "threads", "progress",
)  # fmt: skip
# ... and, built from a full-information table, the off-policy knobs: the reward model the
# kNN fits to logged traffic (its steps and seed), its estimator and clipping.
_LOGGED_ONLY = ("estimator", "ips_clip", "reward_model_steps", "seed")


def config_used(cfg: TrainConfig, kind: str) -> tuple[dict[str, Any], list[str]]:
    """The run's configuration as the builder of a ``kind`` checkpoint used it, and the
    names of the fields it left unused (empty for the policy network, which uses them
    all)."""
    config = cfg.to_dict()
    if kind not in ("knn", "cascade"):
        return config, []
    unused = [*_NETWORK_ONLY, *(() if cfg.offpolicy else _LOGGED_ONLY)]
    return {k: v for k, v in config.items() if k not in unused}, unused


def mean_reward(metrics: dict[str, dict[str, Any]]) -> float:
    return float(np.mean([m["reward"] for m in metrics.values()])) if metrics else float("nan")


# -- the run's table and directory --------------------------------------------------------------------------------


@dataclass(slots=True)
class TrainResult:
    run_dir: Path
    checkpoint_path: Path
    best_step: int
    steps: int
    seconds: float
    validation: dict[str, dict[str, Any]]
    initial_validation: dict[str, dict[str, Any]]
    test: dict[str, dict[str, Any]] | None = None
    pool: list[str] = field(default_factory=list)
    # kNN checkpoints: the number of neighbours picked on validation.
    neighbours: int | None = None


def split_rows(keys: Sequence[str], cfg: TrainConfig) -> dict[str, np.ndarray]:
    """Row indices per part, from each record's ``split_key`` (its group, or its id)."""
    names = np.array([split_of(k, cfg.fractions, cfg.split_seed) for k in keys])
    return {s: np.flatnonzero(names == s) for s in ("train", "validation", "test")}


@dataclass(slots=True)
class RunTable:
    """A table ready to train on: the pool, the records kept for it, their arrays and
    id-hash split, the reference model's costs (if cost is normalized by one) and the
    configuration with its λ range resolved from the training part."""

    cfg: TrainConfig
    models: list[str]
    records: list[OutcomeRecord]
    prices: dict[str, dict[str, str]]
    arrays: TableArrays
    splits: dict[str, np.ndarray]
    reference: np.ndarray | None
    # The fingerprint of every record id in the table as loaded, those not kept included:
    # what `xrouter eval` recognizes the table by, in whatever file it comes.
    ids_sha256: str = ""

    def reference_of(self, rows: np.ndarray) -> np.ndarray | None:
        return None if self.reference is None else self.reference[rows]


def seen_hashes(table: RunTable) -> np.ndarray:
    """The hashes of the prompts a run fits and selects on (its training and validation
    parts), computed once per run for every checkpoint it saves."""
    rows = np.concatenate([table.splits["train"], table.splits["validation"]])
    return seen_prompt_hashes(k for i in rows for k in seen_keys(table.records[int(i)]))


def keep_seen_prompts(checkpoint: Path, hashes: np.ndarray) -> None:
    """Keep, beside a checkpoint directory, which prompts it was fitted and selected on
    (``seen_hashes``), so that `xrouter eval` can tell them in any later table (a later
    export of the same traffic)."""
    if is_single_file(checkpoint):
        return  # one file to ship: its table's fingerprint and split have to do
    write_seen_prompts(checkpoint, hashes)


# Below this many training records a router mostly memorizes: said, not refused.
_FEW_TRAINING_RECORDS = 50


def prepare_table(
    records: Sequence[OutcomeRecord],
    cfg: TrainConfig,
    pool: Sequence[str] | None = None,
    prices_path: str | Path | None = None,
) -> RunTable:
    """Checks and arrays shared by every way of building a checkpoint from a table."""
    kept = _usable_records(records, cfg)
    models, kept = _pool_and_records(kept, pool, cfg)
    if cfg.reference_model is not None and cfg.reference_model not in models:
        seen = {m for r in records for m in r.outcomes}
        if cfg.reference_model not in seen:
            raise ValueError(not_a_model("--reference-model", [cfg.reference_model], seen))
        raise ValueError(
            f"--reference-model {cfg.reference_model}: not among the models trained on "
            f"({', '.join(models)})"
        )
    if cfg.offpolicy and cfg.reference_model is not None:
        raise ValueError("off-policy training needs a fixed cost scale (no reference model)")
    catalog, prices = resolve_prices(models, prices_path)
    arrays = TableArrays.from_records(kept, models, catalog)
    if cfg.reference_model is not None:
        # Once priced: an outcome that records only its tokens has its cost from here on.
        column = arrays.cost[:, models.index(cfg.reference_model)]
        check_reference_costs(
            cfg.reference_model, dict(zip(arrays.ids, map(float, column), strict=True))
        )
    splits = split_rows([r.split_key for r in kept], cfg)
    sizes = ", ".join(f"{k} {len(v)}" for k, v in splits.items())
    if len(splits["train"]) == 0 or len(splits["validation"]) == 0:
        raise ValueError(
            f"need training and validation records, got {sizes} of the {len(kept)} usable "
            "records (split by id hash with --split-seed): too few to train on"
        )
    if len(splits["train"]) < _FEW_TRAINING_RECORDS:
        logger.warning(
            "%d usable records: %s (too few to learn a router that generalizes)", len(kept), sizes
        )
    else:
        logger.info("%d usable records: %s", len(kept), sizes)
    if cfg.report_test and len(splits["test"]) == 0:
        # Said, not left for the user to notice that summary.json has no test figures.
        logger.warning("--report-test: the test split is empty (%s): no test figures", sizes)
    reference = arrays.cost[:, models.index(cfg.reference_model)] if cfg.reference_model else None
    table = RunTable(cfg, models, kept, prices, arrays, splits, reference, ids_fingerprint(records))
    table.cfg = resolve_lambdas(
        cfg, arrays.subset(splits["train"]), table.reference_of(splits["train"])
    )
    return table


def _usable_records(records: Sequence[OutcomeRecord], cfg: TrainConfig) -> list[OutcomeRecord]:
    """The records a router can learn from: with their prompt, and (off-policy) a logged
    single-model decision. Raises with what to do when none is left."""
    if not records:
        # Said before the content-logging check below, which would blame the ledger.
        raise ValueError("the outcome table is empty (no records): nothing to train on")
    kept = [r for r in records if r.has_prompt]
    if not kept:
        raise ValueError(
            f"none of the {len(records)} records carries its prompt (a ledger export of "
            "traffic logged with ledger.log_content 'none' or 'hash'): a router that reads "
            "the prompt cannot learn from placeholders; set ledger.log_content: full, "
            "collect traffic and export again"
        )
    if len(kept) < len(records):
        logger.warning(
            "dropped %d records whose prompt was not logged (content_logged none/hash)",
            len(records) - len(kept),
        )
    if cfg.offpolicy:
        # Only a logged single-model decision can be reweighted by its propensity: a
        # trajectory of several models' calls (a cascade's plan, a router calling several
        # models) has no one model's outcome.
        single = [r for r in kept if r.logged is not None and not r.logged.multi_call]
        if not single:
            raise ValueError(
                f"no logged records to learn off-policy from: none of the {len(kept)} records "
                "is a logged single-model decision (they are multi-call trajectories — several "
                "models called for one request, as a cascade's plan — or carry no `logged` "
                "action); log traffic routed by a single-call "
                "policy (compact with router.epsilon) and export again"
            )
        if len(single) < len(kept):
            logger.warning(
                "skipped %d records that are not a logged single-model decision (multi-call "
                "trajectories — several models called for one request, as a cascade's plan "
                "— or no `logged` action)",
                len(kept) - len(single),
            )
        kept = single
    return kept


def _pool_and_records(
    kept: list[OutcomeRecord], pool: Sequence[str] | None, cfg: TrainConfig
) -> tuple[list[str], list[OutcomeRecord]]:
    """The actions — the models the usable records hold outcomes of (every one of them, with
    full information), unless a pool is given — and, with full information, the records
    that have an outcome for each."""
    if pool:
        models = list(pool)
        repeated = sorted({m for m in models if models.count(m) > 1})
        if repeated:
            # Two actions for one model: its column would be filled once, the other left
            # without outcomes.
            raise ValueError(f"pool model(s) given more than once: {', '.join(repeated)}")
    else:
        models = pool_of(kept, full_information=not cfg.offpolicy)
        if not cfg.offpolicy:
            logged = sum(r.logged is not None for r in kept)
            if logged and (not models or any(r.partial_feedback for r in kept)):
                # An export trained without --offpolicy: "pass --pool" (after a warning
                # per model) would point the wrong way, and an export of one model's traffic
                # would pass for that model's outcome on every prompt.
                raise ValueError(
                    f"{logged} of the {len(kept)} records are logged traffic (`logged`: the "
                    "outcome of the one model the gateway chose per prompt, as `xrouter "
                    "export` writes them): train on them with --offpolicy "
                    "(the policy network, or --knn; --cascade needs every model's recorded "
                    "outcomes)"
                )
            _warn_partial_models(kept, models)
    if not models:
        raise ValueError(
            "no model has an outcome on every record (see the warnings above): pass --pool"
        )
    if len(models) == 1:
        # One action: every policy picks it, so a run would learn nothing and write a
        # checkpoint that routes nowhere, with validation figures that look like a router's.
        if pool:
            why = "--pool names one model"
        elif cfg.offpolicy:
            why = (
                "the logged records chose one model only, and say nothing of any other "
                "(log with exploration: router.epsilon)"
            )
        else:
            why = "one model only has an outcome on every record (pass --pool with others)"
        raise ValueError(f"{why}: {models[0]!r}; a router chooses between at least two models")
    seen = {m for r in kept for m in r.outcomes}
    unknown = [m for m in models if m not in seen]
    if unknown:
        raise ValueError(not_a_model("--pool", unknown, seen))
    if cfg.offpolicy and pool:
        outside = sorted({r.logged.action for r in kept if r.logged is not None} - set(models))
        if outside:
            # Those records are left out, where IPS and DR would need them at weight 0 (and
            # DR their direct term): the estimates lean toward the prompts the pool's own
            # models were logged on. SNIPS gives them weight 0 anyway, so it is unaffected.
            n = sum(r.logged is not None and r.logged.action in outside for r in kept)
            logger.warning(
                "%d of the %d logged records chose a model outside --pool (%s) and are not "
                "learned from (the split counts below still include them): IPS and DR "
                "estimates are biased by their absence (SNIPS is not); train with the models "
                "they chose in the pool, or with --estimator snips",
                n,
                len(kept),
                ", ".join(outside),
            )
    if not cfg.offpolicy:
        full = [r for r in kept if all(m in r.outcomes for m in models)]
        if len(full) < len(kept):
            first = next(r for r in kept if not all(m in r.outcomes for m in models))
            lacking = next(m for m in models if m not in first.outcomes)
            logger.warning(
                "dropped %d records lacking an outcome for some pool model (the first: "
                "record %r has none for %r)",
                len(kept) - len(full),
                first.id,
                lacking,
            )
        kept = full
    return models, kept


def _warn_partial_models(records: Sequence[OutcomeRecord], pool: Sequence[str]) -> None:
    """Say which models the default pool left out, and which record lacks each: a research
    table with one missing outcome would otherwise lose that model without a word."""
    every = dict.fromkeys(m for r in records for m in r.outcomes)  # first-seen order
    for model in (m for m in every if m not in pool):
        lacking = [r.id for r in records if model not in r.outcomes]
        logger.warning(
            "model %r left out of the pool: no outcome for it on %d of the %d records "
            "(the first: record %r); pass --pool with it to keep it and drop those records",
            model,
            len(lacking),
            len(records),
            lacking[0],
        )


def write_config(
    out: Path, training_meta: dict[str, Any], models: list[str], extractor: FeatureExtractor
) -> None:
    """The run directory's config.json: how the run was set up."""
    body = {**training_meta, "pool": models, "feature_version": extractor.feature_version}
    (out / "config.json").write_text(json.dumps(body, indent=2) + "\n")


def write_summary(out: Path, checkpoint: Path, seconds: float, metrics: dict[str, Any]) -> None:
    """The run directory's summary.json: what came out."""
    body = {
        "checkpoint": str(checkpoint),
        "seconds": round(seconds, 2),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        **metrics,
    }
    (out / "summary.json").write_text(json.dumps(body, indent=2) + "\n")
