"""Deterministic train/validation/test splits by a hash of the record id.

A record's split depends only on its id, the seed and the fractions: ``sha256("<seed>:<id>")``
read as a 64-bit integer and scaled to [0, 1) places it, so the split is stable across runs,
machines, Python versions and the order (or subset) of records in the table, and a record
added later never moves an existing one. A record with a ``group`` is placed by the group
instead (``OutcomeRecord.split_key``), so records of one prompt never straddle the split.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from router.outcomes import OutcomeRecord

SPLIT_NAMES = ("train", "validation", "test")
_ALIASES = {"val": "validation", "valid": "validation", "dev": "validation"}
DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)


def hash_unit(record_id: str, seed: int | str = 0) -> float:
    """The record's position in [0, 1)."""
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    # ``not f >= 0``, not ``f < 0``: NaN compares false either way and must be refused.
    if len(fractions) != 3 or not all(f >= 0 and math.isfinite(f) for f in fractions):
        raise ValueError(
            f"need three non-negative fractions (train, validation, test), got {fractions}"
        )
    total = float(sum(fractions))
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"split fractions must sum to 1, got {total}")
    return (float(fractions[0]), float(fractions[1]), float(fractions[2]))


def canonical_split(name: str) -> str:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in SPLIT_NAMES and key != "all":
        raise ValueError(f"unknown split {name!r}: expected train, validation, test or all")
    return key


def split_of(
    record_id: str, fractions: Sequence[float] = DEFAULT_FRACTIONS, seed: int | str = 0
) -> str:
    train, val, _ = check_fractions(fractions)
    u = hash_unit(record_id, seed)
    if u < train:
        return "train"
    if u < train + val:
        return "validation"
    return "test"


@dataclass(frozen=True, slots=True)
class Splits:
    train: list[OutcomeRecord]
    validation: list[OutcomeRecord]
    test: list[OutcomeRecord]

    def get(self, name: str) -> list[OutcomeRecord]:
        key = canonical_split(name)
        if key == "all":
            return [*self.train, *self.validation, *self.test]
        return list(getattr(self, key))


def split_records(
    records: Iterable[OutcomeRecord],
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seed: int | str = 0,
) -> Splits:
    """Partition records (keeping their order within each split)."""
    fr = check_fractions(fractions)
    parts: dict[str, list[OutcomeRecord]] = {name: [] for name in SPLIT_NAMES}
    for r in records:
        parts[split_of(r.split_key, fr, seed)].append(r)
    return Splits(parts["train"], parts["validation"], parts["test"])
