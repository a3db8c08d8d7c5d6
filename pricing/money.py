"""Money as integer micro-USD.

Prices are quoted in USD per million tokens, which is exactly micro-USD per token, so a
call's cost is ``tokens x price`` in micro-USD with no unit conversion. We keep prices as
``Decimal`` and round each *call* once to an integer number of micro-USD (half-up). Every
total (a request, a key's spend, a report) is a sum of those integers, so totals reconcile
to the micro-dollar no matter how they are grouped: there is no float anywhere on the
accounting path. Floats appear only at the API edge (``usage.cost`` in USD).
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

MICROS_PER_USD = 1_000_000
# The largest amount anything takes as input (a budget, a request's spending cap): the ledger
# keeps micro-USD in BIGINT columns, and $1e12 is 1e18 micro-USD, well inside 2^63.
MAX_USD = 1e12
_ONE = Decimal(1)


def round_micros(amount: Decimal) -> int:
    """Round an exact micro-USD amount to an integer, half-up (never banker's rounding:
    a call that costs 0.5 µUSD is charged, not forgiven)."""
    return int(amount.quantize(_ONE, rounding=ROUND_HALF_UP))


def usd_to_micros(usd: Decimal | str | int | float) -> int:
    """Convert a USD amount to integer micro-USD. Floats go through ``str`` so that
    0.1 becomes exactly 100000, not 100000.00000000001."""
    value = usd if isinstance(usd, Decimal) else Decimal(str(usd))
    return round_micros(value * MICROS_PER_USD)


def micros_to_usd(micros: int) -> float:
    """For display and JSON only."""
    return micros / MICROS_PER_USD


def format_usd(micros: int) -> str:
    """Fixed-point string with six decimals, used in headers (``0.000123``)."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_USD)
    return f"{sign}{whole}.{frac:06d}"
