"""Small compact checkpoints and pools for the checkpoint tests: three priced models and a
network of random weights (what the format checks, not what routes well)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np

from pricing import ModelPrice, PriceCatalog
from router.checkpoint import Architecture, CheckpointMetadata
from router.pool import ModelPool, PoolModelConfig

MODELS = ["small", "medium", "large"]
PRICES = {"small": ("0.1", "0.2"), "medium": ("0.5", "1.5"), "large": ("3", "15")}


def make_pool(names: list[str], prices: dict[str, tuple[str, str]] | None = None) -> ModelPool:
    table = {**PRICES, **(prices or {})}
    catalog = PriceCatalog(
        {n: ModelPrice(input=Decimal(table[n][0]), output=Decimal(table[n][1])) for n in names}
    )
    return ModelPool.from_configs(
        [
            PoolModelConfig(name=n, model=f"hosted_vllm/{n}", api_base="http://127.0.0.1:9/v1")
            for n in names
        ],
        catalog,
    )


def make_checkpoint(
    seed: int = 0, created: dt.datetime | None = None
) -> tuple[CheckpointMetadata, dict[str, np.ndarray]]:
    arch = Architecture(input_dim=6, hidden=(5, 4), n_actions=len(MODELS))
    rng = np.random.default_rng(seed)
    weights = {k: rng.normal(size=s).astype(np.float32) for k, s in arch.weight_shapes().items()}
    weights["input_std"] = np.abs(weights["input_std"]) + np.float32(0.5)
    meta = CheckpointMetadata(
        name=f"test-{seed}",
        pool=MODELS,
        prices=make_pool(MODELS).price_snapshot(),
        feature_version="fx1-test",
        architecture=arch,
        reward={"form": "gated"},
        training={"steps": 3},
        metrics={"validation_mean_reward": 0.5},
        created_at=created or dt.datetime.now(dt.UTC),
    )
    return meta, weights
