"""How the training CLIs (``xrouter train``, ``eval``, ``verl-data``) word common mistakes,
one ``error:`` line each and alike in all three: a table they cannot read, a path they cannot
write, and an option that names a model the table does not have."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

# The OS's errors for a path, as a user would say them: its own text ("[Errno 2] No such
# file or directory: 'nope.jsonl'") repeats the path and carries the errno.
_PROBLEMS = {
    errno.ENOENT: "no such file",
    errno.EISDIR: "a directory, not a file",
    errno.EACCES: "permission denied",
    errno.ENOTDIR: "no such file (a part of its path is not a directory)",
}


def unreadable(path: str | Path, exc: OSError) -> str:
    """``cannot read PATH: no such file`` (or what else the OS said, without its errno)."""
    problem = _PROBLEMS.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()
    return f"cannot read {path}: {problem}"


def os_problem(exc: OSError) -> str:
    """``PATH: not a directory``: an OS error met while a run writes its outputs, as a user
    would say it (``[Errno 20] Not a directory: 'PATH'`` carries the errno and quotes)."""
    problem = (exc.strerror or str(exc)).lower()
    return f"{exc.filename}: {problem}" if exc.filename else problem


def not_a_model(option: str, names: Iterable[str], models: Iterable[str]) -> str:
    """``--strong nope: not a model of the table (models: a, b)``: the option as it was given,
    so that the user knows which name to fix."""
    given = list(names)
    what = "not a model" if len(given) == 1 else "not models"
    return f"{option} {', '.join(given)}: {what} of the table (models: {', '.join(sorted(models))})"
