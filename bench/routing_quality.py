"""Routing quality on RouterBench (held-out test split): AIQ, cost to match GPT-4, APGR.

Reads the RouterBench 0-shot subset from ``../shared/data/routerbench_zs`` (relative to the
repository root; it is research-use data and is never copied into the project), converts
the three CSVs in memory, splits by id hash (60% train / 20% validation / 20% test, seed 0),
fits every router on train, picks each router's hyper-parameters — for kNN, MF and the
cascade also their prompt features, TF-IDF or the compact policy's static embedding — on
validation only (by validation AIQ, or APGR on the two-model slice), and reports on test:

- AIQ over [cheapest, dearest single model cost] and the no-routing AIQ (single models'
  hull, which contains their random mixes);
- the cost at which each router's curve first reaches GPT-4's (gpt-4-1106-preview) test
  accuracy, as % of GPT-4's cost;
- APGR on the two-model slice gpt-4-1106-preview vs mistralai/mixtral-8x7b-chat, against a
  random router.

Usage::

    .venv/bin/python bench/routing_quality.py [--data DIR] [--seed 0] [--embedding both|tfidf|static]
        [--import MODULE] [--policy SPEC ...] [--quick] [--no-compact] [--no-pairs] [--bootstrap N]

``--policy`` adds routers from ``training.evaluation.registry`` (baselines or loaders that an
``--import``-ed module registers with ``register_router_loader``), fitted on train.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from routerbench_data import (  # noqa: E402
    GPT4,
    HAND_PLANS,
    MIXTRAL,
    add_data_argument,
    load_records,
    split_parts,
)

from router.outcomes import OutcomeRecord  # noqa: E402
from training.evaluation.baselines import (  # noqa: E402
    KNNRouter,
    MFRouter,
    OracleRouter,
    RandomMixRouter,
    SingleModelRouter,
)
from training.evaluation.bootstrap import Interval, PromptCurve, apgr_intervals  # noqa: E402
from training.evaluation.cascade import CascadeFamilyRouter, CascadeRouter  # noqa: E402
from training.evaluation.compare import Comparison, Entry, compare  # noqa: E402
from training.evaluation.embedding import HashingTfidfEmbedder  # noqa: E402
from training.evaluation.escalation import EscalationRouter  # noqa: E402
from training.evaluation.metrics import apgr  # noqa: E402
from training.evaluation.registry import LoadContext, default_registry  # noqa: E402
from training.evaluation.sweep import OfflineRouter, restrict_models, sweep  # noqa: E402
from training.evaluation.utility import lambda_grid  # noqa: E402

log = logging.getLogger("routing_quality")


class CachedEmbedding:
    """Memoizes an embedding by text, so tuning many routers embeds each prompt once."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray]) -> None:
        self._embed = embed
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            for t, v in zip(missing, self._embed(missing), strict=True):
                self._cache[t] = v
        return np.stack([self._cache[t] for t in texts])


def make_embedding(kind: str, train: Sequence[OutcomeRecord]) -> CachedEmbedding:
    if kind == "static":
        from router.features.embedding import StaticEmbedding

        static = StaticEmbedding.load()
        return CachedEmbedding(lambda texts: static.encode(texts))
    return CachedEmbedding(HashingTfidfEmbedder().fit([r.text for r in train]))


Grid = list[tuple[str, Callable[[], Any]]]


def make_embeddings(kind: str, train: Sequence[OutcomeRecord]) -> dict[str, CachedEmbedding]:
    """The prompt features the prompt-only baselines may use: TF-IDF fitted on the training
    prompts, the static embedding the compact policy runs on, or both (``both``: which one a
    baseline uses is then one more hyper-parameter picked on validation)."""
    kinds = ("tfidf", "static") if kind == "both" else (kind,)
    return {k: make_embedding(k, train) for k in kinds}


def over_embeddings(
    make_grid: Callable[[CachedEmbedding, bool], Grid],
    embeds: dict[str, CachedEmbedding],
    quick: bool,
) -> Grid:
    """``make_grid`` once per embedding, each candidate's name tagged with it."""
    return [
        (f"{name}@{kind}", build)
        for kind, embed in embeds.items()
        for name, build in make_grid(embed, quick)
    ]


def knn_grid(embed: CachedEmbedding, quick: bool) -> list[tuple[str, Callable[[], Any]]]:
    ks = (25, 100, 400) if quick else (10, 25, 50, 100, 200, 400)
    return [(f"knn:k={k}", functools.partial(KNNRouter, k=k, embed=embed)) for k in ks]


def mf_grid(embed: CachedEmbedding, quick: bool) -> list[tuple[str, Callable[[], Any]]]:
    configs: list[dict[str, Any]] = [
        {"dim": 32, "l2": 1e-3, "epochs": 100},
        {"dim": 16, "l2": 3e-3, "epochs": 150},
    ]
    if not quick:
        configs += [{"dim": 64, "l2": 1e-3, "epochs": 100}, {"dim": 32, "l2": 3e-4, "epochs": 60}]
    return [
        (
            "mf:" + ",".join(f"{k}={v}" for k, v in c.items()),
            functools.partial(MFRouter, embed=embed, **c),
        )
        for c in configs
    ]


def cascade_grid(embed: CachedEmbedding, quick: bool) -> list[tuple[str, Callable[[], Any]]]:
    configs: list[dict[str, Any]] = [
        {"max_cheap": 4},
        {"max_cheap": 4, "local_k": 400},
        {"max_cheap": 4, "quorums": (2, 3), "batch_sizes": (2, 3), "local_k": 400},
    ]
    if not quick:
        configs += [
            {"max_cheap": 5, "quorums": (2, 3), "batch_sizes": (2, 3)},
            {"max_cheap": 4, "local_k": 200},
        ]
    return [
        (
            "cascade:" + ",".join(f"{k}={v}" for k, v in c.items()),
            functools.partial(CascadeFamilyRouter, embed=embed, **c),
        )
        for c in configs
    ]


def escalation_grid() -> list[tuple[str, Callable[[], Any]]]:
    """Learned escalation (see bench/escalation_routerbench.py, which picks its operating
    points for a budget on validation); here it is tuned by validation AIQ like the rest."""
    configs: list[dict[str, Any]] = [
        {"max_cheap": 3, "first": 2, "l2": 10.0},
        {
            "max_cheap": 4,
            "first": 2,
            "l2": 10.0,
            "plans": HAND_PLANS,
        },
    ]
    return [
        (
            "escalation:"
            + ",".join(f"{k}={'custom' if k == 'plans' else v}" for k, v in c.items()),
            functools.partial(EscalationRouter, **c),
        )
        for c in configs
    ]


def tune(
    label: str,
    grid: list[tuple[str, Callable[[], Any]]],
    train: Sequence[OutcomeRecord],
    val: Sequence[OutcomeRecord],
    score: Callable[[Comparison], float],
) -> tuple[str, OfflineRouter]:
    """Fit every candidate on train; keep the one with the best validation score."""
    best: tuple[float, str, OfflineRouter] | None = None
    for name, build in grid:
        t0 = time.perf_counter()
        router = build().fit(train)
        router.name = label
        value = score(compare([Entry(router)], val))
        log.info("  %-60s val %.4f (%.1fs)", name, value, time.perf_counter() - t0)
        if best is None or value > best[0]:
            best = (value, name, router)
    assert best is not None
    log.info("%s: picked %s on validation", label, best[1])
    return best[1], best[2]


def val_aiq(label: str) -> Callable[[Comparison], float]:
    return lambda comp: comp.curve(label).aiq


def val_apgr(label: str) -> Callable[[Comparison], float]:
    return lambda comp: comp.curve(label).apgr or 0.0


def verifier_cascades(
    train: Sequence[OutcomeRecord], val: Sequence[OutcomeRecord], weak: str, strong: str
) -> tuple[str, OfflineRouter]:
    """On a two-model slice a cascade needs a second cheap opinion: call the weak model and a
    cheap verifier; escalate to the strong model when they disagree. The verifier is picked
    on validation by APGR (one operating point joined to the all-weak and all-strong ends)."""
    models = list(train[0].outcomes)
    cost = {m: np.mean([r.outcomes[m].cost_usd or 0.0 for r in train]) for m in models}
    candidates = [m for m in models if m not in (weak, strong) and cost[m] < cost[strong]]
    grid = [
        (f"cascade:{weak}>{v}>{strong}", functools.partial(CascadeRouter, [weak, v, strong], k=2))
        for v in candidates
    ]
    best: tuple[float, str, OfflineRouter] | None = None
    for name, build in grid:
        router = build()
        router.name = "cascade+verifier"
        value = _verifier_apgr(router, val, weak, strong)
        log.info("  %-60s val APGR %.4f", name, value)
        if best is None or value > best[0]:
            best = (value, name, router)
    assert best is not None
    log.info("cascade+verifier: picked %s on validation", best[1])
    return best[1], best[2]


def _verifier_apgr(
    router: OfflineRouter, records: Sequence[OutcomeRecord], weak: str, strong: str
) -> float:
    point = sweep(router, records, [0.0]).points[0]
    q_weak = float(np.mean([r.outcomes[weak].score for r in records]))
    q_strong = float(np.mean([r.outcomes[strong].score for r in records]))
    return apgr([(point.calls.get(strong, 0.0), point.score)], q_weak, q_strong)


def every_pair(
    train: Sequence[OutcomeRecord],
    val: Sequence[OutcomeRecord],
    test: Sequence[OutcomeRecord],
    embeds: dict[str, CachedEmbedding],
    strong: str,
    quick: bool,
    bootstrap: int,
) -> list[tuple[str, float, float, float, float, str, Interval | None]]:
    """RouteLLM's setting for every weak model: ``strong`` against each model that is both
    less accurate and cheaper on train. kNN and MF are tuned on the slice's validation APGR
    and scored on its test part, with the seeded random mix measured too; of the two, the one
    with the better validation APGR is the slice's pick. Rows: (weak, weak's train accuracy,
    random, kNN, MF test APGR, the pick, the pick's paired-bootstrap APGR interval)."""
    models = list(train[0].outcomes)
    acc = {m: np.mean([r.outcomes[m].score for r in train]) for m in models}
    cost = {m: np.mean([r.outcomes[m].cost_usd or 0.0 for r in train]) for m in models}
    rows = []
    for weak in sorted(models, key=lambda m: -acc[m]):
        if weak == strong or not (acc[weak] < acc[strong] and cost[weak] < cost[strong]):
            continue
        pair = [strong, weak]
        s_train, s_val, s_test = (restrict_models(x, pair) for x in (train, val, test))
        routers: list[OfflineRouter] = [RandomMixRouter(weak, strong, seed=0)]
        for label, grid in (
            ("knn", over_embeddings(knn_grid, embeds, quick)),
            ("mf", over_embeddings(mf_grid, embeds, quick)),
        ):
            routers.append(tune(label, grid, s_train, s_val, val_apgr(label))[1])
        on_val = compare([Entry(r) for r in routers[1:]], s_val, strong, weak)
        pick = max(("knn", "mf"), key=lambda n: on_val.curve(n).apgr or 0.0)
        comp = compare([Entry(r) for r in routers], s_test, strong, weak, bootstrap)
        ap = [comp.curve(r.name).apgr or 0.0 for r in routers]
        rows.append((weak, float(acc[weak]), ap[0], ap[1], ap[2], pick, comp.curve(pick).apgr_ci))
    return rows


def train_compact(
    records: Sequence[OutcomeRecord], run_dir: Path, seed: int, split_seed: int
) -> Path:
    """Train the compact policy with its default configuration (no knob tuned here) on this
    table. The trainer splits by the same id hash (60/20/20, ``split_seed``), fits on the
    training part, keeps the step with the best validation reward and never reads the test
    part. Returns the checkpoint; RouterBench may not be redistributed, so it stays in a
    temporary directory."""
    from training.compact.config import TrainConfig
    from training.compact.trainer import train

    cfg = TrainConfig(seed=seed, split_seed=split_seed, checkpoint_every=0, progress=False)
    return Path(train(records, cfg, run_dir).checkpoint_path)


def build_knn_checkpoint(records: Sequence[OutcomeRecord], run_dir: Path, split_seed: int) -> Path:
    """A kNN checkpoint (``xrouter train --knn``, k among 25..400 picked on validation) on
    this table's training part, served through the same loop as the compact policy."""
    from training.compact.config import TrainConfig
    from training.compact.knn import build_knn

    cfg = TrainConfig(split_seed=split_seed, checkpoint_every=0, progress=False)
    return Path(build_knn(records, cfg, run_dir).checkpoint_path)


def build_cascade_checkpoint(
    records: Sequence[OutcomeRecord], run_dir: Path, split_seed: int
) -> Path:
    """A cascade checkpoint (``xrouter train --cascade``, k among 50..400 picked on
    validation) on this table's training part: multi-call plans served through the loop."""
    from training.compact.cascade import build_cascade
    from training.compact.config import TrainConfig

    cfg = TrainConfig(split_seed=split_seed, checkpoint_every=0, progress=False)
    return Path(build_cascade(records, cfg, run_dir).checkpoint_path)


def fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def print_intervals(full: Comparison, names: Sequence[str]) -> None:
    """The test AIQ with paired-bootstrap intervals over the test prompts: each router's
    AIQ, its gain over no routing and, when the compact policy was trained, its AIQ minus
    the compact policy's (an interval that contains 0: this test split cannot tell the two
    apart)."""
    boot = full.bootstrap
    assert boot is not None
    pct = f"{100 * boot.level:g}%"
    print()
    print(
        f"test AIQ, {pct} paired-bootstrap intervals over the {full.n_records} test prompts "
        f"({boot.samples} resamples; routers not refitted); no-routing "
        f"{boot.no_routing.estimate:.4f} [{boot.no_routing.low:.4f}, {boot.no_routing.high:.4f}]"
    )
    ref = boot.reference
    header = f"{'router':<22} {'AIQ, ' + pct + ' interval':>24} {'AIQ - no-routing':>28}"
    if ref:
        header += f" {'AIQ - ' + ref:>28}"
    print(header)
    print("-" * len(header))
    for name in names:
        c = full.curve(name)
        assert c.aiq_ci is not None and c.gain_ci is not None
        line = (
            f"{name:<22} {c.aiq:>7.4f} [{c.aiq_ci.low:.4f}, {c.aiq_ci.high:.4f}] {c.gain_ci!s:>28}"
        )
        if ref:
            line += f" {str(c.vs_reference_ci) if c.vs_reference_ci else '':>28}"
        print(line)
    # The claims the README makes about the strongest routers, as paired intervals.
    pairs = [("cascade", "knn"), ("cascade", "mf"), ("knn", "mf")]
    if "compact-cascade" in names:
        pairs += [("compact-cascade", "knn"), ("compact-cascade", "mf")]
        pairs += [("compact-cascade", "cascade"), ("compact-cascade", "compact-knn")]
    for a, b in pairs:
        print(f"  AIQ({a}) - AIQ({b}): {boot.difference(a, b)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="split seed")
    parser.add_argument(
        "--embedding",
        choices=("tfidf", "static", "both"),
        default="both",
        help="prompt features of kNN, MF and the cascade (both: picked on validation)",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        help="module to import first (it may call register_router_loader)",
    )
    parser.add_argument(
        "--policy", action="append", default=[], help="extra router spec to compare"
    )
    parser.add_argument("--quick", action="store_true", help="smaller hyper-parameter grids")
    parser.add_argument(
        "--no-compact",
        action="store_true",
        help="skip training the compact policy on this table (about 20 s)",
    )
    parser.add_argument(
        "--no-pairs", action="store_true", help="skip the GPT-4-vs-every-cheaper-model APGR table"
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=2000,
        metavar="N",
        help="paired-bootstrap resamples of the test prompts for AIQ intervals (0: none)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    for module in args.imports:
        importlib.import_module(module)
    t_start = time.perf_counter()
    records = load_records(args.data)
    if records is None:
        return 2
    parts = split_parts(records, args.seed)
    train, val, test = parts.train, parts.validation, parts.test
    log.info(
        "%d records: %d train / %d validation / %d test",
        len(records),
        len(train),
        len(val),
        len(test),
    )
    embeds = make_embeddings(args.embedding, train)

    # -- full table: tune on validation, report on test ---------------------------------------
    chosen: dict[str, str] = {}
    routers: list[OfflineRouter] = [OracleRouter(), RandomMixRouter(seed=0).fit(train)]
    for label, grid in (
        ("knn", over_embeddings(knn_grid, embeds, args.quick)),
        ("mf", over_embeddings(mf_grid, embeds, args.quick)),
        ("cascade", over_embeddings(cascade_grid, embeds, args.quick)),
        ("escalation", escalation_grid()),
    ):
        chosen[label], router = tune(label, grid, train, val, val_aiq(label))
        routers.append(router)
    ctx = LoadContext(train, val, seed=0)
    specs = list(args.policy)
    tmp = tempfile.TemporaryDirectory(prefix="xrouter-rq-")
    labels: dict[str, str] = {}
    if not args.no_compact:
        t0 = time.perf_counter()
        ckpt = train_compact(records, Path(tmp.name) / "run", seed=0, split_seed=args.seed)
        log.info("compact: trained in %.0fs", time.perf_counter() - t0)
        specs.append(f"compact:{ckpt}")
        labels[f"compact:{ckpt}"] = "compact"
        t0 = time.perf_counter()
        knn_ckpt = build_knn_checkpoint(records, Path(tmp.name) / "knn", split_seed=args.seed)
        log.info("compact kNN checkpoint: built in %.0fs", time.perf_counter() - t0)
        specs.append(f"compact:{knn_ckpt}")
        labels[f"compact:{knn_ckpt}"] = "compact-knn"
        t0 = time.perf_counter()
        cas_ckpt = build_cascade_checkpoint(records, Path(tmp.name) / "cas", split_seed=args.seed)
        log.info("compact cascade checkpoint: built in %.0fs", time.perf_counter() - t0)
        specs.append(f"compact:{cas_ckpt}")
        labels[f"compact:{cas_ckpt}"] = "compact-cascade"
    policies = [default_registry().load(spec, ctx) for spec in specs]
    for spec, policy in zip(specs, policies, strict=True):
        policy.name = labels.get(spec, policy.name)
    # Policies (served through the orchestration loop) are swept over the same λ grid as
    # `xrouter eval` gives them.
    lambdas = lambda_grid(
        np.array(
            [np.mean([r.outcomes[m].cost_usd or 0.0 for r in train]) for m in train[0].outcomes]
        )
    )
    entries = [*(Entry(r) for r in routers), *(Entry(p, "policy", lambdas) for p in policies)]
    reference = "compact" if any(p.name == "compact" for p in policies) else None
    full = compare(entries, test, bootstrap=args.bootstrap, reference=reference)
    # Validation AIQ of the same routers, for context: the choices above were made on it.
    on_val = compare(entries, val)
    tmp.cleanup()

    # -- two-model slice: GPT-4 vs Mixtral -----------------------------------------------------
    pair = [GPT4, MIXTRAL]
    s_train, s_val, s_test = (restrict_models(x, pair) for x in (train, val, test))
    slice_routers: list[OfflineRouter] = [OracleRouter(), RandomMixRouter(MIXTRAL, GPT4, seed=0)]
    for label, grid in (
        ("knn", over_embeddings(knn_grid, embeds, args.quick)),
        ("mf", over_embeddings(mf_grid, embeds, args.quick)),
    ):
        chosen[f"{label} (slice)"], router = tune(label, grid, s_train, s_val, val_apgr(label))
        slice_routers.append(router)
    # The strict two-model cascade has no second opinion (APGR 0.5 whatever its features).
    slice_routers.append(CascadeFamilyRouter(embed=next(iter(embeds.values()))).fit(s_train))
    chosen["cascade+verifier (slice)"], verifier = verifier_cascades(train, val, MIXTRAL, GPT4)
    two = compare([Entry(r) for r in slice_routers], s_test, GPT4, MIXTRAL, args.bootstrap)
    # The verifier cascade calls a third model, so it is scored on the full test rows.
    v_apgr = _verifier_apgr(verifier, test, MIXTRAL, GPT4)
    v_sweep = sweep(verifier, test, [0.0])
    v_point = v_sweep.points[0]
    v_ci = None
    if args.bootstrap:
        strong_c, weak_c = (
            PromptCurve.from_results(sweep(SingleModelRouter(m), test, [0.0]).prompts)
            for m in (GPT4, MIXTRAL)
        )
        v_curve = PromptCurve.from_results(v_sweep.prompts, GPT4)
        v_ci = apgr_intervals({"v": v_curve}, strong_c, weak_c, args.bootstrap).apgr["v"]

    # -- every two-model slice with GPT-4 as the strong model ---------------------------------
    pairs = (
        []
        if args.no_pairs
        else every_pair(train, val, test, embeds, GPT4, args.quick, args.bootstrap)
    )

    # -- report --------------------------------------------------------------------------------
    elapsed = time.perf_counter() - t_start
    gpt4 = full.curve(f"single:{GPT4}")
    print()
    print(
        f"RouterBench 0-shot (ARC-Challenge, Winogrande, MBPP), test split: {full.n_records} prompts "
        f"(train {len(train)}, validation {len(val)}; split seed {args.seed}; embedding {args.embedding})"
    )
    print(
        f"GPT-4 test accuracy {gpt4.max_score:.4f} at ${full.best_cost:.6f}/prompt; "
        f"AIQ range ${full.cost_range[0]:.6f}..${full.cost_range[1]:.6f}; "
        f"no-routing AIQ {full.no_routing_aiq:.4f} (validation {on_val.no_routing_aiq:.4f})"
    )
    print(
        "hyper-parameters picked on validation: "
        + "; ".join(f"{k}: {v}" for k, v in chosen.items())
    )
    print()
    # Targets compare with a random router's expected APGR (0.5); the measured random mix on
    # this test slice is printed in its own row.
    random_apgr = 0.5
    header = (
        f"{'router':<22} {'AIQ':>7} {'vs no-routing':>13} {'GPT-4 acc at % cost':>20} "
        f"{'APGR':>7} {'vs 0.5':>7} {'val AIQ':>8}"
    )
    print(header)
    print("-" * len(header))
    names = [
        "oracle",
        "random",
        "knn",
        "mf",
        "cascade",
        "escalation",
        *(p.name for p in policies),
    ]
    for name in names:
        c = full.curve(name)
        slice_name = name if name in {x.name for x in two.curves} else None
        ap = two.curve(slice_name).apgr if slice_name else None
        print(
            f"{name:<22} {c.aiq:>7.4f} {c.aiq - full.no_routing_aiq:>+13.4f} "
            f"{fmt(c.cost_to_best_pct, '.1f') + '%' if c.cost_to_best_pct is not None else 'never':>20} "
            f"{fmt(ap):>7} {fmt(None if ap is None else ap - random_apgr, '+.4f'):>7} "
            f"{on_val.curve(name).aiq:>8.4f}"
        )
    print(
        f"{'cascade+verifier':<22} {'':>7} {'':>13} {'':>20} {v_apgr:>7.4f} {v_apgr - random_apgr:>+7.4f}"
    )
    print(
        f"  (cascade+verifier = {chosen['cascade+verifier (slice)'].removeprefix('cascade:')}, k=2: "
        f"GPT-4 called on {100 * v_point.calls.get(GPT4, 0.0):.1f}% of prompts, accuracy "
        f"{v_point.score:.4f}, cost {100 * v_point.cost / full.best_cost:.1f}% of GPT-4's; the "
        "verifier is a third model, so this is not a strict two-model router)"
    )
    if full.bootstrap is not None:
        print_intervals(full, names)
        print(
            "  APGR on the GPT-4/Mixtral slice, 95% intervals: "
            + "; ".join(
                f"{c.name} {c.apgr:.4f} [{c.apgr_ci.low:.4f}, {c.apgr_ci.high:.4f}]"
                for c in two.curves
                if c.apgr is not None and c.apgr_ci is not None
            )
            + (
                ""
                if v_ci is None
                else f"; cascade+verifier {v_apgr:.4f} [{v_ci.low:.4f}, {v_ci.high:.4f}]"
            )
        )
    print()
    best_baseline_aiq = max(full.curve(n).aiq for n in ("knn", "mf"))
    print(
        "targets (held-out test): AIQ > no-routing and > kNN/MF; GPT-4 accuracy at <= 50% of "
        "GPT-4 cost (then ~30%); APGR >= random + 0.1"
    )
    for name in ["cascade", "escalation", *(p.name for p in policies)]:
        c = full.curve(name)
        ap = two.curve(name).apgr if name in {x.name for x in two.curves} else None
        checks = {
            "AIQ>no-routing": c.aiq > full.no_routing_aiq,
            "AIQ>kNN/MF": c.aiq > best_baseline_aiq,
            "GPT-4@<=50%": c.cost_to_best_pct is not None and c.cost_to_best_pct <= 50.0,
            "APGR>=random+0.1": ap is not None and ap >= random_apgr + 0.1,
        }
        print(f"  {name}: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in checks.items()))
    if pairs:
        print()
        print("two-model slices, GPT-4 vs every cheaper, less accurate model (test APGR; kNN/MF")
        print("tuned on each slice's validation APGR):")
        header = (
            f"{'weak model':<36} {'acc':>6} {'random':>7} {'kNN':>7} {'MF':>7} "
            f"{'pick (val)':>10} {'vs 0.5':>7} {'pick APGR, 95% interval':>24}"
        )
        print(header)
        print("-" * len(header))
        met = above_random = sure = 0
        for weak, weak_acc, ap_random, ap_knn, ap_mf, pick, ci in pairs:
            ap = ap_knn if pick == "knn" else ap_mf
            met += ap >= random_apgr + 0.1
            above_random += ci is not None and ci.low > random_apgr
            sure += ci is not None and ci.low >= random_apgr + 0.1
            interval = "" if ci is None else f"[{ci.low:.4f}, {ci.high:.4f}]"
            print(
                f"{weak:<36} {weak_acc:>6.3f} {ap_random:>7.4f} {ap_knn:>7.4f} {ap_mf:>7.4f} "
                f"{pick:>10} {ap - random_apgr:>+7.4f} {interval:>24}"
            )
        print(f"  the validation pick has APGR >= random + 0.1 on {met} of {len(pairs)} slices")
        if args.bootstrap:
            print(
                f"  its 95% interval lies above 0.5 on {above_random} and above 0.6 on {sure} "
                "of them"
            )
    print(f"\n({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
