"""Learned escalation (training/evaluation/escalation.py) on RouterBench's 0-shot subset:
how close does "cheap models first, escalate when a classifier doubts their answers" get to
GPT-4's accuracy, and at what share of GPT-4's cost?

Same data and split as ``bench/routing_quality.py`` (``../shared/data/routerbench_zs``,
60/20/20 by id hash, seed 0). Every configuration of a small grid is fitted on train; the
configuration with the best validation accuracy at a mean cost of at most 50% of GPT-4's
validation cost is kept (ties: the lower validation cost to reach GPT-4's validation accuracy);
its operating points for the 50% and 30% budgets (cost weights λ) are chosen on validation too.
Test is touched once, for the report: the test accuracy and cost at those two validation-chosen
λ, and the cost at which the test λ-sweep's hull first reaches GPT-4's test accuracy (the
metric ``routing_quality.py`` reports for every router). The existing verifier cascade
(Mixtral, Yi -> GPT-4) is printed for reference.

Usage::

    .venv/bin/python bench/escalation_routerbench.py [--data DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from routerbench_data import (  # noqa: E402
    GPT4,
    HAND_PLANS,
    MIXTRAL,
    YI,
    add_data_argument,
    load_records,
    split_parts,
)

from router.outcomes import OutcomeRecord  # noqa: E402
from training.evaluation.bootstrap import mean_difference  # noqa: E402
from training.evaluation.cascade import CascadeRouter  # noqa: E402
from training.evaluation.escalation import EscalationRouter, best_under_budget  # noqa: E402
from training.evaluation.metrics import cost_to_reach  # noqa: E402
from training.evaluation.sweep import sweep  # noqa: E402

log = logging.getLogger("escalation_routerbench")

BUDGETS = (0.5, 0.3)

# The grid: automatic plans (per task the most accurate models costing <= 10% of the final
# model's), plus one hand-written plan (more cheap voters on ARC, MBPP to one cheap coder).
GRID: list[dict[str, Any]] = [
    {"max_cheap": 3, "first": 2, "l2": 10.0},
    {"max_cheap": 4, "first": 3, "l2": 10.0},
    {"max_cheap": 3, "first": 2, "l2": 30.0},
    {
        "max_cheap": 4,
        "first": 2,
        "l2": 10.0,
        "plans": HAND_PLANS,
    },
]


def mean(records: Sequence[OutcomeRecord], model: str, what: str) -> float:
    return float(np.mean([getattr(r.outcomes[model], what) for r in records]))


def hull_reach_pct(
    router: EscalationRouter, records: Sequence[OutcomeRecord], target: float, ref_cost: float
) -> float | None:
    reach = cost_to_reach(sweep(router, records).points, target)
    return None if reach is None else 100.0 * reach / ref_cost


def describe(cfg: dict[str, Any]) -> str:
    return ",".join(f"{k}={'custom' if k == 'plans' else v}" for k, v in cfg.items())


def per_task(router: EscalationRouter, records: Sequence[OutcomeRecord], lam: float) -> str:
    routed = router.route(records, lam)
    parts = []
    for task in sorted({r.task or "*" for r in records}):
        idx = [i for i, r in enumerate(records) if (r.task or "*") == task]
        acc = np.mean([routed[i].score for i in idx])
        gpt4 = np.mean([records[i].outcomes[GPT4].score for i in idx])
        called = np.mean([GPT4 in routed[i].models_called for i in idx])
        parts.append(f"{task} {acc:.3f} (GPT-4 {gpt4:.3f}, GPT-4 called {100 * called:.0f}%)")
    return "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(parser)
    parser.add_argument("--seed", default="0", help="split seed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.perf_counter()
    records = load_records(args.data)
    if records is None:
        return 2
    parts = split_parts(records, args.seed)
    train, val, test = parts.train, parts.validation, parts.test
    val_acc, val_cost = mean(val, GPT4, "score"), mean(val, GPT4, "cost_usd")

    # -- choose the configuration on validation -------------------------------------------
    best: tuple[tuple[float, float], dict[str, Any], EscalationRouter] | None = None
    for cfg in GRID:
        router = EscalationRouter(**cfg).fit(train)
        point = best_under_budget(router, val, BUDGETS[0] * val_cost)
        reach = hull_reach_pct(router, val, val_acc, val_cost)
        key = (point[1] if point else 0.0, -(reach if reach is not None else 1e9))
        log.info(
            "  %-45s val acc @<=50%% %.4f, val hull reaches GPT-4 at %s",
            describe(cfg),
            key[0],
            "never" if reach is None else f"{reach:.1f}%",
        )
        if best is None or key > best[0]:
            best = (key, cfg, router)
    assert best is not None
    _, cfg, router = best
    chosen = {b: best_under_budget(router, val, b * val_cost) for b in BUDGETS}

    # -- report on test ---------------------------------------------------------------------
    test_acc, test_cost = mean(test, GPT4, "score"), mean(test, GPT4, "cost_usd")
    test_reach = hull_reach_pct(router, test, test_acc, test_cost)
    reference = CascadeRouter([MIXTRAL, YI, GPT4], k=2)
    ref = sweep(reference, test, [0.0]).points[0]
    print()
    print(
        f"RouterBench 0-shot, split seed {args.seed}: train {len(train)} / validation "
        f"{len(val)} / test {len(test)} prompts"
    )
    print(f"chosen on validation: escalation {describe(cfg)}")
    for task, plan in sorted(router.plans.items()):
        print(f"  {task}: cheap {' > '.join(plan.cheap)} (first {plan.first}) -> {plan.final}")
    print(f"GPT-4 accuracy: validation {val_acc:.4f}, test {test_acc:.4f}")
    print()
    for b, point in chosen.items():
        if point is None:
            print(f"budget {100 * b:.0f}%: no validation operating point that cheap")
            continue
        lam, v_score, v_cost = point
        routed = router.route(test, lam)
        t_score = float(np.mean([r.score for r in routed]))
        t_cost = float(np.mean([r.cost_usd for r in routed]))
        # Paired over the same test prompts: how sure the gap to GPT-4 is.
        gap = mean_difference(
            np.array([r.score for r in routed]),
            np.array([r.outcomes[GPT4].score for r in test]),
            samples=2000,
        )
        print(
            f"budget {100 * b:.0f}% (λ={lam:.4g} chosen on validation): validation accuracy "
            f"{v_score:.4f} at {100 * v_cost / val_cost:.1f}% of GPT-4's cost; TEST accuracy "
            f"{t_score:.4f} at {100 * t_cost / test_cost:.1f}% of GPT-4's cost "
            f"(vs GPT-4 {gap.estimate:+.4f}, 95% paired-bootstrap interval "
            f"[{gap.low:+.4f}, {gap.high:+.4f}])"
        )
        print(f"    test per task: {per_task(router, test, lam)}")
    print(
        "test λ-sweep hull reaches GPT-4's test accuracy at "
        + ("never" if test_reach is None else f"{test_reach:.1f}% of GPT-4's cost")
    )
    print(
        f"reference: verifier cascade Mixtral, Yi -> GPT-4: test accuracy {ref.score:.4f} at "
        f"{100 * ref.cost / test_cost:.1f}% of GPT-4's cost"
    )
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
