"""Price catalog and exact cost arithmetic. Imports nothing else of xrouter's."""

from pricing.catalog import CatalogError, ModelPrice, PriceCatalog, load_default_catalog
from pricing.money import MICROS_PER_USD, micros_to_usd, usd_to_micros
from pricing.usage import TokenUsage, estimate_tokens, tokens_for_chars

__all__ = [
    "MICROS_PER_USD",
    "CatalogError",
    "ModelPrice",
    "PriceCatalog",
    "TokenUsage",
    "estimate_tokens",
    "load_default_catalog",
    "micros_to_usd",
    "tokens_for_chars",
    "usd_to_micros",
]
