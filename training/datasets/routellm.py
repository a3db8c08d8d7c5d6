"""RouteLLM evaluation CSV -> outcome records.

RouteLLM's benchmark files (MMLU, GSM8K, MT-Bench derivatives) hold a ``prompt`` column and
one correctness column per model (``True``/``False``, ``1``/``0`` or a 0..1 score). We are
liberal in what we read: any column other than the prompt, an id (``id``, ``sample_id``,
``idx``, ``question_id``) or a task (``task``, ``eval_name``, ``category``, ``subject``)
whose every non-empty cell is boolean-like is a model column, unless ``models`` names them
explicitly; a column of numbers some of which lie outside [0, 1] is refused (scores must be
rescaled), not skipped like a text column, and so is a column most of whose cells are scores
(or one the price table names as a model) with a cell that is not one (``N/A``): the model
would otherwise be left out of the table. An empty cell (or ``nan``, ``none``, ``null``) is
a missing score: the row is dropped and counted in the log. Costs come from a price table with token counts estimated from the prompt
length and an assumed completion length (``cost_estimated: true``). Without an id column
a record's id is a hash of its prompt, so a prompt repeated (within or across files) is
kept once, at its first occurrence.
"""

from __future__ import annotations

import csv
import logging
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pricing import PriceCatalog, estimate_tokens
from router.outcomes import OutcomeRecord
from training.datasets.common import (
    ENCODING,
    ColumnTally,
    ConversionError,
    Incomplete,
    UniqueIds,
    build_record,
    check_row_width,
    looks_boolean,
    parse_score,
    reading,
    text_id,
)
from training.datasets.prices import call_cost_usd, require_prices
from training.datasets.routerdc import DEFAULT_COMPLETION_TOKENS

logger = logging.getLogger(__name__)

PROMPT_COLUMNS = ("prompt", "question", "turns")
ID_COLUMNS = ("id", "sample_id", "idx", "question_id")
TASK_COLUMNS = ("task", "eval_name", "category", "subject")


def _first_present(header: Sequence[str], names: Sequence[str]) -> str | None:
    return next((n for n in names if n in header), None)


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _detect_models(
    path: Path,
    header: list[str],
    rows: list[tuple[int, dict[str, str]]],
    reserved: set[str],
    prices: PriceCatalog | None = None,
) -> list[str]:
    models = []
    for col in header:
        if col in reserved or not col.strip() or col.lower().startswith("unnamed"):
            continue
        cells = [(line, row.get(col) or "") for line, row in rows]
        tally = ColumnTally()
        for line, cell in cells:
            tally.add(line, cell)
        if tally.all_scores:
            models.append(col)
            continue
        # Text columns (notes, answers) are skipped by design; but a column of scores and
        # numbers is a model's, and scores outside [0, 1] must be rescaled, not dropped.
        outside = [
            (line, c) for line, c in cells if not looks_boolean(c) and _number(c) is not None
        ]
        if outside and all(looks_boolean(c) or _number(c) is not None for _, c in cells):
            line, cell = outside[0]
            raise ConversionError(
                f"{path}:{line}: column {col!r} holds numbers outside [0, 1] (e.g. "
                f"{cell.strip()[:40]!r}): scores must be in [0, 1]; rescale the column, or "
                "remove it if it is not a model's scores"
            )
        # A model's column with a stray cell that is not a score ("N/A", "error"): an
        # error at that cell, as in a column known to be a model's, not a model dropped.
        priced = prices is not None and col in prices
        if tally.first_other is not None and (tally.mostly_scores or (priced and tally.scores)):
            line, cell = tally.first_other
            why = (
                "most of its cells are scores"
                if tally.mostly_scores
                else "the price table names it as a model"
            )
            raise ConversionError(
                f"{path}:{line}: column {col!r}: score {cell[:40]!r} is not a number or "
                f"boolean (the column is a model's: {why}): leave a missing score empty, "
                "or remove the column if it is not a model's"
            )
        logger.debug("column %r is not a correctness column: ignored", col)
    return models


def convert_routellm(
    paths: list[Path],
    prices: PriceCatalog | None,
    completion_tokens: int = DEFAULT_COMPLETION_TOKENS,
    models: Sequence[str] | None = None,
) -> Iterator[OutcomeRecord]:
    csv.field_size_limit(sys.maxsize)
    ids = UniqueIds()
    for path in paths:
        with reading(path), path.open(newline="", encoding=ENCODING) as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            # Keep each row's physical line number for error messages.
            rows = [(reader.line_num, row) for row in reader]
        prompt_col = _first_present(header, PROMPT_COLUMNS)
        if prompt_col is None:
            raise ConversionError(
                f"{path}:1: no prompt column (one of {', '.join(PROMPT_COLUMNS)})"
            )
        id_col = _first_present(header, ID_COLUMNS)
        task_col = _first_present(header, TASK_COLUMNS)
        reserved = {c for c in (prompt_col, id_col, task_col) if c}
        if models:
            absent = [m for m in models if m not in header]
            if absent:
                raise ConversionError(f"{path}:1: no column for model(s) {', '.join(absent)}")
            cols = list(models)
        else:
            cols = _detect_models(path, header, rows, reserved, prices)
        if not cols:
            raise ConversionError(f"{path}:1: no model correctness columns found")
        catalog = require_prices(prices, cols, str(path))
        incomplete, repeated = Incomplete(cols), 0
        for line, row in rows:
            where = f"{path}:{line}"
            check_row_width(row, len(header), where)
            prompt = row.get(prompt_col) or ""
            if not prompt.strip():
                raise ConversionError(f"{where}: empty {prompt_col!r}")
            scores = {m: parse_score(row.get(m), f"{where}: column {m!r}") for m in cols}
            if incomplete.lacks([m for m, s in scores.items() if s is not None]):
                continue
            prompt_tokens = estimate_tokens(prompt)
            outcomes = {
                m: {
                    "score": s,
                    "cost_usd": call_cost_usd(catalog, m, prompt_tokens, completion_tokens, where),
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "cost_estimated": True,
                }
                for m, s in scores.items()
            }
            raw_id = (row.get(id_col) or "").strip() if id_col else ""
            record_id = raw_id or text_id("routellm", prompt)
            if not raw_id and record_id in ids:
                # The same prompt again (RouteLLM's MMLU files repeat about a hundred
                # questions, within and across subjects): one prompt, kept once, or it
                # would weigh twice. An explicit id repeated is still an error.
                repeated += 1
                continue
            ids.check(record_id, where)
            data: dict[str, Any] = {"id": record_id, "prompt": prompt, "outcomes": outcomes}
            if task_col and row.get(task_col):
                data["task"] = row[task_col]
            yield build_record(data, where)
        incomplete.log(logger, path, "row")
        if repeated:
            logger.info(
                "%s: dropped %d repeated prompt(s) (kept the first occurrence)", path, repeated
            )
