"""``xrouter train``: train a compact router on an outcome table.

    xrouter train --table router/assets/demo_outcomes.jsonl --out runs/demo \\
        [--pool a,b,...] [--steps N] [--lr LR] [--seed S] [--group-size G] \\
        [--lambda-min L] [--lambda-max L] [--reward gated|additive] [--offpolicy] \\
        [--overwrite]

Writes ``RUN_DIR/checkpoint/`` (load it with ``router.checkpoint.load_checkpoint`` or point
the gateway's ``router.checkpoint`` at it), ``config.json``, ``metrics.jsonl`` and
``summary.json``; a directory that already holds a run is refused unless ``--overwrite``
is given. Also runnable as ``python -m training.compact.cli``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import re
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from training.cli_errors import os_problem, unreadable
from training.cli_types import layer_widths, numbers, positive_int, positive_ints
from training.compact.config import TrainConfig
from training.compact.support import THIN_SUPPORT, reward_ceiling, validation_support
from training.reward import add_reward_arguments, warn_if_wrong_beats_right

logger = logging.getLogger(__name__)

# Signals that end a run from outside (``timeout``, ``kill``, a closed terminal, a container
# stopped) and whose default action kills the process on the spot.
_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While the run lasts, SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` instead of
    killing the process: ``claimed_run_dir`` then runs its cleanup (the earlier run put back
    from ``.replaced-<pid>``, this run's partial outputs removed), which the default action
    skipped, and the exit code is still the one a shell reports for the signal. A second
    signal while that cleanup runs is ignored, so it cannot cut the cleanup short (SIGKILL
    still ends it). The previous handlers are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread: a caller embedding us
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if raised:
            logger.warning("%s ignored: cleaning up", signal.Signals(signum).name)
            return
        raised = True
        logger.warning("%s: stopping the run", signal.Signals(signum).name)
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, handler) for sig in _ENDING_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            # None: a handler not set from Python, which cannot be set back; the default
            # is what such a process had.
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    parser.add_argument(
        "--table", required=True, help="outcome table (JSONL, or a ledger export in Parquet)"
    )
    parser.add_argument("--out", required=True, help="run directory (created)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (without it, such a directory is an error)",
    )
    parser.add_argument(
        "--pool", help="comma-separated models = actions, in order (default: the table's)"
    )
    parser.add_argument(
        "--prices", help="price table (JSON/YAML) for the checkpoint's snapshot and missing costs"
    )
    parser.add_argument(
        "--steps", type=int, default=d.steps, help=f"policy-gradient steps ({d.steps})"
    )
    parser.add_argument(
        "--batch-size", type=int, default=d.batch_size, help=f"prompts per step ({d.batch_size})"
    )
    parser.add_argument(
        "--group-size", type=int, default=d.group_size, help="GRPO samples per prompt"
    )
    parser.add_argument(
        "--ppo-epochs",
        type=int,
        default=d.ppo_epochs,
        help=f"updates per sampled batch, clipped ratio ({d.ppo_epochs})",
    )
    parser.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate ({d.lr:g})")
    parser.add_argument(
        "--weight-decay", type=float, default=d.weight_decay, help=f"AdamW ({d.weight_decay:g})"
    )
    parser.add_argument(
        "--clip-eps", type=float, default=d.clip_eps, help=f"PPO ratio clip ({d.clip_eps:g})"
    )
    parser.add_argument("--entropy", type=float, default=d.entropy_coef, help="entropy bonus")
    parser.add_argument(
        "--explore",
        type=float,
        default=d.explore_epsilon,
        help="uniform exploration mixed into GRPO's group sampling",
    )
    parser.add_argument("--dropout", type=float, default=d.dropout, help=f"({d.dropout:g})")
    parser.add_argument(
        "--advantage-std-floor",
        type=float,
        default=d.advantage_std_floor,
        help="floor of the group std that normalizes GRPO advantages",
    )
    parser.add_argument(
        "--hidden", type=layer_widths, default=d.hidden, help="hidden widths, e.g. 128,128"
    )
    parser.add_argument("--activation", choices=["gelu_tanh", "relu", "silu"], default=d.activation)
    parser.add_argument("--seed", type=int, default=d.seed, help="initialization and sampling seed")
    parser.add_argument(
        "--split-seed",
        type=int,
        default=d.split_seed,
        help="seed of the train/validation/test split by id hash (xrouter eval's --split-seed)",
    )
    parser.add_argument(
        "--lambda-min",
        type=float,
        default=d.lambda_min,
        help="smallest trained cost weight (default: derived from the table's costs)",
    )
    parser.add_argument(
        "--lambda-max",
        type=float,
        default=d.lambda_max,
        help="largest trained cost weight (default: derived from the table's costs)",
    )
    parser.add_argument(
        "--lambda-zero-prob",
        type=float,
        default=d.lambda_zero_prob,
        help=f"share of batches trained at cost weight 0 ({d.lambda_zero_prob:g})",
    )
    parser.add_argument(
        "--val-lambdas",
        type=numbers,
        default=d.val_lambdas,
        help="cost weights to validate at, e.g. 0,0.1,1 (default: 0 and powers of ten in range)",
    )
    add_reward_arguments(parser)
    parser.add_argument(
        "--offpolicy", action="store_true", help="learn from logged records (partial feedback)"
    )
    parser.add_argument(
        "--knn",
        type=positive_ints,
        default=None,
        metavar="K[,K...]",
        help="instead of training a network, store a kNN router over the training prompts "
        "(k picked on validation among these, e.g. 25,50,100,200,400); with --offpolicy, "
        "over logged prompts with doubly-robust outcome estimates",
    )
    parser.add_argument(
        "--cascade",
        type=positive_ints,
        default=None,
        metavar="K[,K...]",
        help="instead of training a network, store multi-call plans (cheap models first, "
        "escalate until answers agree) measured on the table's recorded responses, the plan "
        "picked per request by its K nearest training prompts (K picked on validation among "
        "these, e.g. 50,100,200,400)",
    )
    parser.add_argument(
        "--max-cheap",
        type=int,
        default=None,
        help="--cascade: plans use up to this many of the most accurate cheaper models (4)",
    )
    parser.add_argument(
        "--estimator",
        choices=["ips", "snips", "dr"],
        default=None,
        help=f"--offpolicy: the off-policy estimate the network is trained on ({d.estimator}; "
        "dr: doubly robust, with a reward model fitted on the logs); --knn picks k by DR with "
        "dr, else by SNIPS",
    )
    parser.add_argument(
        "--ips-clip",
        type=float,
        default=None,
        help=f"--offpolicy: importance weights are clipped at this ({d.ips_clip:g})",
    )
    parser.add_argument(
        "--offpolicy-entropy",
        type=float,
        default=None,
        help=f"--offpolicy: the entropy bonus ({d.offpolicy_entropy_coef:g})",
    )
    parser.add_argument("--eval-every", type=int, default=d.eval_every)
    parser.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="0: never")
    parser.add_argument("--cache-dir", help="feature cache (default RUN_DIR/cache)")
    parser.add_argument(
        "--report-test",
        action="store_true",
        help="also score the test split (never used for selection)",
    )
    parser.add_argument("--name", default="", help="checkpoint name (metadata)")
    parser.add_argument("--description", default="")
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=d.threads,
        help=f"torch CPU threads, at least 1 ({d.threads})",
    )
    parser.add_argument("--no-progress", action="store_true")


# Options of off-policy training only: given without --offpolicy, they would be recorded in
# the run's config as if they had shaped a run they did not.
_OFFPOLICY_OPTIONS = {
    "estimator": "--estimator",
    "ips_clip": "--ips-clip",
    "offpolicy_entropy": "--offpolicy-entropy",
}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    d = TrainConfig()
    if not args.offpolicy:
        given = [
            flag for name, flag in _OFFPOLICY_OPTIONS.items() if getattr(args, name) is not None
        ]
        if given:
            raise ValueError(f"{', '.join(given)} applies to --offpolicy training only")
    try:
        cfg = _train_config(args, d)
    except ValueError as exc:
        # The config names its fields; the user typed flags (`--ips-clip`, not `ips_clip`).
        raise ValueError(_FIELD.sub(lambda m: _flag(m.group(0)), str(exc))) from None
    warn_if_wrong_beats_right(cfg.reward_config())
    return cfg


# TrainConfig fields whose flag is not the field's name with dashes.
_FIELD_FLAGS = {
    "entropy_coef": "--entropy",
    "explore_epsilon": "--explore",
    "reward_form": "--reward",
    "reward_K": "--K",
    "reward_c_max": "--c-max",
    "offpolicy_entropy_coef": "--offpolicy-entropy",
}
# Fields no flag sets (left as named).
_NO_FLAG = {"grad_clip", "offpolicy_lambdas", "reward_model_steps", "progress", "threads"}
_FIELD = re.compile(
    r"\b(" + "|".join(sorted(
        [f.name for f in dataclasses.fields(TrainConfig)
         if ("_" in f.name or f.name in _FIELD_FLAGS) and f.name not in _NO_FLAG]
        + ["steps", "lr", "dropout"],
        key=len, reverse=True,
    )) + r")\b"
)  # fmt: skip


def _flag(field: str) -> str:
    return _FIELD_FLAGS.get(field, "--" + field.replace("_", "-"))


def _train_config(args: argparse.Namespace, d: TrainConfig) -> TrainConfig:
    return TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        ppo_epochs=args.ppo_epochs,
        lr=args.lr,
        weight_decay=args.weight_decay,
        clip_eps=args.clip_eps,
        entropy_coef=args.entropy,
        hidden=tuple(args.hidden),
        dropout=args.dropout,
        explore_epsilon=args.explore,
        advantage_std_floor=args.advantage_std_floor,
        activation=args.activation,
        lambda_min=args.lambda_min,
        lambda_max=args.lambda_max,
        lambda_zero_prob=args.lambda_zero_prob,
        # An empty list given (`--val-lambdas ""`) is checked as one, not read as the default.
        val_lambdas=tuple(args.val_lambdas) if args.val_lambdas is not None else None,
        reward_form=args.reward,
        reward_K=args.K,
        reward_c_max=args.c_max,
        cost_scale=args.cost_scale,
        reference_model=args.reference_model,
        offpolicy=args.offpolicy,
        estimator=d.estimator if args.estimator is None else args.estimator,
        ips_clip=d.ips_clip if args.ips_clip is None else args.ips_clip,
        offpolicy_entropy_coef=(
            d.offpolicy_entropy_coef if args.offpolicy_entropy is None else args.offpolicy_entropy
        ),
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        split_seed=args.split_seed,
        report_test=args.report_test,
        threads=args.threads,
        progress=not args.no_progress,
    )


def run_train(args: argparse.Namespace) -> int:
    try:
        from training.compact.run_dir import claimed_run_dir
        from training.compact.trainer import train
    except ImportError as exc:
        print(f"error: xrouter train needs the 'train' extra (torch, tqdm): {exc}", file=sys.stderr)
        return 2
    from router.outcomes import OutcomeTableError, load_outcome_table

    table = Path(args.table)
    cache_dir = getattr(args, "cache_dir", None)
    if cache_dir is not None and Path(cache_dir).exists() and not Path(cache_dir).is_dir():
        # Said now, not as mkdir's "[Errno 17] File exists" once the features are computed.
        print(f"error: --cache-dir {cache_dir} is a file, not a directory", file=sys.stderr)
        return 2
    try:
        records = load_outcome_table(table)
    except OSError as exc:
        print(f"error: {unreadable(table, exc)}", file=sys.stderr)
        return 2
    except OutcomeTableError as exc:
        # Its message names the table and the line (``T:3: …``).
        print(f"error: {exc}", file=sys.stderr)
        return 2
    pool = [m.strip() for m in args.pool.split(",") if m.strip()] if args.pool else None
    command = getattr(args, "command_line", None) or shlex.join(["xrouter", *sys.argv[1:]])
    try:
        cfg = config_from_args(args)
        common: dict[str, Any] = {
            "pool": pool,
            "prices_path": args.prices,
            "cache_dir": args.cache_dir,
            "command": command,
            "name": args.name,
            "description": args.description,
            "table_path": table,
        }
        if getattr(args, "knn", None) and getattr(args, "cascade", None):
            raise ValueError("--knn and --cascade build different checkpoints: pass one")
        max_cheap = getattr(args, "max_cheap", None)
        if max_cheap is not None and not getattr(args, "cascade", None):
            # It shapes only a cascade's plans: anything else would silently ignore it.
            raise ValueError("--max-cheap applies to --cascade checkpoints only")
        with (
            _signals_raise(),
            claimed_run_dir(Path(args.out), overwrite=getattr(args, "overwrite", False)),
        ):
            if getattr(args, "knn", None):
                from training.compact.knn import build_knn

                result = build_knn(records, cfg, args.out, args.knn, **common)
            elif getattr(args, "cascade", None):
                from training.compact.cascade import DEFAULT_MAX_CHEAP, build_cascade

                result = build_cascade(
                    records,
                    cfg,
                    args.out,
                    args.cascade,
                    max_cheap=DEFAULT_MAX_CHEAP if max_cheap is None else max_cheap,
                    **common,
                )
            else:
                result = train(records, cfg, args.out, **common)
    except (ValueError, OSError) as exc:  # bad settings or table; a run directory not writable
        print(f"error: {os_problem(exc) if isinstance(exc, OSError) else exc}", file=sys.stderr)
        return 2
    summary: dict[str, Any] = {
        "checkpoint": str(result.checkpoint_path),
        **(
            {"neighbours": result.neighbours}
            if result.neighbours is not None
            else {"best_step": result.best_step}
        ),
        "seconds": round(result.seconds, 1),
        "validation": {
            k: {m: v[m] for m in ("reward", "score", "cost_usd") if m in v}
            for k, v in result.validation.items()
        },
    }
    ceiling = reward_ceiling(cfg.reward_form, cfg.reward_K)
    if (support := validation_support(result.validation, ceiling)) is not None:
        summary["validation_support"] = support
        _warn_above_ceiling(support)
    _warn_thin_support(result.validation, cfg.estimator)
    print(json.dumps(summary, indent=2))
    return 0


def _warn_above_ceiling(support: dict[str, Any]) -> None:
    over = support.get("above_ceiling") or []
    if over:
        logger.warning(
            "the off-policy validation reward at λ = %s is above what any router can earn "
            "(%g): the estimate is noise from records logged with small propensities, not a "
            "measure of this router; do not compare it with other runs' rewards",
            ", ".join(over),
            support["ceiling"],
        )


def _warn_thin_support(validation: dict[str, dict[str, Any]], estimator: str) -> None:
    thin = {
        lam: row["supporting_records"]
        for lam, row in validation.items()
        if row.get("supporting_records", THIN_SUPPORT) < THIN_SUPPORT
    }
    if thin:
        logger.warning(
            "the validation estimates rest on few records logged with the router's own "
            "choices (%s at λ = %s): off-policy estimates this thin overrate the router, SNIPS "
            "most; %sevaluate it on traffic it did not train on",
            ", ".join(str(v) for v in thin.values()),
            ", ".join(thin),
            "" if estimator == "dr" else "prefer --estimator dr, and ",
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.compact.cli", description=__doc__.split("\n\n")[0]
    )
    add_train_arguments(parser)
    args = parser.parse_args(argv)
    args.command_line = "python -m training.compact.cli " + shlex.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run_train(args)


if __name__ == "__main__":
    raise SystemExit(main())
