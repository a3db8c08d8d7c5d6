"""Has a checkpoint seen the prompts it is being evaluated on?

A compact checkpoint records how it was trained: the table's SHA-256, a fingerprint of its
record ids, and the id-hash split (seed and fractions) whose training part it was fitted on
and whose validation part chose its best step. Evaluating it on the same table with another
split seed or other fractions puts some of those prompts into the evaluated split, and the
figures come out optimistic without anything looking wrong. This module counts them so
``xrouter eval`` can say so. "The same table" is the same file, or the same records in
another file: the ids' fingerprint catches a Parquet copy of a JSONL export, a table
re-converted or re-serialized, records in another order.

Another table can hold them too: a later ledger export covers the traffic an earlier one
was, and was trained on. A checkpoint directory written by ``xrouter train`` therefore
also keeps the prompts it was fitted and selected on, as 8-byte hashes of their split keys
and of their texts (``seen_prompts.u64``, next to the weights): any table's records whose
key or text is among them were seen, whichever file they come in. The text is needed
because two tables of the same prompts need not share keys: an export's key is the
prompt's hash (its group), the research table the traffic was drawn from keys by record
id. Checkpoints from before the texts keep only the keys, and are checked by them alone.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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


SEEN_FILE = "seen_prompts.u64"


def _key_hashes(keys: Iterable[str]) -> np.ndarray:
    """The first 8 bytes of each key's SHA-256, as little-endian unsigned integers. With a
    million training prompts a record not among them is taken for one about once in 2e13
    tries: a note, not a proof, can live with that."""
    return np.array(
        [int.from_bytes(hashlib.sha256(k.encode()).digest()[:8], "little") for k in keys],
        dtype="<u8",
    )


# Set apart from split keys, so a prompt's text can never pass for some record's key.
_TEXT_PREFIX = "\x00prompt-text\x00"


def text_key(record: OutcomeRecord) -> str | None:
    """What a record's prompt text is known by among seen prompts: its text (the last user
    message, ``OutcomeRecord.text``) in Unicode NFC with runs of whitespace made one space,
    so the same prompt typed into a chat client and stored in a research table match. None
    for a record whose prompt the gateway did not log (a placeholder, the same for many
    requests) or that is empty."""
    if not record.has_prompt:
        return None
    text = " ".join(unicodedata.normalize("NFC", record.text).split())
    return _TEXT_PREFIX + text if text else None


def seen_keys(record: OutcomeRecord) -> Iterator[str]:
    """What :func:`seen_prompt_hashes` keeps of a prompt a checkpoint was fitted or
    selected on: its split key and its text's key."""
    yield record.split_key
    if (text := text_key(record)) is not None:
        yield text


def seen_prompt_hashes(keys: Iterable[str]) -> np.ndarray:
    """The sorted, deduplicated hashes of the keys (from :func:`seen_keys`) of the prompts a
    checkpoint was fitted and selected on (its training and validation parts): what
    :func:`write_seen_prompts` keeps beside it."""
    return np.unique(_key_hashes(keys))


def write_seen_prompts(checkpoint_dir: str | os.PathLike[str], hashes: np.ndarray) -> None:
    """Keep ``hashes`` (from :func:`seen_prompt_hashes`) beside a checkpoint directory."""
    path = Path(checkpoint_dir) / SEEN_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(hashes.tobytes())
    tmp.replace(path)


def read_seen_prompts(checkpoint_dir: str | os.PathLike[str]) -> np.ndarray | None:
    """The sorted hashes :func:`write_seen_prompts` kept, or None where there are none (a
    single-file checkpoint, one from before them, or an unreadable file)."""
    try:
        raw = (Path(checkpoint_dir) / SEEN_FILE).read_bytes()
    except OSError:
        return None
    if len(raw) % 8:
        return None  # not ours, or cut short: nothing to go by
    return np.frombuffer(raw, dtype="<u8")


def _among(seen: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    at = np.minimum(np.searchsorted(seen, hashes), len(seen) - 1)
    return np.asarray(seen[at] == hashes)


def seen_by_hash(seen: np.ndarray, records: Sequence[OutcomeRecord]) -> int:
    """How many of ``records`` have a split key or a prompt text among the ``seen`` hashes
    (sorted)."""
    if not len(seen) or not records:
        return 0
    hit = _among(seen, _key_hashes(r.split_key for r in records))
    # A record without a text to go by is checked by its key alone (its key again).
    texts = _key_hashes(text_key(r) or r.split_key for r in records)
    return int(np.count_nonzero(hit | _among(seen, texts)))


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
