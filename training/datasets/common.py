"""Pieces every outcome-table converter shares: errors that name the place, score parsing,
Python-literal unwrapping, stable ids and record validation."""

from __future__ import annotations

import ast
import csv
import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from router import outcomes
from router.outcomes import OutcomeRecord


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
        if not text or text.lower() in {"nan", "none", "null"}:
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
    """True for the cell values a correctness column holds (used to find model columns)."""
    text = value.strip().lower()
    if not text or text in _TRUE or text in _FALSE or text in {"nan", "none"}:
        return True
    try:
        return 0.0 <= float(text) <= 1.0
    except ValueError:
        return False


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


class UniqueIds(outcomes.UniqueIds):
    """Rejects a second record with an id already seen, naming both places (the outcome
    table's own check, raising the converters' error)."""

    error = ConversionError

    def __contains__(self, record_id: str) -> bool:
        return record_id in self._seen
