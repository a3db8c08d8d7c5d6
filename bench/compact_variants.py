"""The compact policy's trainer knobs on RouterBench, judged on validation only.

Trains one checkpoint per variant of ``TrainConfig`` (the default, other seeds, and one knob
changed at a time) on the 0-shot subset's training part and prints, on the validation part:
AIQ over the single models' cost range (λ swept over 0 and 60 geometric steps from 1e-4 to
30, greedy decisions), and the λ = 0 operating point. The test part is not read.

Usage::

    .venv/bin/python bench/compact_variants.py [--data DIR] ['{"seed": 1}' ...]

Each run takes 10-20 s on this machine's two cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from compact_routerbench import curve, load  # noqa: E402
from routerbench_data import GPT4, add_data_argument  # noqa: E402

from router.checkpoint import load_checkpoint  # noqa: E402
from router.features import FeatureExtractor  # noqa: E402
from router.policies.compact import CompactHead  # noqa: E402
from training.compact.config import TrainConfig  # noqa: E402
from training.compact.data import TableArrays, cached_features  # noqa: E402
from training.compact.trainer import train  # noqa: E402
from training.datasets.splits import split_of  # noqa: E402
from training.evaluation.metrics import CurvePoint, aiq  # noqa: E402

VARIANTS: list[dict[str, Any]] = [
    {},
    {"seed": 1},
    {"seed": 2},
    {"entropy_coef": 0.01},
    {"entropy_coef": 0.1},
    {"group_size": 16},
    {"lambda_zero_prob": 0.3},
    {"lambda_min": 1e-4},
    {"advantage_std_floor": 0.02},
    {"explore_epsilon": 0.3},
    {"weight_decay": 0.01},
    {"dropout": 0.3},
    {"hidden": [64]},
    {"lr": 3e-4, "steps": 3000},
    {"batch_size": 128},
    {"reward_form": "additive"},
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(parser)
    parser.add_argument("variants", nargs="*", help="TrainConfig overrides as JSON objects")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    variants = [json.loads(v) for v in args.variants] or VARIANTS
    records = load(args.data)
    extractor = FeatureExtractor.load()
    grid = np.concatenate([[0.0], np.geomspace(1e-4, 30.0, 60)])
    with tempfile.TemporaryDirectory(prefix="xrouter-variants-") as tmp:
        cache = Path(tmp) / "cache"  # features are computed once for all variants
        for i, overrides in enumerate(variants):
            if "hidden" in overrides:
                overrides = {**overrides, "hidden": tuple(overrides["hidden"])}
            cfg = TrainConfig(checkpoint_every=0, progress=False, **overrides)
            # The validation part of the split the variant trains on (split_seed, default 0).
            split = np.array([split_of(r.split_key, seed=cfg.split_seed) for r in records])
            started = time.perf_counter()
            res = train(records, cfg, Path(tmp) / f"run{i}", extractor=extractor, cache_dir=cache)
            ckpt = load_checkpoint(res.checkpoint_path)
            head = CompactHead.from_checkpoint(ckpt)
            arrays = TableArrays.from_records(records, ckpt.pool)
            x = cached_features(arrays.conversations, extractor, cache)
            rows = np.flatnonzero(split == "validation")
            val = arrays.subset(rows)
            acc, cost = curve(head, x[rows], val, grid)
            single_costs = val.cost.mean(axis=0)
            area = aiq(
                [CurvePoint(cost=float(c), score=float(a)) for a, c in zip(acc, cost, strict=True)],
                float(single_costs.min()),
                float(single_costs.max()),
            )
            g_cost = float(val.cost[:, ckpt.pool.index(GPT4)].mean())
            print(
                f"{json.dumps(overrides) if overrides else 'default':<40} validation AIQ "
                f"{area:.4f}; λ=0: {acc[0]:.3f} at {100 * cost[0] / g_cost:.1f}% of GPT-4's "
                f"cost; best step {res.best_step} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
