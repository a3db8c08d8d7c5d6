"""Whether files can be made in a directory, asked the only way that is true for root.

Commands check their output paths before they start work (an export before it reads the
ledger, the replay upstream before it listens), so a path they could not write is one line
at once rather than an error after the work, naming a temporary file the user never gave.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def cannot_make_files_in(directory: Path) -> str | None:
    """Why no file can be made in ``directory``, or None if one can.

    A file is made and dropped (unnamed, ``O_TMPFILE`` where the OS allows it):
    ``os.access()`` says yes to root where no file can be made (sysfs), and this fails for
    a missing directory, or a path that is not a directory, too."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
