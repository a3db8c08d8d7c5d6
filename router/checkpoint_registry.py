"""The checkpoint registry: the compact checkpoints found on disk, read from metadata only.

``xrouter checkpoints`` lists them; a checkpoint, an ``xrouter train`` run directory and a
directory of either are all searched. How one checkpoint is named and read (a path, a run
directory, ``packaged:<name>``) is :mod:`router.checkpoint`'s business.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path

from router.checkpoint import (
    META_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    CheckpointMetadata,
    is_single_file,
    read_metadata,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    path: Path
    metadata: CheckpointMetadata


def _is_checkpoint(path: Path) -> bool:
    return (path.is_dir() and (path / META_FILE).is_file()) or (
        path.is_file() and is_single_file(path)
    )


# How far below a directory named to the registry it looks for run directories: a
# directory of runs two levels down (``xrouter checkpoints`` in a project whose runs are in
# ``runs/<name>``) is found, while a home directory is not walked whole.
SEARCH_DEPTH = 3


def _candidates(root: Path, steps: bool, depth: int = SEARCH_DEPTH) -> list[Path]:
    """``root`` itself if it is a checkpoint; else the checkpoints of ``root`` as a run
    directory (``checkpoint``, ``checkpoints/step_*`` with ``steps``, and the run an
    ``--overwrite`` replaced, ``previous/``); else those found in the directories under it,
    ``depth`` levels down at most (which also ends a symlink loop; hidden ones are not
    entered)."""
    if _is_checkpoint(root):
        return [root]
    if not root.is_dir():
        return []
    run = [root / "checkpoint"] if _is_checkpoint(root / "checkpoint") else []
    if run:
        if steps and (root / "checkpoints").is_dir():
            run += [p for p in sorted((root / "checkpoints").iterdir()) if _is_checkpoint(p)]
        if (root / "previous").is_dir():
            run += _candidates(root / "previous", steps, 0)
        return run
    if depth <= 0:
        return []
    found: list[Path] = []
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:  # unreadable: skipped, as an unreadable checkpoint is
        logger.warning("skipping %s: %s", root, exc)
        return []
    for entry in entries:
        if entry.name.startswith("."):
            continue  # .git, .venv, a run's .replaced-<pid>: nobody's checkpoints
        found += _candidates(entry, steps, depth - 1)
    return found


def list_checkpoints(
    directories: str | Path | list[str | Path], *, steps: bool = False
) -> list[CheckpointInfo]:
    """The checkpoint registry: every checkpoint found under ``directories`` — a checkpoint,
    a run directory of ``xrouter train`` (its ``checkpoint``; with ``steps`` also its
    intermediate ``checkpoints/step_*``), or a directory of either — newest first. Only
    metadata is read. Unreadable entries are skipped with a warning."""
    roots = [directories] if isinstance(directories, str | Path) else list(directories)
    seen: set[Path] = set()
    found: list[CheckpointInfo] = []
    for root in roots:
        for path in _candidates(Path(root), steps):
            key = path.resolve()
            if key in seen:
                continue
            seen.add(key)
            if path.is_dir() and not (path / WEIGHTS_FILE).is_file():
                # Listed, it would be offered to deploy and eval, which refuse it.
                logger.warning("skipping %s: no %s", path, WEIGHTS_FILE)
                continue
            try:
                found.append(CheckpointInfo(path, read_metadata(path)))
            except CheckpointError as exc:
                logger.warning("skipping %s: %s", path, exc)
    found.sort(key=_created, reverse=True)
    return found


def _created(info: CheckpointInfo) -> dt.datetime:
    """When ``info``'s checkpoint was made, comparable with every other: one whose
    ``created_at`` has no zone (written by hand, or by another tool) is taken as UTC, as
    xrouter writes them; comparing it with an aware one raised TypeError."""
    created = info.metadata.created_at
    return created if created.tzinfo is not None else created.replace(tzinfo=dt.UTC)
