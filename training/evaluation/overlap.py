"""Has a checkpoint seen the prompts it is being evaluated on?

A compact checkpoint records how it was trained: the table's SHA-256, a fingerprint of its
record ids, and the id-hash split (seed and fractions) whose training part it was fitted on
and whose validation part chose its best step. Evaluating it on the same table with another
split seed or other fractions puts some of those prompts into the evaluated split, and the
figures come out optimistic without anything looking wrong. This module counts them so
``xrouter eval`` can say so. "The same table" is the same file, or the same records in
another file: the ids' fingerprint catches a Parquet copy of a JSONL export, a table
re-converted or re-serialized, records in another order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from router.outcomes import OutcomeRecord
from training.datasets.splits import DEFAULT_FRACTIONS, split_of


def ids_fingerprint(records: Iterable[OutcomeRecord]) -> str:
    """SHA-256 of a table's record ids, in sorted order: the same for the same records
    however they are stored (JSONL or Parquet, any order, any formatting)."""
    digest = hashlib.sha256()
    for record_id in sorted(r.id for r in records):
        digest.update(record_id.encode())
        digest.update(b"\n")
    return digest.hexdigest()


def seen_in_training(
    training: Mapping[str, Any],
    records: Sequence[OutcomeRecord],
    table_sha256: str,
    ids_sha256: str | None = None,
) -> int | None:
    """How many of ``records`` the checkpoint was fitted or selected on (its training and
    validation parts), or None when it was trained on another table or did not record its
    table and split. The evaluated table is the training one when its file's SHA-256
    (``table_sha256``) or its record ids' fingerprint (``ids_sha256``, of every record in
    it, from :func:`ids_fingerprint`) is the one the checkpoint recorded."""
    table = training.get("table")
    config = training.get("config")
    if not isinstance(table, Mapping) or not isinstance(config, Mapping):
        return None
    same_file = table.get("sha256") == table_sha256
    same_ids = ids_sha256 is not None and table.get("ids_sha256") == ids_sha256
    if not (same_file or same_ids):
        return None
    seed = config.get("split_seed", 0)
    fractions = config.get("fractions", DEFAULT_FRACTIONS)
    # A checkpoint from before groups split its table by id alone, whatever groups a later
    # export of the same records carries.
    by_group = table.get("split_by") == "group"
    try:
        return sum(
            split_of(r.split_key if by_group else r.id, fractions, seed) != "test" for r in records
        )
    except (TypeError, ValueError):  # a malformed record of the split: nothing to go by
        return None
