"""Learning a router from logged traffic (partial feedback) on RouterBench, judged on the
full-information test part (prints figures).

    .venv/bin/python bench/offpolicy_routerbench.py [--data ../shared/data/routerbench_zs]
        [--seed 0] [--epsilon 0.2] [--bootstrap 1000]

The gateway's logged traffic says, per request, which model the deployed router chose, with
what probability, and only that model's outcome. This script makes such traffic from
RouterBench's full table, so that what a router learns from it can be scored on outcomes
the logs never showed:

- ``uniform``: every model with probability 1/11 (the best case for off-policy learning);
- ``epsilon``: a deployed default (gpt-3.5-turbo) with probability 1 − ε, every model
  uniformly with ε — what a gateway with ``router.epsilon: ε`` over a fixed choice logs.

For each, on the training and validation parts' logs (split 60/20/20 by id hash, as
everywhere), it trains the policy network off-policy (``xrouter train --offpolicy``,
SNIPS and DR) and builds a kNN checkpoint from the logs (``--offpolicy --knn``, doubly-robust
outcome estimates), then sweeps each through the serving loop over the test part's full
table and reports AIQ with paired-bootstrap intervals, next to the same two kinds built
from the full table (what full feedback would buy) and the logging policy itself. Nothing
here touches the test part's logs. RouterBench may not be redistributed: every table and
checkpoint stays in a temporary directory.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from routerbench_data import add_data_argument, load_records, split_parts  # noqa: E402

from router.outcomes import OutcomeRecord  # noqa: E402
from training.compact.config import TrainConfig  # noqa: E402
from training.compact.knn import build_knn  # noqa: E402
from training.compact.trainer import train  # noqa: E402
from training.evaluation.baselines import SingleModelRouter  # noqa: E402
from training.evaluation.compare import Entry, compare  # noqa: E402
from training.evaluation.registry import LoadContext, default_registry  # noqa: E402
from training.evaluation.sweep import OfflineRouter  # noqa: E402
from training.evaluation.utility import lambda_grid  # noqa: E402

log = logging.getLogger("offpolicy_routerbench")

DEPLOYED = "gpt-3.5-turbo-1106"


def logged(
    records: Sequence[OutcomeRecord], models: list[str], epsilon: float | None, seed: int
) -> list[OutcomeRecord]:
    """The traffic a router would log on these prompts: one model per prompt, drawn from
    the logging policy, with its propensity and only its outcome. ``epsilon`` None: uniform."""
    rng = np.random.default_rng(seed)
    p = np.full(len(models), 1 / len(models))
    if epsilon is not None:
        p = p * epsilon
        p[models.index(DEPLOYED)] += 1 - epsilon
    out = []
    for r in records:
        a = int(rng.choice(len(models), p=p))
        m = models[a]
        body = r.model_dump(exclude_none=True)
        body["outcomes"] = {m: body["outcomes"][m]}
        body["logged"] = {"action": m, "propensity": float(p[a])}
        out.append(OutcomeRecord.model_validate(body))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="split seed and logging seed")
    parser.add_argument("--epsilon", type=float, default=0.2)
    parser.add_argument("--bootstrap", type=int, default=1000, metavar="N")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("training", "router", "LiteLLM"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    started = time.perf_counter()
    records = load_records(args.data)
    if records is None:
        return 2
    parts = split_parts(records, args.seed)
    models = list(records[0].outcomes)
    known = parts.train + parts.validation  # the test part is never logged
    ctx = LoadContext(parts.train, parts.validation, seed=0)
    lambdas = lambda_grid(
        np.array([np.mean([r.outcomes[m].cost_usd or 0.0 for r in parts.train]) for m in models])
    )
    tmp = tempfile.TemporaryDirectory(prefix="xrouter-offpolicy-")
    root = Path(tmp.name)
    entries: list[Entry] = []

    def add(label: str, checkpoint: Path) -> None:
        router: OfflineRouter = default_registry().load(f"compact:{checkpoint}", ctx)
        router.name = label
        entries.append(Entry(router, "policy", lambdas))

    base = {"split_seed": args.seed, "checkpoint_every": 0, "progress": False}
    # What full feedback buys: the same two kinds built from the full table.
    t0 = time.perf_counter()
    add(
        "network, full table",
        train(records, TrainConfig(**base), root / "full-net").checkpoint_path,
    )
    add(
        "kNN, full table",
        build_knn(records, TrainConfig(**base), root / "full-knn").checkpoint_path,
    )
    log.info("full-table checkpoints in %.0fs", time.perf_counter() - t0)

    policies = {"uniform": None, f"epsilon={args.epsilon:g}": args.epsilon}
    for name, eps in policies.items():
        logs = logged(known, models, eps, args.seed)
        off = {**base, "offpolicy": True}
        t0 = time.perf_counter()
        for estimator in ("snips", "dr"):
            cfg = TrainConfig(**off, estimator=estimator)
            run = train(logs, cfg, root / f"{name}-net-{estimator}", pool=models)
            add(f"network, {name} logs, {estimator}", run.checkpoint_path)
        cfg = TrainConfig(**off, estimator="dr")
        add(
            f"kNN, {name} logs",
            build_knn(logs, cfg, root / f"{name}-knn", pool=models).checkpoint_path,
        )
        log.info(
            "%s: logged %d prompts, learned in %.0fs", name, len(logs), time.perf_counter() - t0
        )
    entries.append(Entry(SingleModelRouter(DEPLOYED)))

    full = compare(entries, parts.test, bootstrap=args.bootstrap)
    tmp.cleanup()
    print()
    print(
        f"RouterBench 0-shot, split seed {args.seed}: learned on {len(known)} logged prompts "
        f"(train {len(parts.train)}, validation {len(parts.validation)}), scored on the full "
        f"table of the {full.n_records} test prompts; no-routing AIQ {full.no_routing_aiq:.4f}"
    )
    print(f"{'router':<34} {'AIQ':>7} {'95% interval':>18} {'vs no routing, 95%':>26}")
    for e in entries:
        c = full.curve(e.router.name)
        ci = f"[{c.aiq_ci.low:.4f}, {c.aiq_ci.high:.4f}]" if c.aiq_ci else ""
        gain = str(c.gain_ci) if c.gain_ci else f"{c.aiq - full.no_routing_aiq:+.4f}"
        print(f"{e.router.name:<34} {c.aiq:>7.4f} {ci:>18} {gain:>26}")
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
