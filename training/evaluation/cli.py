"""``xrouter eval``: compare a router with the baselines on an outcome table.

    xrouter eval --table T [--split test --split-seed 0] --policy <baseline | prefix:checkpoint>
                 [--lambdas 0,0.1,...] [--strong M --weak M] [--bootstrap N] --out DIR

Baselines and policies are fitted on the training split only and evaluated on ``--split``.
Writes ``metrics.json``, ``curve.png`` and ``report.md`` to ``--out``. A logged table (one
outcome per prompt, with propensities) is evaluated off-policy instead. The gateway's CLI
calls ``add_eval_arguments`` and ``run_eval``; ``python -m training.evaluation.cli`` runs it
standalone.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from router.outcomes import OutcomeRecord, OutcomeTableError, load_outcome_table
from router.url_secrets import mask_userinfo
from training.cli_errors import not_a_model, unreadable
from training.cli_types import numbers
from training.datasets.splits import DEFAULT_FRACTIONS, Splits, canonical_split, split_records
from training.evaluation.compare import Entry, compare, logging_baseline, off_policy
from training.evaluation.console import print_summary
from training.evaluation.loop_router import LoopRouter, pool_for
from training.evaluation.monotone import cost_rise_note, cost_rises
from training.evaluation.ope import OPEError
from training.evaluation.overlap import ids_fingerprint, seen_by_hash, seen_in_training
from training.evaluation.registry import (
    BASELINE_NAMES,
    LoadContext,
    RouterRegistry,
    RouterSpecError,
    default_registry,
)
from training.evaluation.report import EvalResult, write_report
from training.evaluation.sweep import (
    OutcomeMatrix,
    RoutingError,
    SweepDefaults,
    is_full_information,
    restrict_models,
)
from training.evaluation.utility import BASELINE_REWARD, lambda_grid
from training.reward import MAX_COST_SCALE, MIN_COST_SCALE, RewardConfig, cost_scale_arg

logger = logging.getLogger(__name__)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--table",
        type=Path,
        required=True,
        help="outcome table (JSONL, or a ledger export in Parquet: evaluated off-policy)",
    )
    parser.add_argument(
        "--prices",
        type=Path,
        help="price table (JSON/YAML) for outcomes that give tokens but no cost_usd "
        "(default: the packaged catalog)",
    )
    parser.add_argument(
        "--split",
        default="test",
        help="split to evaluate: train, validation, test (default) or all",
    )
    # An integer, as `xrouter train` takes it: a checkpoint's split is found again only from
    # the same number (the hash reads its text: "01" would be another split than 1).
    parser.add_argument("--split-seed", type=int, default=0, help="seed of the id-hash split")
    parser.add_argument(
        "--split-fractions",
        type=numbers,
        default=list(DEFAULT_FRACTIONS),
        help="train,validation,test fractions (default 0.6,0.2,0.2)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        help="router under test: a baseline name (single:<model>, "
        + ", ".join(BASELINE_NAMES)
        + ", escalation) or a loader spec: compact:<checkpoint>, policy:<cascade|cheapest|random"
        "|fixed:MODEL>, llm:<base_url>[#model[#lambda,price=IN/OUT]] (USD per 1M tokens; "
        "else the catalog's price for the model, else free); or, as a client names it, a "
        "gateway policy (compact, cheapest, random, fixed:MODEL), a checkpoint path, run "
        "directory or packaged:<name>; repeatable",
    )
    parser.add_argument(
        "--baselines",
        default=",".join(BASELINE_NAMES),
        help="comma-separated baselines to compare against ('none' for none)",
    )
    parser.add_argument(
        "--lambdas",
        type=numbers,
        default=None,
        help="cost weights to sweep the policies over (default: a grid scaled to the training "
        "part's costs; on logged traffic: 0)",
    )
    parser.add_argument("--strong", help="strong model of a two-model PGR slice")
    parser.add_argument("--weak", help="weak model of a two-model PGR slice")
    parser.add_argument(
        "--cost-scale",
        type=cost_scale_arg,
        default=BASELINE_REWARD.cost_scale,
        help="USD per unit of normalized cost in the baselines' reward (sets λ's scale), "
        f"{MIN_COST_SCALE:g} to {MAX_COST_SCALE:g} (default {BASELINE_REWARD.cost_scale:g})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for random baselines")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="N",
        help="paired-bootstrap resamples for AIQ (and APGR) confidence intervals (0: none, else at least 2)",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")


def _once(entries: list[Entry], notes: list[str]) -> list[Entry]:
    """``entries`` without repeats of one router (``compact`` and the ``packaged:`` name of
    the default checkpoint are one checkpoint): two rows of one name would be one router
    reported twice, and the second would shadow the first in ``metrics.json``."""
    seen: set[str] = set()
    out = []
    for entry in entries:
        name = entry.router.name
        if name in seen:
            notes.append(f"{name}: named more than once; evaluated once")
            continue
        seen.add(name)
        out.append(entry)
    return out


def _entries(
    specs: Sequence[str],
    kind: str,
    ctx: LoadContext,
    registry: RouterRegistry,
    params: Sequence[float] | None,
    notes: list[str],
    strict: bool,
) -> list[Entry]:
    entries = []
    for spec in specs:
        try:
            router = registry.load(spec, ctx)
        except (RoutingError, OPEError) as exc:
            if strict:
                raise
            notes.append(mask_userinfo(f"{spec}: not evaluated ({exc})"))
            continue
        grid = params
        if grid is None and not isinstance(router, SweepDefaults):
            grid = lambda_grid(OutcomeMatrix.from_records(ctx.train).costs.mean(axis=0), ctx.reward)
        entries.append(Entry(router, kind, grid))
    return entries


def _evaluate(args: argparse.Namespace, registry: RouterRegistry) -> EvalResult:
    if args.bootstrap < 0 or args.bootstrap == 1:
        # One resample's "95% interval" is that resample's value: a zero-width interval.
        raise RoutingError(
            f"--bootstrap must be 0 (no intervals) or at least 2 resamples, got {args.bootstrap}"
        )
    try:
        records = load_outcome_table(args.table)
    except OSError as exc:
        raise OutcomeTableError(unreadable(args.table, exc)) from None
    if not records:
        raise RoutingError(f"{args.table}: the table is empty")
    models = {m for r in records for m in r.outcomes}
    for option, model in (("--strong", args.strong), ("--weak", args.weak)):
        if model is not None and model not in models:
            # Named by its option: the slice's "record '…' has no outcome for nope" said
            # neither which option nor which models there are.
            raise RouterSpecError(not_a_model(option, [model], models))
    records = with_costs(records, args.prices)
    split = canonical_split(args.split)
    parts = split_records(records, args.split_fractions, args.split_seed)
    evaluated: list[OutcomeRecord] = parts.get(split)
    if not evaluated:
        raise RoutingError(f"split {split!r} of {args.table} is empty")
    baselines = (
        []
        if args.baselines.strip() == "none"
        else [b.strip() for b in args.baselines.split(",") if b.strip()]
    )
    result = EvalResult(
        meta={
            "table": str(args.table),
            "split": split,
            "split_seed": args.split_seed,
            "split_fractions": list(args.split_fractions),
            "n_records": len(records),
            "n_evaluated": len(evaluated),
            "n_train": len(parts.train),
            # Specs and the command as they were given, but for a password in a URL.
            "policies": [mask_userinfo(p) for p in args.policy],
            "baselines": baselines,
            "lambdas": args.lambdas,
            "cost_scale": args.cost_scale,
            "bootstrap": args.bootstrap,
            "command": mask_userinfo(getattr(args, "command_line", None) or "") or None,
        }
    )
    blind = sum(not r.has_prompt for r in evaluated)
    if blind:
        result.notes.append(
            f"{blind} of the {len(evaluated)} evaluated records carry no prompt (logged with "
            "ledger.log_content none or hash): a router that reads the prompt saw the same "
            "placeholder on each, so its figures are not its value on that traffic (fixed-model "
            "policies are unaffected); log with log_content: full to evaluate routers"
        )
        logger.warning("%s", result.notes[-1])
    reward = RewardConfig(form="additive", cost_scale=args.cost_scale)
    table = _Table(records, parts, evaluated, split)
    if not is_full_information(records):
        if not any(r.logged is not None for r in records):
            # Not logged traffic either: a research table with a gap, which the off-policy
            # path would refuse for want of `logged`, hiding what is actually wrong.
            raise RoutingError(_missing_outcome(records, args.table))
        return _evaluate_logged(args, registry, table, reward, result)
    return _evaluate_full(args, registry, table, baselines, reward, result)


@dataclass(frozen=True)
class _Table:
    """The outcome table ``xrouter eval`` was given: every record, its id-hash split and
    the part evaluated (named ``split``)."""

    records: list[OutcomeRecord]
    parts: Splits
    evaluated: list[OutcomeRecord]
    split: str


def _evaluate_logged(
    args: argparse.Namespace,
    registry: RouterRegistry,
    table: _Table,
    reward: RewardConfig,
    result: EvalResult,
) -> EvalResult:
    """Logged traffic (one model's outcome per prompt): routers that pick one model per
    prompt, evaluated off-policy."""
    records, parts, evaluated, split = table.records, table.parts, table.evaluated, table.split
    ctx = LoadContext(parts.train, parts.validation, reward, args.seed)
    try:
        policies = _once(
            _entries(
                args.policy, "policy", ctx, registry, args.lambdas or [0.0], result.notes, True
            ),
            result.notes,
        )
    except RoutingError as exc:
        # kNN, MF, escalation... fit on every model's outcome per prompt.
        raise RoutingError(
            f"{exc}: {args.table} is logged traffic (one model's outcome per prompt), on "
            "which only policies that pick one model per prompt are evaluated (off-policy): "
            "checkpoints (compact:...), single:MODEL, policy:cheapest|random|fixed:MODEL; "
            "train a router on it with `xrouter train --offpolicy`"
        ) from exc
    pool = pool_for(records)
    for entry in policies:
        if isinstance(entry.router, LoopRouter):
            # Every model of the table, not only those logged in the evaluated part: a
            # choice no record there supports is estimated without support (and noted),
            # not replaced by a policy it never chose.
            entry.router.pool = pool
    if args.strong or args.weak:
        result.notes.append("--strong/--weak: no APGR on logged traffic (partial feedback)")
    _note_training_overlap(policies, records, evaluated, args.table, split, result.notes)
    result.notes.append(
        "logged table (partial feedback): routers are evaluated off-policy; baselines that "
        "need full outcomes (kNN, MF, cascade, oracle) are skipped"
    )
    rows, notes = off_policy(policies, evaluated, args.lambdas or [0.0], models=pool.names)
    # What the routers say of their runs (a checkpoint not trained on some of the table's
    # models), as the full-information comparison reports it.
    said = [n for e in policies for n in getattr(e.router, "notes", ())]
    result.off_policy, result.notes = rows, [*result.notes, *notes, *said]
    result.logging_policy = logging_baseline(evaluated)
    _name_sources(policies, result)
    return result


def _name_sources(entries: Sequence[Entry], result: EvalResult) -> None:
    """Where each checkpoint evaluated came from, by router name (``EvalResult.display_name``)."""
    sources = {
        e.router.name: source
        for e in entries
        if (source := getattr(e.router, "source", None)) is not None
    }
    if sources:
        result.meta["sources"] = sources


def _evaluate_full(
    args: argparse.Namespace,
    registry: RouterRegistry,
    table: _Table,
    baselines: list[str],
    reward: RewardConfig,
    result: EvalResult,
) -> EvalResult:
    """A full-information table: the policies and the baselines on the evaluated part,
    every curve metric, and the two-model slice when ``--strong``/``--weak`` name one."""
    records, parts, evaluated, split = table.records, table.parts, table.evaluated, table.split
    if not parts.train:
        raise RoutingError("the training split is empty: nothing to fit the routers on")
    if split in ("train", "all"):
        # Only here are routers fitted (on the training part); a checkpoint trained on this
        # table gets its own note on how many evaluated prompts it has seen.
        result.notes.append(
            f"evaluated on the {split} split, which the routers were fitted on: optimistic"
        )
    if (args.strong is None) != (args.weak is None):
        raise RouterSpecError("--strong and --weak go together")
    if args.strong is not None and args.strong == args.weak:
        # The "slice" would hold one model: no PGR scale, and a report section that
        # silently lacks the metrics asked for.
        raise RouterSpecError(f"--strong and --weak must be two models, got {args.strong!r} twice")
    ctx = LoadContext(parts.train, parts.validation, reward, args.seed)
    entries = _once(
        [
            *_entries(baselines, "baseline", ctx, registry, None, result.notes, False),
            *_entries(args.policy, "policy", ctx, registry, args.lambdas, result.notes, True),
        ],
        result.notes,
    )
    pool = pool_for(records)
    for entry in entries:
        if isinstance(entry.router, LoopRouter):
            # Prices from the whole table, as `xrouter verl-data` writes them for training:
            # an llm router reads the same tool descriptions here as it was trained on.
            entry.router.pool = pool
    _note_training_overlap(entries, records, evaluated, args.table, split, result.notes)
    result.main = compare(
        entries, evaluated, args.strong, args.weak, args.bootstrap, bootstrap_seed=args.seed
    )
    if args.strong and len(result.main.models) > 2:
        pair = [args.strong, args.weak]
        sliced = LoadContext(
            restrict_models(parts.train, pair),
            restrict_models(parts.validation, pair),
            reward,
            args.seed,
        )
        # A single (or fixed) model outside the pair has no row on the two-model slice.
        outside = {
            f"{prefix}{m}"
            for r in records
            for m in r.outcomes
            if m not in pair
            for prefix in ("single:", "policy:fixed:", "fixed:")
        }
        in_slice = [b for b in baselines if b not in outside]
        policies_in_slice = [p for p in args.policy if p not in outside]
        slice_entries = _once(
            [
                *_entries(in_slice, "baseline", sliced, registry, None, result.notes, False),
                *_entries(
                    policies_in_slice, "policy", sliced, registry, args.lambdas, result.notes, False
                ),
            ],
            [],  # said once, for the main comparison
        )
        result.two_model = compare(
            slice_entries,
            restrict_models(evaluated, pair),
            args.strong,
            args.weak,
            args.bootstrap,
            bootstrap_seed=args.seed,
        )
    _name_sources(entries, result)
    for curve in result.main.curves:
        if curve.kind == "policy" and (rises := cost_rises(curve.points)) is not None:
            result.cost_rises[curve.name] = rises
            result.notes.append(cost_rise_note(result.display_name(curve.name), rises))
    return result


def _missing_outcome(records: Sequence[OutcomeRecord], table: Path) -> str:
    """What is wrong with a table that has neither every model's outcome on every record
    nor logged decisions: the first record lacking a model's outcome, and how many do."""
    models = list(dict.fromkeys(m for r in records for m in r.outcomes))
    lacking = [r for r in records if len(r.outcomes) < len(models)]
    first = lacking[0]
    missing = [m for m in models if m not in first.outcomes]
    return (
        f"{table}: record {first.id!r} has no outcome for model(s) {', '.join(map(repr, missing))} "
        f"({len(lacking)} of the {len(records)} records lack some model's outcome): a research "
        "table needs every model's outcome on every record, and the table is not logged "
        "traffic (no record has `logged`) that could be evaluated off-policy; complete or "
        "drop those records"
    )


def _note_training_overlap(
    entries: Sequence[Entry],
    records: Sequence[OutcomeRecord],
    evaluated: Sequence[OutcomeRecord],
    table: Path,
    split: str,
    notes: list[str],
) -> None:
    digests: tuple[str, str] | None = None
    for entry in entries:
        training = getattr(entry.router, "training", None)
        if entry.kind != "policy" or not training:
            continue
        if digests is None:
            digests = hashlib.sha256(table.read_bytes()).hexdigest(), ids_fingerprint(records)
        seen = seen_in_training(training, evaluated, *digests)
        hashes = getattr(entry.router, "seen_prompts", None)
        if seen is None and hashes is not None:
            # Another table, holding some of its prompts all the same: a later export of
            # the traffic it was trained on, or the table that traffic's prompts came from
            # (matched by text, as their keys differ).
            seen = seen_by_hash(hashes, evaluated)
            if seen:
                notes.append(
                    f"{entry.router.name}: {seen} of the {len(evaluated)} evaluated prompts "
                    "were among its training or validation prompts (this table is not the one "
                    "it was trained on, but holds some of the same prompts, as a later export "
                    "of the same traffic or the table its prompts came from does): "
                    "optimistic; evaluate on prompts it has not "
                    "seen, such as traffic logged after its training table"
                )
                logger.warning("%s", notes[-1])
            continue
        if seen:
            cfg = training.get("config", {})
            notes.append(
                f"{entry.router.name}: {seen} of the {len(evaluated)} evaluated prompts were in "
                f"its training or validation part (it was trained on this table with split seed "
                f"{cfg.get('split_seed')}, fractions {cfg.get('fractions')}): optimistic; "
                + (
                    "evaluate its test split, with the seed and fractions it was trained with"
                    if split in ("train", "all")
                    else "evaluate with the seed and fractions it was trained with"
                )
            )
            logger.warning("%s", notes[-1])


def with_costs(records: list[OutcomeRecord], prices: Path | None) -> list[OutcomeRecord]:
    """The table with every outcome's ``cost_usd``: an outcome that records only its tokens
    (the outcome-table format allows it) is priced from ``prices``, else the packaged
    catalog — as ``xrouter train`` prices it."""
    from training.datasets.prices import call_cost_usd, load_price_table

    # Read when given, even for a table it does not price: a mistyped path or a broken
    # file is an error, as ``xrouter train`` and ``convert`` say, not ignored.
    given = load_price_table(prices) if prices is not None else None
    if all(o.cost_usd is not None for r in records for o in r.outcomes.values()):
        return records  # the usual table: nothing to price
    from pricing import load_default_catalog

    catalog = given if given is not None else load_default_catalog()
    where = str(prices) if prices is not None else "the packaged price catalog"
    out = []
    for r in records:
        outcomes = dict(r.outcomes)
        for m, o in r.outcomes.items():
            if o.cost_usd is not None:
                continue
            if o.prompt_tokens is None or o.completion_tokens is None:
                raise RoutingError(
                    f"record {r.id!r}: model {m!r} has neither cost_usd nor its token counts"
                )
            if m not in catalog:
                raise RoutingError(
                    f"record {r.id!r}: model {m!r} has no cost_usd and no price in {where}"
                    + ("" if prices is not None else " (pass --prices)")
                )
            cost = call_cost_usd(catalog, m, o.prompt_tokens, o.completion_tokens, r.id)
            outcomes[m] = o.model_copy(update={"cost_usd": cost})
        out.append(r.model_copy(update={"outcomes": outcomes}))
    return out


def run_eval(args: argparse.Namespace, registry: RouterRegistry | None = None) -> int:
    """Run the evaluation described by ``args`` (from ``add_eval_arguments``); 0 on
    success, 2 on bad input (the reason goes to stderr)."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        # Said before the evaluation runs (minutes, with the bootstrap), not after it.
        print(f"error: --out {out} is a file; the report goes in a directory", file=sys.stderr)
        return 2
    try:
        result = _evaluate(args, registry or default_registry())
    except (OutcomeTableError, RoutingError, RouterSpecError, OPEError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        paths = write_report(result, args.out)
    except OSError as exc:
        print(f"error: cannot write the report: {exc}", file=sys.stderr)
        return 2
    print_summary(result)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.evaluation.cli", description=__doc__.splitlines()[0]
    )
    add_eval_arguments(parser)
    args = parser.parse_args(argv)
    args.command_line = "python -m training.evaluation.cli " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_eval(args)


if __name__ == "__main__":
    raise SystemExit(main())
