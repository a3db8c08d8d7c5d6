"""``xrouter checkpoints``: the checkpoint registry on the command line.

Lists the checkpoints under run directories (what ``xrouter train --out`` writes) or
directories of them, newest first, from their metadata alone: kind, name, pool size, how
they were trained and on which table, and the validation reward that selected them. With
``--show`` it prints one checkpoint's whole metadata and its content version (the hash that
``xrouter deploy``, reload responses and the ledger name it by), after validating its weights.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def add_checkpoints_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="*",
        default=[],
        help="checkpoints, run directories or directories of them (default: .)",
    )
    p.add_argument(
        "--steps", action="store_true", help="also list runs' intermediate checkpoints/step_*"
    )
    p.add_argument(
        "--packaged",
        action="store_true",
        help="list the checkpoints shipped with xrouter (named packaged:<name>) instead",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per checkpoint")
    p.add_argument("--show", metavar="CHECKPOINT", help="print one checkpoint's metadata")


def summary(path: Path, meta: Any) -> dict[str, Any]:
    """The registry row of a checkpoint (``meta``: its ``CheckpointMetadata``)."""
    training: dict[str, Any] = meta.training or {}
    table: dict[str, Any] = training.get("table") or {}
    config: dict[str, Any] = training.get("config") or {}
    metrics: dict[str, Any] = meta.metrics or {}
    reward = metrics.get("validation_mean_reward")
    # How many logged records an off-policy validation reward rests on (absent from runs on
    # full outcomes and from checkpoints made before it was kept).
    support = metrics.get("validation_support")
    support = support if isinstance(support, dict) else {}
    return {
        "path": str(path),
        "name": meta.name,
        "kind": meta.architecture.kind,
        "created_at": meta.created_at.isoformat(),
        "models": len(meta.pool),
        "mode": training.get("mode"),
        "table": table.get("path"),
        "table_sha256": table.get("sha256"),
        "split_seed": config.get("split_seed"),
        "validation_mean_reward": reward,
        "validation_min_supporting_records": support.get("min_supporting_records"),
        "validation_thin": support.get("thin"),
        "validation_above_ceiling": support.get("above_ceiling") or None,
        "validation_ceiling": support.get("ceiling"),
        "feature_version": meta.feature_version,
    }


def _reward_cell(row: dict[str, Any]) -> str:
    """The validation reward, flagged when it is an off-policy estimate on too few records
    to trust (``0.8142 (thin: 1 record)``): listed beside a sound one it would read as
    better."""
    reward = row["validation_mean_reward"]
    text = f"{'-' if reward is None else format(reward, '.4f'):>8}"
    fewest = row.get("validation_min_supporting_records")
    flags = []
    if row.get("validation_thin") and fewest is not None:
        flags.append(f"thin: {fewest} record{'' if fewest == 1 else 's'}")
    if row.get("validation_above_ceiling"):
        # Above what any router can earn: an estimate blown up by small propensities.
        flags.append(f"above the reward's ceiling {row['validation_ceiling']:g}")
    if flags:
        text += f" ({'; '.join(flags)})"
    return text


def _table_line(row: dict[str, Any]) -> str:
    table = Path(row["table"]).name if row["table"] else "-"
    sha = (row["table_sha256"] or "")[:8]
    return (
        f"{row['created_at'][:16]:<17} {row['kind']:<8} {row['name'] or '-':<16} "
        f"{row['models']:>6} {row['mode'] or '-':<13} {table + (' ' + sha if sha else ''):<36} "
        f"{_reward_cell(row)}  {row['path']}"
    )


def run_checkpoints(args: argparse.Namespace) -> int:
    from router.checkpoint import (
        META_FILE,
        PACKAGED_PREFIX,
        CheckpointError,
        checkpoint_location,
        is_single_file,
        load_checkpoint,
        packaged_checkpoint_names,
        packaged_checkpoint_path,
    )
    from router.checkpoint_registry import SEARCH_DEPTH, list_checkpoints

    if args.paths and (args.show or args.packaged):
        # They list or show something else: the paths would be silently ignored.
        flag = "--show" if args.show else "--packaged"
        log.error("%s takes no PATH arguments (got %s)", flag, " ".join(map(str, args.paths)))
        return 2
    where = [str(p) for p in args.paths] or ["."]
    if args.show:
        try:
            ckpt = load_checkpoint(args.show)
        except CheckpointError as exc:
            log.error("%s", exc)
            return 2
        out = {"path": str(args.show), "version": ckpt.version}
        out.update(json.loads(ckpt.metadata.model_dump_json()))
        print(json.dumps(out, indent=2))
        return 0
    # Shipped checkpoints are shown by the name deploy and config take, not their path.
    packaged = {
        packaged_checkpoint_path(n).resolve(): f"{PACKAGED_PREFIX}{n}"
        for n in packaged_checkpoint_names()
    }
    try:
        paths = (
            [packaged_checkpoint_path(n) for n in packaged_checkpoint_names()]
            if args.packaged
            # A run directory is listed whole (its step checkpoints too), so only the
            # packaged: names and a checkpoint's checkpoint.json (its directory, as deploy
            # and eval take it) are resolved here, not a run directory to its checkpoint.
            else [
                checkpoint_location(p)
                if str(p).startswith(PACKAGED_PREFIX) or Path(p).name == META_FILE
                else Path(p)
                for p in where
            ]
        )
    except CheckpointError as exc:
        log.error("%s", exc)
        return 2
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        log.error("no such path: %s", ", ".join(missing))
        return 2
    # A file is searched for nothing: named, it was "no checkpoints under it", exit 0, as if
    # it were an empty directory. Only a one-file checkpoint is a file that is listed.
    files = [str(p) for p in paths if not p.is_dir() and not is_single_file(p)]
    if files:
        log.error(
            "%s: a file, not a directory (name checkpoint or run directories, directories of "
            "them, or one-file .safetensors checkpoints)",
            ", ".join(files),
        )
        return 2
    rows = [
        summary(Path(packaged.get(c.path.resolve(), str(c.path))), c.metadata)
        for c in list_checkpoints(list(paths), steps=args.steps)
    ]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    if not rows:
        print(
            f"no checkpoints under {', '.join(where)} (looked {SEARCH_DEPTH} directories "
            "down): name the run directory, or the directory that holds them",
            file=sys.stderr,
        )
        return 0
    print(
        f"{'created (UTC)':<17} {'kind':<8} {'name':<16} {'models':>6} {'mode':<13} "
        f"{'trained on':<36} {'val rew':>8}  path"
    )
    for row in rows:
        print(_table_line(row))
    return 0
