"""Training the compact policy on CPU with torch.

Full-information mode (an outcome table where every model's score and cost is known) uses a
GRPO-style policy gradient: for each prompt of a batch a cost weight λ is drawn (0 with some
probability, else log-uniform over [λ_min, λ_max]), a group of G actions is sampled from the
current policy, each is rewarded with ``training.reward.compute_reward``, advantages are the
group-normalized rewards ``(r − mean) / std``, and a PPO-clipped ratio objective against the
sampling policy plus an entropy bonus is ascended for a few epochs. Because λ is an input,
one checkpoint serves every trade-off. Logged traffic with partial feedback goes through
``training.compact.offpolicy`` instead (IPS / SNIPS / doubly robust).

A run directory holds ``config.json``, ``metrics.jsonl`` (training and validation rows),
``cache/`` (features, keyed by the texts and the feature version), ``checkpoints/step_N``
every N steps, and ``checkpoint/``: the weights with the best mean validation reward, which
``router.checkpoint.load_checkpoint`` reads. Validation uses a deterministic split by id hash
(``training.datasets.splits``); the test split is never used for any choice.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from router.checkpoint import Architecture, CheckpointMetadata, save_checkpoint
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.policies.compact import CompactHead, encode_lambda, masked_softmax
from router.policies.knn import KNNHead
from training.compact.config import TrainConfig
from training.compact.data import (
    TableArrays,
    cached_features,
    lambda_encoding_for,
    pool_of,
    resolve_lambdas,
    resolve_prices,
    reward_matrix,
    sample_lambdas,
    standardization,
)
from training.compact.model import CompactMLP, masked_entropy, masked_log_softmax
from training.datasets.splits import split_of
from training.reward import RewardConfig

logger = logging.getLogger(__name__)


# -- evaluation -------------------------------------------------------------------------


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
    }
    if table_path is not None:
        table_info["path"] = str(table_path)
        table_info["sha256"] = hashlib.sha256(Path(table_path).read_bytes()).hexdigest()
    training_meta = {
        "mode": mode,
        "command": command,
        "config": cfg.to_dict(),
        "table": table_info,
        "torch": torch.__version__,
    }
    return base_meta, training_meta


def mean_reward(metrics: dict[str, dict[str, Any]]) -> float:
    return float(np.mean([m["reward"] for m in metrics.values()])) if metrics else float("nan")


# -- GRPO ---------------------------------------------------------------------------------


class GRPOLearner:
    """Group-relative policy optimization on a full-information table."""

    def __init__(
        self,
        model: CompactMLP,
        optimizer: torch.optim.Optimizer,
        x: np.ndarray,
        arrays: TableArrays,
        rows: np.ndarray,
        cfg: TrainConfig,
        rng: np.random.Generator,
        generator: torch.Generator,
        reference_cost: np.ndarray | None = None,
    ) -> None:
        self.model, self.opt, self.cfg, self.rng, self.gen = model, optimizer, cfg, rng, generator
        self.x, self.arrays, self.rows = x, arrays, rows
        self.reference_cost = reference_cost
        self.reward_cfg = cfg.reward_config()

    def step(self) -> dict[str, float]:
        cfg = self.cfg
        idx = self.rng.choice(self.rows, size=min(cfg.batch_size, len(self.rows)), replace=False)
        lam = sample_lambdas(self.rng, len(idx), cfg)
        enc = torch.as_tensor(encode_lambda(lam, self.model.arch.lambda_encoding))
        x = torch.as_tensor(self.x[idx], dtype=torch.float32)
        mask = torch.as_tensor(self.arrays.available[idx])
        ref = None if self.reference_cost is None else self.reference_cost[idx]
        rewards = reward_matrix(
            self.arrays.score[idx], self.arrays.cost[idx], lam, self.reward_cfg, ref
        )
        # Sample from the deterministic (eval-mode) policy, the one that will be deployed,
        # mixed with a little uniform exploration: a group drawn from a sharp policy alone
        # never shows an abandoned model again, so a trade-off learned at one λ could never
        # be revised at another. The ratio below is against this behaviour distribution.
        self.model.eval()
        with torch.no_grad():
            probs = masked_log_softmax(self.model(x, enc), mask).exp()
            if cfg.explore_epsilon > 0:
                uniform = mask.float() / mask.float().sum(dim=1, keepdim=True)
                probs = (1.0 - cfg.explore_epsilon) * probs + cfg.explore_epsilon * uniform
            actions = torch.multinomial(probs, cfg.group_size, replacement=True, generator=self.gen)
            logp_old = probs.gather(1, actions).log()
        r = torch.as_tensor(np.nan_to_num(rewards, nan=0.0), dtype=torch.float32).gather(1, actions)
        std = r.std(dim=1, keepdim=True, unbiased=False)
        adv = (r - r.mean(dim=1, keepdim=True)) / std.clamp_min(max(cfg.advantage_std_floor, 1e-6))
        stats: dict[str, float] = {}
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            logp_all = masked_log_softmax(self.model(x, enc), mask)
            ratio = (logp_all.gather(1, actions) - logp_old).exp()
            clipped = ratio.clamp(1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps)
            objective = torch.min(ratio * adv, clipped * adv).mean()
            entropy = masked_entropy(logp_all, mask).mean()
            loss = -objective - cfg.entropy_coef * entropy
            self.opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.opt.step()
            stats = {
                "loss": float(loss.detach()),
                "entropy": float(entropy.detach()),
                "clip_frac": float(((ratio - 1.0).abs() > cfg.clip_eps).float().mean()),
            }
        stats["reward"] = float(r.mean())
        stats["lambda_mean"] = float(lam.mean())
        return stats


# -- the run --------------------------------------------------------------------------------


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


def _seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def split_rows(ids: Sequence[str], cfg: TrainConfig) -> dict[str, np.ndarray]:
    names = np.array([split_of(i, cfg.fractions, cfg.split_seed) for i in ids])
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

    def reference_of(self, rows: np.ndarray) -> np.ndarray | None:
        return None if self.reference is None else self.reference[rows]


# Below this many training records a router mostly memorizes: said, not refused.
_FEW_TRAINING_RECORDS = 50


def prepare_table(
    records: Sequence[OutcomeRecord],
    cfg: TrainConfig,
    pool: Sequence[str] | None = None,
    prices_path: str | Path | None = None,
) -> RunTable:
    """Checks and arrays shared by every way of building a checkpoint from a table."""
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
        # cascade's trajectory has no one model's outcome.
        single = [r for r in kept if r.logged is not None and not r.logged.multi_call]
        if not single:
            raise ValueError(
                f"no logged records to learn off-policy from: none of the {len(kept)} records "
                "is a logged single-model decision (they are multi-call trajectories, e.g. "
                "cascades, or carry no `logged` action); log traffic routed by a single-call "
                "policy (compact with router.epsilon) and export again"
            )
        if len(single) < len(kept):
            logger.warning(
                "skipped %d records that are not a logged single-model decision (multi-call "
                "trajectories, e.g. cascades, or no `logged` action)",
                len(kept) - len(single),
            )
        kept = single
    # The actions: the models the usable records hold outcomes of (every one of them, with
    # full information), unless a pool is given.
    models = list(pool) if pool else pool_of(kept, full_information=not cfg.offpolicy)
    if not models:
        raise ValueError("no model has an outcome on every record: pass --pool")
    seen = {m for r in kept for m in r.outcomes}
    unknown = [m for m in models if m not in seen]
    if unknown:
        raise ValueError(f"pool model(s) with no outcome in the table: {', '.join(unknown)}")
    if not cfg.offpolicy:
        full = [r for r in kept if all(m in r.outcomes for m in models)]
        if len(full) < len(kept):
            logger.warning(
                "dropped %d records lacking an outcome for some pool model",
                len(kept) - len(full),
            )
        kept = full
    if cfg.reference_model is not None and cfg.reference_model not in models:
        raise ValueError(f"reference model {cfg.reference_model!r} is not in the pool")
    if cfg.offpolicy and cfg.reference_model is not None:
        raise ValueError("off-policy training needs a fixed cost scale (no reference model)")
    catalog, prices = resolve_prices(models, prices_path)
    arrays = TableArrays.from_records(kept, models, catalog)
    splits = split_rows(arrays.ids, cfg)
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
    reference = arrays.cost[:, models.index(cfg.reference_model)] if cfg.reference_model else None
    table = RunTable(cfg, models, kept, prices, arrays, splits, reference)
    table.cfg = resolve_lambdas(
        cfg, arrays.subset(splits["train"]), table.reference_of(splits["train"])
    )
    return table


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


def train(
    records: Sequence[OutcomeRecord],
    cfg: TrainConfig,
    run_dir: str | Path,
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
    torch.set_num_threads(max(cfg.threads, 1))
    gen = _seed_everything(cfg.seed)
    rng = np.random.default_rng(cfg.seed)

    table = prepare_table(records, cfg, pool, prices_path)
    cfg, models, arrays, splits, reference = (
        table.cfg,
        table.models,
        table.arrays,
        table.splits,
        table.reference,
    )
    val_lambdas = cfg.val_lambdas or (0.0,)
    logger.info(
        "cost weights: trained on [%g, %g], validated at %s", *cfg.lambda_range, val_lambdas
    )

    extractor = extractor or FeatureExtractor.load()
    x = cached_features(
        arrays.conversations, extractor, Path(cache_dir) if cache_dir else out / "cache"
    )
    mean, std = standardization(x[splits["train"]])
    arch = Architecture(
        input_dim=extractor.dim,
        hidden=tuple(cfg.hidden),
        activation=cfg.activation,
        n_actions=len(models),
        lambda_encoding=lambda_encoding_for(cfg),
    )
    model = CompactMLP(arch, mean, std, cfg.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    reward_cfg = cfg.reward_config()

    reward_model = None
    learner: Any
    if cfg.offpolicy:
        from training.compact.offpolicy import OffPolicyLearner, evaluate_logged, fit_reward_model

        logged_train = splits["train"][arrays.logged_action[splits["train"]] >= 0]
        if len(logged_train) == 0:
            raise ValueError("no logged records (with a `logged` action) to learn from")
        if cfg.estimator == "dr":
            reward_model = fit_reward_model(
                x, arrays, logged_train, mean, std, steps=cfg.reward_model_steps, seed=cfg.seed
            )
        learner = OffPolicyLearner(model, opt, x, arrays, splits["train"], cfg, rng, reward_model)
    else:
        learner = GRPOLearner(model, opt, x, arrays, splits["train"], cfg, rng, gen, reference)

    val = arrays.subset(splits["validation"])
    val_ref = reference[splits["validation"]] if reference is not None else None
    full_val = bool(val.available.all())

    def validate(head: CompactHead) -> dict[str, dict[str, Any]]:
        xv = x[splits["validation"]]
        if full_val:
            return evaluate_full(head, xv, val, val_lambdas, reward_cfg, val_ref)
        return evaluate_logged(head, xv, val, val_lambdas, reward_cfg, cfg.ips_clip, reward_model)

    base_meta, training_meta = run_metadata(
        cfg,
        arch,
        models,
        table.prices,
        extractor,
        table.records,
        splits,
        mode="offpolicy" if cfg.offpolicy else "grpo",
        name=name,
        description=description,
        command=command,
        table_path=table_path,
    )
    write_config(out, training_meta, models, extractor)

    def save(
        path: Path, weights: dict[str, np.ndarray], metrics: dict[str, Any], step: int
    ) -> None:
        meta = CheckpointMetadata(
            **base_meta,
            training={
                **training_meta,
                "step": step,
                "seconds": round(time.perf_counter() - started, 2),
            },
            metrics=metrics,
        )
        save_checkpoint(path, meta, weights)

    weights = model.export_weights()
    initial = validate(CompactHead(arch, weights))
    best = (mean_reward(initial), 0, weights, initial)
    metrics_path = out / "metrics.jsonl"
    with metrics_path.open("w") as mf:
        mf.write(
            json.dumps(
                {"step": 0, "split": "validation", "mean_reward": best[0], "per_lambda": initial}
            )
            + "\n"
        )
        bar = tqdm(range(1, cfg.steps + 1), disable=not cfg.progress, desc="train", unit="step")
        for step in bar:
            stats = learner.step()
            if step % 10 == 0:
                mf.write(json.dumps({"step": step, "split": "train", **stats}) + "\n")
            if step % cfg.eval_every == 0 or step == cfg.steps:
                weights = model.export_weights()
                val_metrics = validate(CompactHead(arch, weights))
                score = mean_reward(val_metrics)
                mf.write(
                    json.dumps(
                        {
                            "step": step,
                            "split": "validation",
                            "mean_reward": score,
                            "per_lambda": val_metrics,
                        }
                    )
                    + "\n"
                )
                mf.flush()
                if score > best[0]:
                    best = (score, step, weights, val_metrics)
                bar.set_postfix(val=f"{score:.4f}", best=f"{best[0]:.4f}@{best[1]}")
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                save(out / "checkpoints" / f"step_{step:06d}", model.export_weights(), {}, step)

    best_score, best_step, best_weights, best_val = best
    test_metrics = None
    if cfg.report_test and len(splits["test"]):
        test = arrays.subset(splits["test"])
        head = CompactHead(arch, best_weights)
        xt = x[splits["test"]]
        if test.available.all():
            test_ref = reference[splits["test"]] if reference is not None else None
            test_metrics = evaluate_full(head, xt, test, val_lambdas, reward_cfg, test_ref)
        else:
            from training.compact.offpolicy import evaluate_logged

            test_metrics = evaluate_logged(
                head, xt, test, val_lambdas, reward_cfg, cfg.ips_clip, reward_model
            )
    metrics: dict[str, Any] = {
        "selected_by": f"mean greedy validation reward at λ in {list(val_lambdas)}",
        "best_step": best_step,
        "validation_mean_reward": best_score,
        "validation": best_val,
        "initial_validation_mean_reward": mean_reward(initial),
    }
    if test_metrics is not None:
        metrics["test_mean_reward"] = mean_reward(test_metrics)
        metrics["test"] = test_metrics
    ckpt_path = out / "checkpoint"
    save(ckpt_path, best_weights, metrics, best_step)
    seconds = time.perf_counter() - started
    write_summary(out, ckpt_path, seconds, metrics)
    logger.info(
        "best validation reward %.4f at step %d; checkpoint %s", best_score, best_step, ckpt_path
    )
    return TrainResult(
        out, ckpt_path, best_step, cfg.steps, seconds, best_val, initial, test_metrics, models
    )
