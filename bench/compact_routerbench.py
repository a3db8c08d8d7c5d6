"""The compact router on RouterBench (0-shot subset: ARC-Challenge, Winogrande, MBPP; 11 models).

    .venv/bin/python bench/compact_routerbench.py [--data ../shared/data/routerbench_zs] [--steps 1500]

Reads the wide CSVs directly (rows with a missing score or cost are dropped), splits 60/20/20
by a hash of ``sample_id``, trains one λ-conditioned checkpoint on the training split (the
best step is chosen on validation), and prints held-out test figures: average score and
cost per prompt at several cost weights λ, and the share of GPT-4's cost
(gpt-4-1106-preview) needed to match GPT-4's test accuracy — both with λ chosen on the
validation split (the honest figure) and read off the test curve (the figure papers quote).
The run directory is temporary: RouterBench has no redistribution license, so neither its
data nor checkpoints trained on it go into the repository.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from routerbench_data import GPT4, add_data_argument, load_records  # noqa: E402

from router.checkpoint import load_checkpoint  # noqa: E402
from router.features import FeatureExtractor  # noqa: E402
from router.outcomes import OutcomeRecord  # noqa: E402
from router.policies.compact import CompactHead  # noqa: E402
from training.compact.config import TrainConfig  # noqa: E402
from training.compact.data import TableArrays, cached_features  # noqa: E402
from training.compact.trainer import train  # noqa: E402
from training.datasets.splits import split_of  # noqa: E402

REPORT_LAMBDAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


def load(data: Path) -> list[OutcomeRecord]:
    records = load_records(data, with_responses=False)  # the network reads no responses
    if records is None:
        raise SystemExit(2)
    return records


def curve(
    head: CompactHead, x: np.ndarray, arrays: TableArrays, lambdas: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Mean score and mean cost per prompt of the greedy policy at each λ."""
    rows = np.arange(len(x))
    acc, cost = [], []
    for lam in lambdas:
        choice = head.logits(x, float(lam)).argmax(axis=1)
        acc.append(arrays.score[rows, choice].mean())
        cost.append(arrays.cost[rows, choice].mean())
    return np.array(acc), np.array(cost)


def cheapest_matching(acc: np.ndarray, cost: np.ndarray, target: float) -> int | None:
    ok = np.flatnonzero(acc >= target - 1e-12)
    return int(ok[np.argmin(cost[ok])]) if ok.size else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_argument(parser)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    records = load(args.data)
    split = np.array([split_of(r.split_key) for r in records])
    print(f"RouterBench 0-shot: {len(records)} prompts x {len(records[0].outcomes)} models; "
          f"train/val/test = {[int((split == s).sum()) for s in ('train', 'validation', 'test')]}")  # fmt: skip
    extractor = FeatureExtractor.load()
    cfg = TrainConfig(steps=args.steps, seed=args.seed, checkpoint_every=0, progress=False)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xrouter-rb-") as tmp:
        res = train(records, cfg, Path(tmp) / "run", extractor=extractor)
        ckpt = load_checkpoint(res.checkpoint_path)
    seconds = time.perf_counter() - started
    head = CompactHead.from_checkpoint(ckpt)
    arrays = TableArrays.from_records(records, ckpt.pool)
    x = cached_features(arrays.conversations, extractor, None)
    parts = {s: np.flatnonzero(split == s) for s in ("validation", "test")}
    sub = {s: arrays.subset(rows) for s, rows in parts.items()}
    g = ckpt.pool.index(GPT4)
    gpt4 = {s: (a.score[:, g].mean(), a.cost[:, g].mean()) for s, a in sub.items()}
    tc = ckpt.metadata.training["config"]
    print(f"trained {args.steps} steps in {seconds:.0f} s on λ in [{tc['lambda_min']:g}, {tc['lambda_max']:g}] "
          f"(best validation step {res.best_step}); feature version {ckpt.feature_version}")  # fmt: skip

    t = sub["test"]
    acc, cost = curve(head, x[parts["test"]], t, np.array(REPORT_LAMBDAS))
    print(f"\nheld-out test split ({len(parts['test'])} prompts), greedy decisions:")
    print(f"{'λ':>6} {'avg score':>10} {'avg cost $':>12} {'cost / GPT-4':>13}")
    for lam, a, c in zip(REPORT_LAMBDAS, acc, cost, strict=True):
        print(f"{lam:>6g} {a:>10.3f} {c:>12.6f} {c / gpt4['test'][1]:>12.1%}")
    single = [(m, t.score[:, j].mean(), t.cost[:, j].mean()) for j, m in enumerate(ckpt.pool)]
    cheapest = min(single, key=lambda s: s[2])
    print(f"{'GPT-4':>6} {gpt4['test'][0]:>10.3f} {gpt4['test'][1]:>12.6f} {1:>12.0%}   ({GPT4})")
    print(
        f"{'cheap':>6} {cheapest[1]:>10.3f} {cheapest[2]:>12.6f} {cheapest[2] / gpt4['test'][1]:>12.1%}   ({cheapest[0]})"
    )
    print(f"{'oracle':>6} {t.score.max(axis=1).mean():>10.3f}")

    # Matching GPT-4: a fine λ grid; pick λ on validation, report on test.
    grid = np.concatenate([[0.0], np.geomspace(1e-3, 30.0, 80)])
    v_acc, v_cost = curve(head, x[parts["validation"]], sub["validation"], grid)
    t_acc, t_cost = curve(head, x[parts["test"]], t, grid)
    print(
        f"\nmatching GPT-4 accuracy (test {gpt4['test'][0]:.3f} at ${gpt4['test'][1]:.6f}/prompt):"
    )
    for frac in (1.0, 0.95, 0.9):
        label = "GPT-4's accuracy" if frac == 1.0 else f"{frac:.0%} of GPT-4's accuracy"
        i = cheapest_matching(v_acc, v_cost, frac * gpt4["validation"][0])
        j = cheapest_matching(t_acc, t_cost, frac * gpt4["test"][0])
        val_part = (
            f"λ chosen on validation = {grid[i]:.3g}: test accuracy {t_acc[i]:.3f} at "
            f"{t_cost[i] / gpt4['test'][1]:.1%} of GPT-4's cost"
            if i is not None
            else f"no λ reaches it on validation (best {v_acc.max():.3f})"
        )
        test_part = (
            f"test curve: {t_cost[j] / gpt4['test'][1]:.1%} of the cost (λ = {grid[j]:.3g})"
            if j is not None
            else f"test curve: not reached (best {t_acc.max():.3f})"
        )
        print(f"  {label}: {val_part}; {test_part}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
