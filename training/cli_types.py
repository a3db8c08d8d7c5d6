"""argparse ``type`` functions shared by the training CLIs (``xrouter train``, ``eval``,
``verl-data``).

Each raises ``argparse.ArgumentTypeError`` with a message that says what the option takes:
argparse prints that message after the option's name. A ``ValueError`` instead makes argparse
print ``invalid <the function's __name__> value``, which named private helpers
(``invalid _neighbour_counts value: 'abc'``) and said nothing of what was expected.
"""

from __future__ import annotations

import argparse
import math


def _items(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def numbers(text: str) -> tuple[float, ...]:
    """Comma-separated finite, non-negative numbers, at least one: cost weights (λ), split
    fractions. NaN passes a ``< 0`` test and would poison every reward it weighs, so it is
    refused here with the infinities."""
    try:
        values = tuple(float(v) for v in _items(text))
    except ValueError:
        values = ()
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated non-negative numbers, got {text!r}"
        )
    return values


def price_pair(text: str) -> tuple[float, float]:
    """Two prices, USD per 1M input and output tokens: ``IN,OUT`` or ``IN/OUT``, as ``xrouter
    eval --policy llm:...#price=IN/OUT`` writes a price."""
    try:
        values = tuple(float(v) for v in _items(text.replace("/", ",")))
    except ValueError:
        values = ()
    if len(values) != 2 or any(not math.isfinite(v) or v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected two non-negative prices, IN,OUT or IN/OUT (USD per 1M tokens), got {text!r}"
        )
    return values[0], values[1]


def _positive_ints(text: str) -> tuple[int, ...] | None:
    """The integers of a comma-separated list, or None if one is not a positive integer."""
    try:
        values = tuple(int(v) for v in _items(text))
    except ValueError:
        return None
    return values if all(v >= 1 for v in values) else None


def positive_ints(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, at least one (``--knn``/``--cascade`` neighbour
    counts: an empty list used to read as the flag not given, and trained a network)."""
    values = _positive_ints(text)
    if not values:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, e.g. 50,100,200, got {text!r}"
        )
    return values


def layer_widths(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, or nothing: hidden-layer widths (none is a linear
    policy)."""
    values = _positive_ints(text)
    if values is None:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers (layer widths, e.g. 128,128; "
            f"'' for none), got {text!r}"
        )
    return values


def positive_int(text: str) -> int:
    """An integer of at least 1 (``--threads``: torch takes no 0 or negative thread count,
    and 0 was silently trained with 1)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
