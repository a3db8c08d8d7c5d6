"""Price tables for converters whose source records scores but not costs.

Accepted files (JSON or YAML), all in USD per 1M tokens:

- LLMRouter / RouteProfile style: ``{"<model>": {"input_price": 0.2, "output_price": 0.2, ...}}``;
- a plain mapping: ``{"<model>": {"input": 0.2, "output": 0.2}}``;
- an xrouter price catalog: ``{"models": {"<model>": {"input": ..., "output": ...}}}``.

Costs go through ``pricing`` (exact micro-USD per call), so converted tables agree to the
micro-dollar with what the gateway would have charged for the same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pricing import (
    MICROS_PER_USD,
    CatalogError,
    ModelPrice,
    PriceCatalog,
    TokenUsage,
)
from pricing.catalog import yaml_problem
from training.datasets.common import ENCODING, ConversionError


def _one_line(exc: Exception) -> str:
    """``exc`` on one line: a pydantic error (raised, or wrapped by the price catalog) is
    cut to its first problem, ``field: message``, instead of pydantic's multi-line text
    with a documentation link that the CLI's one-line error would spill over."""
    text = str(exc)
    cause = exc if isinstance(exc, ValidationError) else exc.__cause__
    if isinstance(cause, ValidationError) and cause.errors():
        first = cause.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(price)"
        text = text.replace(str(cause), f"{loc}: {first['msg']}")
    return " ".join(text.split())


def _entry_price(name: str, entry: Any, where: str) -> ModelPrice:
    if not isinstance(entry, Mapping):
        raise ConversionError(f"{where}: price of {name!r} is not a mapping")
    if "input_price" in entry or "output_price" in entry:
        data = {"input": entry.get("input_price"), "output": entry.get("output_price")}
    else:
        data = {k: entry.get(k) for k in ("input", "output", "cached_input", "reasoning")}
    data = {k: v for k, v in data.items() if v is not None}
    try:
        return ModelPrice.model_validate({**data, "source": where})
    except ValueError as exc:
        raise ConversionError(f"{where}: bad price for {name!r}: {_one_line(exc)}") from None


def price_catalog_from_mapping(data: Any, where: str = "<prices>") -> PriceCatalog:
    if not isinstance(data, Mapping):
        raise ConversionError(f"{where}: a price table must be a mapping of model -> prices")
    if "models" in data and isinstance(data["models"], Mapping):
        try:
            return PriceCatalog.from_mapping(data)
        except CatalogError as exc:
            raise ConversionError(f"{where}: {_one_line(exc)}") from None
    prices = {str(name): _entry_price(str(name), entry, where) for name, entry in data.items()}
    return PriceCatalog(prices, version=where)


def load_price_table(path: str | Path) -> PriceCatalog:
    p = Path(path)
    try:
        text = p.read_text(encoding=ENCODING)
    except (OSError, UnicodeDecodeError) as exc:  # missing, a directory, not text
        raise ConversionError(f"{p}: cannot read the price table: {exc}") from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConversionError(
            f"{p}: not a valid prices file (JSON or YAML, USD per 1M tokens): {_parse_problem(exc)}"
        ) from None
    return price_catalog_from_mapping(data, str(p))


def _parse_problem(exc: json.JSONDecodeError | yaml.YAMLError) -> str:
    """What the parser found wrong and where, on one line: PyYAML's own text runs over
    several lines, quoting the offending line with a caret under it (a Markdown table row
    of 140 characters, given a README by mistake)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"JSON error at line {exc.lineno}, column {exc.colno}: {exc.msg}"
    return f"YAML error: {yaml_problem(exc)}"


def call_cost_usd(
    catalog: PriceCatalog, model: str, prompt_tokens: int, completion_tokens: int, where: str
) -> float:
    """USD cost of one call, exact (not rounded to the micro-dollar as the ledger does:
    calls to small models cost a few micro-dollars, and rounding would distort the price
    ratios between models that routing decisions depend on)."""
    price = catalog.get(model)
    if price is None:
        raise ConversionError(f"{where}: model {model!r} has no price in the price table")
    micros = price.cost_exact(TokenUsage(prompt_tokens, completion_tokens))
    return float(micros / MICROS_PER_USD)


def require_prices(catalog: PriceCatalog | None, models: list[str], where: str) -> PriceCatalog:
    """Fail early, listing every model the price table lacks."""
    if catalog is None:
        raise ConversionError(f"{where}: this format records no costs: pass a price table")
    missing = [m for m in models if m not in catalog]
    if missing:
        raise ConversionError(f"{where}: no price for model(s) {', '.join(sorted(missing))}")
    return catalog
