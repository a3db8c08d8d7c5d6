"""Outcome-table converters (RouterBench, RouterDC, RouteLLM, RouteProfile, ledger exports)
and deterministic splits.

The conversion entry points live in ``training.datasets.convert`` (``convert``,
``load_converted``, the CLI); they are not re-exported here so that ``python -m
training.datasets.convert`` does not find its own module already imported by the package.
"""

from pricing import estimate_tokens
from training.datasets.common import ConversionError
from training.datasets.prices import load_price_table
from training.datasets.splits import Splits, hash_unit, split_of, split_records

__all__ = [
    "ConversionError",
    "Splits",
    "estimate_tokens",
    "hash_unit",
    "load_price_table",
    "split_of",
    "split_records",
]
