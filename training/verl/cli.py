"""``xrouter verl-data``: an outcome table as verl's dataset and tool config for the LLM
router (``training.verl.data``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from training.cli_errors import not_a_model, os_problem, unreadable
from training.cli_types import numbers, price_pair
from training.evaluation.cli import with_costs
from training.reward import (
    add_reward_arguments,
    check_reference_costs,
    reward_config_from_args,
)
from training.verl.data import DEFAULT_LAMBDAS, VerlDataConfig, write_verl_dataset
from training.verl.launch import GrpoRun


def add_verl_data_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--table",
        required=True,
        help="outcome table with the pool models' recorded outcomes per prompt (JSONL); "
        "logged traffic, one model's outcome per prompt, is refused: rollouts replay "
        "whichever model the router calls",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="directory for the dataset, pool, agent-loop config and launch script",
    )
    parser.add_argument(
        "--lambdas",
        type=numbers,
        default=DEFAULT_LAMBDAS,
        help="cost weights drawn per prompt (default: %(default)s)",
    )
    add_reward_arguments(parser)
    run = GrpoRun()
    parser.add_argument("--model", default=run.model, help="router model for train_grpo.sh")
    parser.add_argument("--gpus-per-node", type=int, default=run.gpus_per_node)
    parser.add_argument("--nodes", type=int, default=run.nodes)
    parser.add_argument(
        "--group-size", type=int, default=run.group_size, help="GRPO rollouts per prompt"
    )
    parser.add_argument(
        "--router-price",
        type=price_pair,
        default=(0.0, 0.0),
        metavar="IN,OUT",
        help="the router's own tokens, USD per 1M input and output tokens, IN,OUT or IN/OUT "
        "(default free)",
    )
    parser.add_argument(
        "--prices",
        help="a price table (YAML/JSON, USD per 1M tokens) for outcomes that record tokens "
        "but no cost_usd, as xrouter eval and train take (default: the packaged catalog)",
    )
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-prompt λ draw")


def run_verl_data(args: argparse.Namespace) -> int:
    from router.outcomes import OutcomeTableError, load_outcome_table

    if Path(args.out).exists() and not Path(args.out).is_dir():
        # Said before the table is read, not as mkdir's "[Errno 17] File exists" after.
        print(f"error: --out {args.out} is a file, not a directory", file=sys.stderr)
        return 2
    try:
        records = load_outcome_table(Path(args.table))
    except OSError as exc:
        print(f"error: {unreadable(args.table, exc)}", file=sys.stderr)
        return 2
    except OutcomeTableError as exc:
        # Its message names the table and the line (``T:3: …``).
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        # Outcomes that record only their tokens are priced as xrouter eval and train
        # price them, so a rollout's reward and its regret use the same costs.
        records = with_costs(records, Path(args.prices) if args.prices else None)
        config = VerlDataConfig(
            lambdas=args.lambdas,
            reward=reward_config_from_args(args),
            reference_model=args.reference_model,
            split_seed=args.split_seed,
            seed=args.seed,
            router_price=args.router_price,
        )
        if args.reference_model:
            model = args.reference_model
            models = {m for r in records for m in r.outcomes}
            if model not in models:
                # As `xrouter train` says it: a typo is not a model without costs.
                raise ValueError(not_a_model("--reference-model", [model], models))
            check_reference_costs(
                model,
                {r.id: (o.cost_usd if (o := r.outcomes.get(model)) else None) for r in records},
            )
        run = GrpoRun(
            model=args.model,
            gpus_per_node=args.gpus_per_node,
            nodes=args.nodes,
            group_size=args.group_size,
        )
        out = write_verl_dataset(records, Path(args.out), config, run)
    except (ValueError, OSError) as exc:  # RoutingError (an unpriced outcome) included
        print(f"error: {os_problem(exc) if isinstance(exc, OSError) else exc}", file=sys.stderr)
        return 2
    rows = ", ".join(f"{k} {v}" for k, v in out.rows.items())
    print(f"{out.out_dir}: {rows} rows over {len(out.models)} models")
    print(f"train on GPUs with {out.out_dir / 'train_grpo.sh'}")
    return 0
