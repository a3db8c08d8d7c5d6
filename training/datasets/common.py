"""Pieces every outcome-table converter shares: errors that name the place, score parsing,
Python-literal unwrapping, stable ids and record validation."""

from __future__ import annotations

import ast
import csv
import hashlib
import logging
import math
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from router import outcomes
from router.outcomes import OutcomeRecord

# How source text files are read: UTF-8, with the byte order mark that Excel and Windows
# tools put at the start of a file skipped (read as UTF-8, it would be part of the first
# column's name: "\ufeffsample_id", and that column "missing").
ENCODING = "utf-8-sig"


class ConversionError(ValueError):
    """A source row cannot be converted; the message says where (file:line or file item)
    and what is wrong."""


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Errors reading ``path`` (unreadable, not UTF-8 text, broken CSV) as a
    ConversionError that names it: the converters' one-line error, not a traceback."""
    try:
        yield
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConversionError(f"{path}: cannot read: {exc}") from None


_TRUE = frozenset({"1", "1.0", "true", "t", "yes", "y"})
_FALSE = frozenset({"0", "0.0", "false", "f", "no", "n"})
# Cells that mean "no score" (the row lacks this model's outcome).
MISSING_CELLS = frozenset({"", "nan", "none", "null"})


def check_row_width(row: dict[str | None, Any], width: int, where: str) -> None:
    """A CSV row with more or fewer fields than its header: a truncated or malformed file.
    ``csv.DictReader`` would fill a short row with ``None`` (read as missing scores, the
    row dropped as if a model had no outcome) and file extra fields under ``None``."""
    if None in row or any(v is None for v in row.values()):
        fields = sum(v is not None for k, v in row.items() if k is not None)
        fields += len(row.get(None) or ())
        raise ConversionError(f"{where}: {fields} fields where the header has {width}")


def parse_score(value: Any, where: str) -> float | None:
    """A 0..1 score from a CSV cell or JSON value: numbers, ``True``/``False``, "1"/"0",
    "yes"/"no". Empty cells and NaN are ``None`` (missing); anything else is an error."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        x = float(value)
    else:
        text = str(value).strip()
        if text.lower() in MISSING_CELLS:
            return None
        low = text.lower()
        if low in _TRUE:
            return 1.0
        if low in _FALSE:
            return 0.0
        try:
            x = float(text)
        except ValueError:
            raise ConversionError(
                f"{where}: score {text[:40]!r} is not a number or boolean"
            ) from None
    if math.isnan(x):
        return None
    if not 0.0 <= x <= 1.0:
        raise ConversionError(f"{where}: score {x} is outside [0, 1]")
    return x


def looks_boolean(value: str) -> bool:
    """True for the cell values a correctness column holds (used to find model columns):
    what ``parse_score`` reads as a score or as a missing one."""
    text = value.strip().lower()
    if text in MISSING_CELLS or text in _TRUE or text in _FALSE:
        return True
    try:
        return 0.0 <= float(text) <= 1.0
    except ValueError:
        return False


class ColumnTally:
    """What one CSV column's cells look like, to tell a model's scores from other columns
    (text, notes) when the header does not say: a column whose every non-empty cell is a
    score is a model's; one most of whose cells are scores is a model's too, and its other
    cells are errors — not a reason to leave the model out of the table."""

    def __init__(self) -> None:
        self.scores = 0
        self.others = 0
        self.first_other: tuple[int, str] | None = None

    def add(self, line: int, cell: str) -> None:
        text = cell.strip()
        if text.lower() in MISSING_CELLS:
            return
        if looks_boolean(text):
            self.scores += 1
            return
        self.others += 1
        if self.first_other is None:
            self.first_other = (line, text)

    @property
    def all_scores(self) -> bool:
        return self.scores > 0 and self.others == 0

    @property
    def mostly_scores(self) -> bool:
        return self.scores > self.others


def unwrap_literal_text(text: str) -> str:
    """RouterBench (and RouterDC's re-split of it) stores prompts and responses as the
    ``repr`` of a Python list of strings ("['...']"). Return the text inside; a list of
    several strings yields its last one (the turn a router keys on, as in
    ``router.outcomes.conversation_text``). Text that is not such a literal is returned
    unchanged, so plain-text columns pass through."""
    stripped = text.strip()
    if not (stripped.startswith("[") and stripped.endswith("]")):
        return text
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return str(value[-1])
    return text


def text_id(prefix: str, *parts: str) -> str:
    """A stable id from content, for sources that have none: it survives reordering of
    the source file and sends identical prompts to the same split."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:12]
    return f"{prefix}-{digest}"


def build_record(data: dict[str, Any], where: str) -> OutcomeRecord:
    """Validate one converted record against the outcome-table schema."""
    try:
        return OutcomeRecord.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(record)"
        raise ConversionError(f"{where}: {loc}: {first['msg']}") from None


def models_of_most_items(items: list[tuple[str, Collection[str]]]) -> list[str]:
    """The models a JSON source's items (``(where, models with an outcome)``, over all its
    files) are converted over: those with an outcome in most of them, in order of first
    appearance. An item lacking one of them is then dropped (and counted), as the CSV
    converters drop a row with a missing score: every record of a table must hold every
    model's outcome, or evaluation refuses the table and training drops the model. A
    model with outcomes in only some items (half or fewer) is an error naming it and the
    first item that has it, rather than a model silently left out."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for where, models in items:
        for model in models:
            counts[model] = counts.get(model, 0) + 1
            first.setdefault(model, where)
    total = len(items)
    for model, n in counts.items():
        if 2 * n <= total:
            raise ConversionError(
                f"{first[model]}: model {model!r} has an outcome in only {n} of {total} "
                "items: every record needs every model's outcome; complete or remove that "
                "model's outcomes, or convert the items that have it on their own"
            )
    return list(counts)


class Incomplete:
    """The items of one file dropped for lacking some of ``models``' outcomes, like a CSV row
    with a missing score: such a record would lack that model's outcome, which eval refuses
    and training answers by dropping the model."""

    def __init__(self, models: Collection[str]) -> None:
        self.models = models
        self.dropped = 0
        self.missing: dict[str, int] = {}  # model -> items that lacked it

    def lacks(self, outcomes: Collection[str]) -> bool:
        """Whether an item with outcomes for ``outcomes`` lacks one (it is then counted)."""
        absent = [m for m in self.models if m not in outcomes]
        if absent:
            self.dropped += 1
            for m in absent:
                self.missing[m] = self.missing.get(m, 0) + 1
        return bool(absent)

    def log(self, logger: logging.Logger, path: Path | str, what: str) -> None:
        """Log the items dropped, with how many lacked each model."""
        if self.dropped:
            per_model = ", ".join(f"{m!r}: {n}" for m, n in self.missing.items())
            logger.info(
                "%s: dropped %d %s(s) with a missing model outcome (missing %s)",
                path,
                self.dropped,
                what,
                per_model,
            )


class UniqueIds(outcomes.UniqueIds):
    """Rejects a second record with an id already seen, naming both places (the outcome
    table's own check, raising the converters' error)."""

    error = ConversionError

    def __contains__(self, record_id: str) -> bool:
        return record_id in self._seen
