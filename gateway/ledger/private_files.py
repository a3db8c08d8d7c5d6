"""Files the gateway makes that hold ledger data (journal segments, the SQLite ledger,
exports): readable by their owner only, whatever the umask.

The journal holds whole ledger records (prompts and answers, with ``ledger.log_content:
full``), as the database does; under the usual umask 022 a plain ``open`` made them
world-readable (0644). Files are created 0600 and a directory the gateway makes for them
0700. A file or directory that already exists keeps its mode: an operator who made it (or
opened it up for a group) decided who reads it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

FILE_MODE = 0o600
DIR_MODE = 0o700


def open_private_append(path: Path) -> IO[bytes]:
    """``path.open("ab")``, created 0600 if it does not exist."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    return os.fdopen(fd, "ab")


def create_private(path: Path) -> IO[bytes]:
    """A new file at ``path`` (one of our own temporary names) for writing, 0600. One left
    behind by an earlier run under the same name is truncated and made 0600 again."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "wb")


def precreate_private(path: Path) -> bool:
    """Create ``path`` empty and 0600 if nothing is there yet; True if this call made it.

    For SQLite: it creates the database with the default mode (0644 under umask 022) and
    gives the ``-wal`` and ``-shm`` files the database file's mode, so a database file made
    0600 first keeps all three private. An empty file is an empty database to SQLite. A
    file that exists (or that cannot be made here: SQLite then says why) is left alone."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except OSError:
        return False
    os.close(fd)
    return True


def make_private_dir(path: Path) -> None:
    """``path.mkdir(parents=True, exist_ok=True)``; ``path`` itself, if made here, is 0700
    (its missing parents get the usual mode: they may hold other things)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
