"""RouterBench-style wide CSV -> outcome records.

Columns (Hu et al. 2024; RouterDC's re-split keeps them): ``sample_id``, ``prompt``,
``eval_name``, then per model ``<model>`` (0/1 correctness), ``<model>|total_cost`` (USD
actually charged) and ``<model>|model_response``. Other columns (the unnamed index,
``oracle_model_to_route_to``) are ignored. Prompts and responses are stored as the ``repr``
of a one-element Python list and are unwrapped. Rows where any model lacks a score or a cost
are dropped (RouterBench has a few: partially failed runs) and counted in the log. A model
with a score column but no cost column (or the reverse) is an error, not a dropped model. A
model's name may hold ``|``: it is whatever precedes the ``|total_cost`` of its cost column.
"""

from __future__ import annotations

import csv
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from router.outcomes import OutcomeRecord
from training.datasets.common import (
    ENCODING,
    MISSING_CELLS,
    ColumnTally,
    ConversionError,
    Incomplete,
    UniqueIds,
    build_record,
    check_row_width,
    parse_score,
    reading,
    unwrap_literal_text,
)

logger = logging.getLogger(__name__)

COST_SUFFIX = "|total_cost"
RESPONSE_SUFFIX = "|model_response"
ID_COLUMN = "sample_id"
PROMPT_COLUMN = "prompt"
TASK_COLUMN = "eval_name"
_NOT_MODELS = frozenset({"", ID_COLUMN, PROMPT_COLUMN, TASK_COLUMN, "oracle_model_to_route_to"})


def model_columns(header: list[str]) -> list[str]:
    """Models are the columns that have a matching ``<model>|total_cost`` column (a name
    with a ``|`` in it too: ``org|model`` and ``org|model|total_cost`` are a model)."""
    names = set(header)
    return [c for c in header if c not in _NOT_MODELS and c + COST_SUFFIX in names]


def _incomplete_model(header: list[str]) -> str | None:
    """What is wrong with the first model the header names (by any of its three columns)
    but lacks its score or its cost column, or None. Such a model would otherwise vanish
    from the table without a word, changing the pool every router is compared over."""
    names = set(header)
    for col in header:
        for suffix in (COST_SUFFIX, RESPONSE_SUFFIX):
            model = col.removesuffix(suffix)
            if model == col:
                continue
            if model not in names:
                return f"column {col!r} has no score column {model!r}"
            if model + COST_SUFFIX not in names:
                return f"model {model!r} has no cost column {model + COST_SUFFIX!r}"
    return None


def _looks_like_scores(header: list[str]) -> list[str]:
    """Columns that could be a model's scores but have no cost column: checked against the
    cells once the file is read (a 0/1 column there is a model whose cost is missing)."""
    names = set(header)
    return [
        c
        for c in header
        if c not in _NOT_MODELS
        and not c.endswith((COST_SUFFIX, RESPONSE_SUFFIX))
        and c + COST_SUFFIX not in names
        and not c.lower().startswith("unnamed")
    ]


def _parse_cost(value: str, where: str) -> float | None:
    text = value.strip()
    if text.lower() in MISSING_CELLS:  # as a score's: "", NaN, None, null
        return None
    try:
        cost = float(text)
    except ValueError:
        raise ConversionError(f"{where}: cost {text[:40]!r} is not a number") from None
    if not math.isfinite(cost):
        # orjson writes inf as null: the table would silently lose the cost.
        raise ConversionError(f"{where}: cost {text[:40]!r} is not a finite number")
    if cost < 0:
        raise ConversionError(f"{where}: negative cost {cost}")
    return cost


def iter_routerbench_csv(
    path: str | Path, ids: UniqueIds | None = None, with_responses: bool = True
) -> Iterator[OutcomeRecord]:
    p = Path(path)
    ids = ids or UniqueIds()
    # Responses can be long: lift the csv module's 128 KiB field cap.
    csv.field_size_limit(sys.maxsize)
    with reading(p), p.open(newline="", encoding=ENCODING) as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        for required in (ID_COLUMN, PROMPT_COLUMN):
            if required not in header:
                raise ConversionError(f"{p}:1: missing column {required!r}")
        incomplete = _incomplete_model(header)
        if incomplete is not None:
            raise ConversionError(f"{p}:1: {incomplete}: every model needs both")
        models = model_columns(header)
        if not models:
            raise ConversionError(
                f"{p}:1: no model columns (need `<model>` and `<model>|total_cost`)"
            )
        # Other columns are a model without a cost column if most of their non-empty
        # cells are scores (all of them, or all but a stray one: the model is no less
        # missing from the table for a cell that is not a score).
        suspects = {col: ColumnTally() for col in _looks_like_scores(header)}
        gaps = Incomplete(models)
        for row in reader:
            where = f"{p}:{reader.line_num}"
            check_row_width(row, len(header), where)
            for col, tally in suspects.items():
                tally.add(reader.line_num, row.get(col) or "")
            outcomes: dict[str, dict[str, Any]] = {}
            for m in models:
                score = parse_score(row.get(m), f"{where}: column {m!r}")
                cost = _parse_cost(
                    row.get(m + COST_SUFFIX) or "", f"{where}: column {m + COST_SUFFIX!r}"
                )
                if score is None or cost is None:
                    # Missing: the row is dropped below, but only once every cell has been
                    # read, so that a bad cell after the gap is an error, not a row left out.
                    continue
                out: dict[str, Any] = {"score": score, "cost_usd": cost}
                response = row.get(m + RESPONSE_SUFFIX)
                if with_responses and response is not None:
                    out["response"] = unwrap_literal_text(response)
                outcomes[m] = out
            if gaps.lacks(outcomes):  # a score or a cost missing
                continue
            record_id = (row.get(ID_COLUMN) or "").strip()
            if not record_id:
                raise ConversionError(f"{where}: empty {ID_COLUMN}")
            ids.check(record_id, where)
            data: dict[str, Any] = {
                "id": record_id,
                "prompt": unwrap_literal_text(row.get(PROMPT_COLUMN) or ""),
                "outcomes": outcomes,
            }
            if row.get(TASK_COLUMN):
                data["task"] = row[TASK_COLUMN]
            yield build_record(data, where)
    scores_only = [(col, tally) for col, tally in suspects.items() if tally.mostly_scores]
    if scores_only:
        col, tally = scores_only[0]
        stray = ""
        if tally.first_other is not None:
            line, cell = tally.first_other
            stray = f" (all but {cell[:40]!r} at line {line})"
        raise ConversionError(
            f"{p}:1: column {col!r} holds 0/1 scores{stray} but there is no "
            f"{col + COST_SUFFIX!r} column: add the model's costs, or remove the column if "
            "it is not a model's"
        )
    gaps.log(logger, p, "row")


def convert_routerbench(paths: list[Path], prices: Any = None) -> Iterator[OutcomeRecord]:
    """All CSVs in order; ids must be unique across them. RouterBench records real costs,
    so ``prices`` is not used."""
    _check_same_models(paths)
    ids = UniqueIds()
    for path in paths:
        yield from iter_routerbench_csv(path, ids)


def _check_same_models(paths: list[Path]) -> None:
    """Refuse files whose model columns differ, before any record is written: every record
    of an outcome table holds every model's outcome, and a table mixing two pools is refused
    by eval (and trained on a pool train narrows unsaid). Only the headers are read."""
    first: tuple[Path, set[str]] | None = None
    for path in paths:
        with reading(path), path.open(newline="", encoding=ENCODING) as fh:
            header = next(csv.reader(fh), [])
        models = set(model_columns(header))
        if not models:
            continue  # said by iter_routerbench_csv, with its line
        if first is None:
            first = (path, models)
        elif models != first[1]:
            only = sorted(models - first[1])
            lacks = sorted(first[1] - models)
            said = "; ".join(
                part
                for part in (
                    f"it has {', '.join(map(repr, only))}" if only else "",
                    f"it lacks {', '.join(map(repr, lacks))}" if lacks else "",
                )
                if part
            )
            raise ConversionError(
                f"{path}:1: its models differ from {first[0]}'s ({said}): every record of a "
                "table needs every model's outcome; convert files of one model set together"
            )
