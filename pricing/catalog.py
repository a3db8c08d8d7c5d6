"""The versioned price catalog.

The packaged catalog (``pricing/data/catalog.yaml``) is seeded from LiteLLM's model cost
map by ``python -m pricing.seed`` and from the model cards of the demo pool; deployments
override or extend it from their config. A model with no price is an error, never $0:
self-hosted models say ``price: 0`` explicitly.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from decimal import ROUND_CEILING, Decimal
from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pricing.money import round_micros
from pricing.usage import TokenUsage


class CatalogError(ValueError):
    """A price is missing or malformed."""


class ModelPrice(BaseModel):
    """Prices in USD per million tokens (= micro-USD per token)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Decimal = Field(ge=0)
    output: Decimal = Field(ge=0)
    cached_input: Decimal | None = Field(default=None, ge=0)
    reasoning: Decimal | None = Field(default=None, ge=0)
    effective_date: dt.date | None = None
    source: str = "config"

    @field_validator("input", "output", "cached_input", "reasoning", mode="before")
    @classmethod
    def _no_float_drift(cls, v: Any) -> Any:
        # YAML gives floats; go through str so 0.15 stays 0.15 exactly.
        return Decimal(str(v)) if isinstance(v, float) else v

    @classmethod
    def free(cls, source: str = "self-hosted") -> ModelPrice:
        return cls(input=Decimal(0), output=Decimal(0), source=source)

    @property
    def is_free(self) -> bool:
        return not (self.input or self.output or self.cached_input or self.reasoning)

    def cost_exact(self, usage: TokenUsage) -> Decimal:
        """Exact cost in micro-USD (a Decimal)."""
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        reasoning = min(usage.reasoning_tokens, usage.completion_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        reasoning_price = self.output if self.reasoning is None else self.reasoning
        return (
            (usage.prompt_tokens - cached) * self.input
            + cached * cached_price
            + (usage.completion_tokens - reasoning) * self.output
            + reasoning * reasoning_price
        )

    def cost_micros(self, usage: TokenUsage) -> int:
        """Cost of one call in integer micro-USD, rounded once, half-up."""
        return round_micros(self.cost_exact(usage))

    def worst_case_micros(self, prompt_tokens: int, max_output_tokens: int) -> int:
        """Upper bound used for budget reservations: every prompt token uncached, every
        output token at the dearer of the output and reasoning prices."""
        out_price = max(self.output, self.reasoning or Decimal(0))
        exact = prompt_tokens * self.input + max_output_tokens * out_price
        # Round up: a reservation must never be below what the call can cost.
        return int(exact.to_integral_value(rounding=ROUND_CEILING))


class PriceCatalog:
    """An immutable name → price map with a version string."""

    def __init__(self, prices: Mapping[str, ModelPrice], version: str = "custom") -> None:
        self._prices = dict(prices)
        self.version = version

    def __contains__(self, name: object) -> bool:
        return name in self._prices

    def __len__(self) -> int:
        return len(self._prices)

    def names(self) -> Iterable[str]:
        return self._prices.keys()

    def get(self, name: str) -> ModelPrice | None:
        return self._prices.get(name)

    def require(self, name: str) -> ModelPrice:
        price = self._prices.get(name)
        if price is None:
            raise CatalogError(
                f"no price for model {name!r}: add it to the price catalog or the pool entry "
                "(use `price: 0` for a self-hosted model)"
            )
        return price

    def with_overrides(
        self, overrides: Mapping[str, ModelPrice], version: str | None = None
    ) -> PriceCatalog:
        merged = {**self._prices, **overrides}
        return PriceCatalog(merged, version or f"{self.version}+overrides")

    def snapshot(self, names: Iterable[str]) -> dict[str, dict[str, str]]:
        """A JSON-able copy of some prices, stored in router checkpoints and the ledger."""
        out: dict[str, dict[str, str]] = {}
        for name in names:
            p = self.require(name)
            out[name] = {k: str(v) for k, v in p.model_dump(exclude_none=True).items()}
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PriceCatalog:
        if not isinstance(data, Mapping) or "models" not in data:
            raise CatalogError("a price catalog needs a top-level `models:` mapping")
        models = data.get("models") or {}
        if not isinstance(models, Mapping):
            raise CatalogError("a price catalog's `models:` must map model names to prices")
        prices: dict[str, ModelPrice] = {}
        for name, entry in models.items():
            try:
                prices[str(name)] = ModelPrice.model_validate(entry)
            except ValueError as exc:
                raise CatalogError(f"bad price for {name!r}: {exc}") from exc
        return cls(prices, str(data.get("version", "custom")))

    @classmethod
    def from_yaml(cls, text: str) -> PriceCatalog:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CatalogError(f"a price catalog that is not YAML: {yaml_problem(exc)}") from None
        return cls.from_mapping(data or {})


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong with a YAML text and where, on one line and without quoting the text:
    PyYAML's own message runs over several lines, quoting the offending line with a caret
    under it. Lines and columns count from 1, as editors and the JSON parser do."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem or exc.context or 'syntax error'}{where}"
    return " ".join(str(exc).split()) or type(exc).__name__


def load_default_catalog() -> PriceCatalog:
    """The catalog shipped in the package."""
    text = resources.files("pricing").joinpath("data/catalog.yaml").read_text(encoding="utf-8")
    return PriceCatalog.from_yaml(text)
