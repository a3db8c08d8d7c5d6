"""The GRPO trainer: seeded, it learns a prompt- and λ-dependent routing on a synthetic
table, writes a run directory, and its checkpoint serves through CompactPolicy."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from pricing import ModelPrice
from router.checkpoint import load_checkpoint
from router.checkpoint_registry import list_checkpoints
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord
from router.policies.compact import CompactPolicy
from router.pool import ModelPool, PoolModel, PoolModelConfig
from training.compact.config import TrainConfig
from training.compact.trainer import train

# A short run's settings; each test derives its config with dataclasses.replace.
FAST = TrainConfig(steps=150, eval_every=50, checkpoint_every=100, cost_scale=0.01,
                   lambda_max=10.0, val_lambdas=(0.0, 1.0), progress=False)  # fmt: skip


@pytest.fixture(scope="module")
def extractor() -> FeatureExtractor:
    return FeatureExtractor.load()


def test_training_raises_validation_reward(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    extractor: FeatureExtractor,
    tmp_path: Path,
) -> None:
    full, _ = tables
    models = list(full[0].outcomes)
    res = train(
        full, replace(FAST, seed=1), tmp_path / "run", extractor=extractor, command="pytest"
    )
    before = np.mean([v["reward"] for v in res.initial_validation.values()])
    after = np.mean([v["reward"] for v in res.validation.values()])
    assert after > before + 0.1, (before, after)
    # At λ=0 the specialists win (≈0.9 each on their topic); at λ=1 their cost (1.0 in
    # normalized units) wipes out their reward and the cheap generalist wins.
    v0, v1 = res.validation["0"], res.validation["1"]
    assert v0["score"] > 0.75 and v0["choices"].get("cheap", 0.0) < 0.2
    assert v1["choices"].get("cheap", 0.0) > 0.8
    assert v1["reward"] > 0.75 * v1["best_single_reward"]

    run = tmp_path / "run"
    config = json.loads((run / "config.json").read_text())
    assert config["mode"] == "grpo" and config["config"]["seed"] == 1 and config["pool"] == models
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "validation"] == [0, 50, 100, 150]
    assert any(r["split"] == "train" and "entropy" in r for r in rows)
    assert [c.path.name for c in list_checkpoints(run / "checkpoints")] == ["step_000100"]
    # A step checkpoint written where the run validated says how it did (what `xrouter
    # checkpoints --steps` lists), as metrics.jsonl does.
    (step_100,) = list_checkpoints(run / "checkpoints")
    row_100 = next(r for r in rows if r["split"] == "validation" and r["step"] == 100)
    assert step_100.metadata.metrics["validation_mean_reward"] == row_100["mean_reward"]
    assert step_100.metadata.metrics["validation"] == row_100["per_lambda"]

    ckpt = load_checkpoint(res.checkpoint_path)
    assert ckpt.metadata.training["step"] == res.best_step
    assert ckpt.metadata.metrics["validation"] == res.validation
    assert ckpt.feature_version == extractor.feature_version and ckpt.pool == models
    pool = ModelPool(
        PoolModel.from_config(
            PoolModelConfig(
                name=m,
                model=f"hosted_vllm/{m}",
                api_base="http://127.0.0.1:9/v1",
                price=ModelPrice(input=Decimal(1), output=Decimal(1)),
            ),
            None,  # type: ignore[arg-type]  # the explicit price means no catalog lookup
        )
        for m in models
    )
    policy = CompactPolicy(ckpt, pool, extractor=extractor)
    math_q = [{"role": "user", "content": "What is 12 times 7? Show the equation."}]
    poem_q = [{"role": "user", "content": "Write a short poem about the sea at night."}]

    def best(messages: list[dict[str, str]], lam: float) -> str:
        dist = policy.distribution(messages, lam)
        return max(dist, key=dist.__getitem__)

    assert best(math_q, 0.0) == "math-pro" and best(poem_q, 0.0) == "poet"
    assert best(poem_q, 1.0) == "cheap"


def test_seeded_runs_are_identical_and_features_are_cached(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    extractor: FeatureExtractor,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    full, _ = tables
    cfg = replace(FAST, seed=5, steps=20, eval_every=10, checkpoint_every=0)
    cache = tmp_path / "cache"
    a = train(full[:120], cfg, tmp_path / "a", extractor=extractor, cache_dir=cache)
    with caplog.at_level(logging.INFO, logger="training.compact.data"):
        b = train(full[:120], cfg, tmp_path / "b", extractor=extractor, cache_dir=cache)
    assert "features from cache" in caplog.text and len(list(cache.glob("features-*.npz"))) == 1
    wa, wb = load_checkpoint(a.checkpoint_path).weights, load_checkpoint(b.checkpoint_path).weights
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    c = train(full[:120], replace(FAST, seed=6, steps=20, eval_every=10, checkpoint_every=0),
              tmp_path / "c", extractor=extractor, cache_dir=cache)  # fmt: skip
    wc = load_checkpoint(c.checkpoint_path).weights
    assert not all(np.array_equal(wa[k], wc[k]) for k in wa)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="group_size"):
        TrainConfig(group_size=1)
    with pytest.raises(ValueError, match="lambda_min < lambda_max"):
        TrainConfig(lambda_min=1.0, lambda_max=0.5)


@pytest.mark.parametrize(
    "bad",
    [{"lr": float("inf")}, {"lambda_max": float("inf")}, {"cost_scale": float("nan")},
     {"reward_K": float("nan")}, {"dropout": float("nan")}, {"val_lambdas": (0.0, float("inf"))}],
)  # fmt: skip
def test_non_finite_settings_are_refused(bad: dict[str, object]) -> None:
    # NaN slips through every range check (each comparison with it is false), inf through
    # the upper-bound-free ones: both must be refused by name.
    name = next(iter(bad))
    with pytest.raises(ValueError, match=rf"{name} must be finite"):
        TrainConfig(**bad)  # type: ignore[arg-type]


def test_validation_can_fall_back_to_the_off_policy_estimate_in_any_mode() -> None:
    # `validate` estimates off-policy whenever a validation row lacks an outcome, in GRPO
    # mode too: the estimator must be imported for every mode, not in --offpolicy's branch.
    import training.compact.trainer as trainer
    from training.compact.offpolicy import evaluate_logged

    assert vars(trainer).get("evaluate_logged") is evaluate_logged
