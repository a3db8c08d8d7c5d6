"""Convert research routing data and ledger exports to the outcome table.

Usage::

    python -m training.datasets.convert routerbench a.csv b.csv --out table.jsonl
    python -m training.datasets.convert routerdc train.json --prices default_llm.json --out t.jsonl
    python -m training.datasets.convert routellm eval.csv --prices prices.yaml --out t.jsonl
    python -m training.datasets.convert routeprofile routing_test_data.json \\
        --prices candidate_models.json --out t.jsonl
    python -m training.datasets.convert ledger export.jsonl [--prices catalog.yaml] --out t.jsonl
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from pricing import PriceCatalog
from router.outcomes import OutcomeRecord, write_outcome_table
from training.datasets.common import ConversionError
from training.datasets.ledger import convert_ledger
from training.datasets.prices import load_price_table
from training.datasets.routellm import convert_routellm
from training.datasets.routeprofile import convert_routeprofile
from training.datasets.routerbench import convert_routerbench
from training.datasets.routerdc import DEFAULT_COMPLETION_TOKENS, convert_routerdc

logger = logging.getLogger(__name__)

FORMATS = ("routerbench", "routerdc", "routellm", "routeprofile", "ledger")


def iter_converted(
    fmt: str,
    inputs: Sequence[str | Path],
    prices: PriceCatalog | str | Path | None = None,
    completion_tokens: int = DEFAULT_COMPLETION_TOKENS,
) -> Iterator[OutcomeRecord]:
    """Records converted from ``inputs`` (in order). ``prices`` is a catalog or the path of
    a price table; formats without recorded costs need it."""
    paths = [Path(p) for p in inputs]
    if not paths:
        raise ConversionError("no input files")
    for p in paths:
        if p.is_dir():
            raise ConversionError(f"{p}: a directory, not a file: name the files in it")
        if p.exists() and not p.is_file():
            # /dev/null, a FIFO: there, but not a file of records (it was "no such file").
            raise ConversionError(f"{p}: not a regular file")
        if not p.is_file():
            raise ConversionError(f"{p}: no such file")
    catalog = load_price_table(prices) if isinstance(prices, str | Path) else prices
    if completion_tokens < 0:
        raise ConversionError("completion_tokens must be non-negative")
    if fmt == "routerbench":
        return convert_routerbench(paths)
    if fmt == "routerdc":
        return convert_routerdc(paths, catalog, completion_tokens)
    if fmt == "routellm":
        return convert_routellm(paths, catalog, completion_tokens)
    if fmt == "routeprofile":
        return convert_routeprofile(paths, catalog)
    if fmt == "ledger":
        return convert_ledger(paths, catalog)
    raise ConversionError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")


def load_converted(
    fmt: str,
    inputs: Sequence[str | Path],
    prices: PriceCatalog | str | Path | None = None,
    completion_tokens: int = DEFAULT_COMPLETION_TOKENS,
) -> list[OutcomeRecord]:
    """Convert in memory (for data that must not be copied into a file, e.g. RouterBench)."""
    return list(iter_converted(fmt, inputs, prices, completion_tokens))


def convert(
    fmt: str,
    inputs: Sequence[str | Path],
    out: str | Path,
    prices: PriceCatalog | str | Path | None = None,
    completion_tokens: int = DEFAULT_COMPLETION_TOKENS,
) -> int:
    """Convert ``inputs`` of format ``fmt`` to the outcome table ``out``; returns the number
    of records written. Nothing is written if any input row is invalid."""
    out_path = Path(out)
    # Refused before any work: the table is JSON lines, and its readers (train, eval) know a
    # table's format by its extension, so JSON lines named .parquet would be refused there
    # as "not a ledger export in Parquet" (the way `xrouter export` refuses such a name).
    # An existing directory is another mistake, which writing it reports ("Is a directory").
    if out_path.suffix.lower() != ".jsonl" and not out_path.is_dir():
        named = f"as {out_path.suffix[1:]}" if out_path.suffix else "without an extension"
        raise ConversionError(
            f"convert writes a .jsonl file, but --out {str(out)!r} is named {named}: "
            "name it with .jsonl"
        )
    records = load_converted(fmt, inputs, prices, completion_tokens)
    if not records:
        raise ConversionError(f"no records converted from {', '.join(map(str, inputs))}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    return write_outcome_table(records, out_path)


def add_convert_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("format", choices=FORMATS)
    ap.add_argument("inputs", nargs="+", type=Path, help="source file(s)")
    ap.add_argument(
        "--out",
        type=Path,
        required=True,
        help="outcome table to write (JSON lines; its name must end in .jsonl)",
    )
    ap.add_argument("--prices", type=Path, help="price table (JSON/YAML, USD per 1M tokens)")
    ap.add_argument(
        "--completion-tokens",
        type=int,
        default=DEFAULT_COMPLETION_TOKENS,
        help="assumed completion length where the source records none (routerdc, routellm)",
    )


def run_convert(args: argparse.Namespace) -> int:
    """Convert as ``args`` (from ``add_convert_arguments``) say; 0 on success, 2 on bad input
    (the reason goes to stderr)."""
    try:
        n = convert(args.format, args.inputs, args.out, args.prices, args.completion_tokens)
    except (ConversionError, OSError, UnicodeDecodeError, csv.Error) as exc:
        # The converters name the file they cannot read; OSError also covers an --out that
        # cannot be written.
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {n} records to {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m training.datasets.convert",
        description="Convert routing outcome data to xrouter's outcome table (JSONL).",
    )
    add_convert_arguments(ap)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return run_convert(args)


if __name__ == "__main__":
    raise SystemExit(main())
