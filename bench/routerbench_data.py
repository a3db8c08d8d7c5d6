"""RouterBench's 0-shot subset as every RouterBench bench script reads it: where it lies, the
models the scripts name, and the one split they share (60/20/20 by a hash of the id).

The data stays in ``../shared/data/routerbench_zs`` (research use only: it is read from
there, never copied into the project). Imported by the scripts beside it (``python
bench/<script>.py`` puts this directory on ``sys.path``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from router.outcomes import OutcomeRecord  # noqa: E402
from training.datasets.convert import load_converted  # noqa: E402
from training.datasets.splits import Splits, split_records  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "routerbench_zs"
FRACTIONS = (0.6, 0.2, 0.2)

GPT4 = "gpt-4-1106-preview"
MIXTRAL = "mistralai/mixtral-8x7b-chat"
YI = "zero-one-ai/Yi-34B-Chat"


def add_data_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help="folder of RouterBench CSVs"
    )


def load_records(data: Path, *, with_responses: bool = True) -> list[OutcomeRecord] | None:
    """Every record of the CSVs under ``data``; None (said on stderr) when there are none,
    so that a checkout without ``../shared`` exits cleanly."""
    csvs = sorted(data.glob("*.csv"))
    if not csvs:
        print(f"no RouterBench CSVs under {data}: nothing to measure", file=sys.stderr)
        return None
    if with_responses:
        return load_converted("routerbench", csvs)
    from training.datasets.common import UniqueIds
    from training.datasets.routerbench import iter_routerbench_csv

    ids = UniqueIds()
    return [r for f in csvs for r in iter_routerbench_csv(f, ids, with_responses=False)]


def split_parts(records: Sequence[OutcomeRecord], seed: int | str = 0) -> Splits:
    """The train / validation / test parts every script reports on (test: held out)."""
    return split_records(records, FRACTIONS, seed)


# A hand-written escalation plan per task (more cheap voters on ARC, one cheap coder on
# MBPP), the learned escalation's extra grid point in the scripts that tune it.
HAND_PLANS: dict[str, list[str]] = {
    "arc-challenge": [MIXTRAL, YI, "claude-instant-v1", "gpt-3.5-turbo-1106"],
    "mbpp": ["gpt-3.5-turbo-1106"],
}
