"""Has a checkpoint seen the prompts it is being evaluated on?

A compact checkpoint records how it was trained: the table's SHA-256 and the id-hash split
(seed and fractions) whose training part it was fitted on and whose validation part chose
its best step. Evaluating it on the same table with another split seed or other fractions
puts some of those prompts into the evaluated split, and the figures come out optimistic
without anything looking wrong. This module counts them so ``xrouter eval`` can say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.outcomes import OutcomeRecord
from training.datasets.splits import DEFAULT_FRACTIONS, split_of


def seen_in_training(
    training: Mapping[str, Any], records: Sequence[OutcomeRecord], table_sha256: str
) -> int | None:
    """How many of ``records`` the checkpoint was fitted or selected on (its training and
    validation parts), or None when it was trained on another table or did not record its
    table and split."""
    table = training.get("table")
    config = training.get("config")
    if not isinstance(table, Mapping) or not isinstance(config, Mapping):
        return None
    if table.get("sha256") != table_sha256:
        return None
    seed = config.get("split_seed", 0)
    fractions = config.get("fractions", DEFAULT_FRACTIONS)
    try:
        return sum(split_of(r.id, fractions, seed) != "test" for r in records)
    except (TypeError, ValueError):  # a malformed record of the split: nothing to go by
        return None
