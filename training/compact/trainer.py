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

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from router.checkpoint import Architecture, CheckpointMetadata, save_checkpoint
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.policies.compact import CompactHead, encode_lambda
from training.compact.config import TrainConfig
from training.compact.data import (
    TableArrays,
    cached_features,
    lambda_encoding_for,
    reward_matrix,
    sample_lambdas,
    standardization,
)
from training.compact.model import CompactMLP, masked_entropy, masked_log_softmax
from training.compact.offpolicy import (
    OffPolicyLearner,
    RewardModel,
    evaluate_logged,
    fit_reward_model,
)
from training.compact.run import (
    RunTable,
    TrainResult,
    evaluate_full,
    keep_seen_prompts,
    mean_reward,
    prepare_table,
    run_metadata,
    seen_hashes,
    write_config,
    write_summary,
)
from training.compact.support import reward_ceiling, validation_support

logger = logging.getLogger(__name__)


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


def _seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


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
    cfg, models, arrays, splits = table.cfg, table.models, table.arrays, table.splits
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

    reward_model = None
    learner: Any
    if cfg.offpolicy:
        logged_train = splits["train"][arrays.logged_action[splits["train"]] >= 0]
        if len(logged_train) == 0:
            raise ValueError("no logged records (with a `logged` action) to learn from")
        if cfg.estimator == "dr":
            reward_model = fit_reward_model(
                x, arrays, logged_train, mean, std, steps=cfg.reward_model_steps, seed=cfg.seed
            )
        learner = OffPolicyLearner(model, opt, x, arrays, splits["train"], cfg, rng, reward_model)
    else:
        learner = GRPOLearner(
            model, opt, x, arrays, splits["train"], cfg, rng, gen, table.reference
        )

    def evaluator(part: str) -> Evaluate:
        return _evaluator(x, table, part, val_lambdas, cfg, reward_model)

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
        ids_sha256=table.ids_sha256,
    )
    write_config(out, training_meta, models, extractor)
    seen = seen_hashes(table)

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
        keep_seen_prompts(path, seen)

    initial, best = _run_steps(learner, model, arch, cfg, evaluator("validation"), out, save)

    test_metrics = None
    if cfg.report_test and len(splits["test"]):
        test_metrics = evaluator("test")(CompactHead(arch, best.weights))
    metrics: dict[str, Any] = {
        "selected_by": f"mean greedy validation reward at λ in {list(val_lambdas)}",
        "best_step": best.step,
        "validation_mean_reward": best.score,
        "validation": best.metrics,
        "initial_validation_mean_reward": mean_reward(initial),
    }
    ceiling = reward_ceiling(cfg.reward_form, cfg.reward_K)
    if (support := validation_support(best.metrics, ceiling)) is not None:
        metrics["validation_support"] = support
    if test_metrics is not None:
        metrics["test_mean_reward"] = mean_reward(test_metrics)
        metrics["test"] = test_metrics
    ckpt_path = out / "checkpoint"
    save(ckpt_path, best.weights, metrics, best.step)
    seconds = time.perf_counter() - started
    write_summary(out, ckpt_path, seconds, metrics)
    logger.info(
        "best validation reward %.4f at step %d; checkpoint %s", best.score, best.step, ckpt_path
    )
    return TrainResult(
        out, ckpt_path, best.step, cfg.steps, seconds, best.metrics, initial, test_metrics, models
    )


# -- the step loop ----------------------------------------------------------------------------

Metrics = dict[str, dict[str, Any]]
Evaluate = Callable[[CompactHead], Metrics]
Save = Callable[[Path, dict[str, np.ndarray], dict[str, Any], int], None]


@dataclass
class _Best:
    """The weights with the best mean greedy validation reward so far."""

    score: float
    step: int
    weights: dict[str, np.ndarray]
    metrics: Metrics


def _evaluator(
    x: np.ndarray,
    table: RunTable,
    part: str,
    lambdas: Sequence[float],
    cfg: TrainConfig,
    reward_model: RewardModel | None,
) -> Evaluate:
    """Greedy evaluation of a head on one part of the table: from every model's outcome
    when the part has them all, else off-policy from the logged ones."""
    rows = table.splits[part]
    xs, outcomes = x[rows], table.arrays.subset(rows)
    reward_cfg = cfg.reward_config()
    if outcomes.available.all():
        ref = table.reference[rows] if table.reference is not None else None
        return lambda head: evaluate_full(head, xs, outcomes, lambdas, reward_cfg, ref)
    return lambda head: evaluate_logged(
        head, xs, outcomes, lambdas, reward_cfg, cfg.ips_clip, reward_model
    )


def _run_steps(
    learner: GRPOLearner | OffPolicyLearner,
    model: CompactMLP,
    arch: Architecture,
    cfg: TrainConfig,
    validate: Evaluate,
    out: Path,
    save: Save,
) -> tuple[Metrics, _Best]:
    """``cfg.steps`` learner steps, validated every ``cfg.eval_every`` and at the last, with
    training and validation rows in ``metrics.jsonl`` and a step checkpoint every
    ``cfg.checkpoint_every``. Returns the initial validation and the best step (the initial
    weights are step 0, so a run that never improves keeps them)."""
    weights = model.export_weights()
    initial = validate(CompactHead(arch, weights))
    best = _Best(mean_reward(initial), 0, weights, initial)
    with (out / "metrics.jsonl").open("w") as mf:

        def row(**fields: Any) -> None:
            mf.write(json.dumps(fields) + "\n")

        row(step=0, split="validation", mean_reward=best.score, per_lambda=initial)
        bar = tqdm(range(1, cfg.steps + 1), disable=not cfg.progress, desc="train", unit="step")
        for step in bar:
            stats = learner.step()
            if step % 10 == 0:
                row(step=step, split="train", **stats)
            # This step's validation, for its step checkpoint when one is written.
            step_metrics: dict[str, Any] = {}
            if step % cfg.eval_every == 0 or step == cfg.steps:
                weights = model.export_weights()
                val_metrics = validate(CompactHead(arch, weights))
                score = mean_reward(val_metrics)
                row(step=step, split="validation", mean_reward=score, per_lambda=val_metrics)
                mf.flush()
                if score > best.score:
                    best = _Best(score, step, weights, val_metrics)
                step_metrics = {"validation_mean_reward": score, "validation": val_metrics}
                bar.set_postfix(val=f"{score:.4f}", best=f"{best.score:.4f}@{best.step}")
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                path = out / "checkpoints" / f"step_{step:06d}"
                save(path, model.export_weights(), step_metrics, step)
    return initial, best
