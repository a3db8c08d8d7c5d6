"""Paths a test needs that the machine decides: a directory no file can be made in."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def unwritable_dir(tmp_path: Path) -> Path:
    """A directory in which no file can be made, whoever runs the tests."""
    if os.geteuid() != 0:
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        read_only.chmod(0o555)
        return read_only
    # Root writes in a 0o555 directory; in sysfs's root nobody may create a file.
    if not Path("/sys/kernel").is_dir():
        pytest.skip("run as root, and no sysfs at /sys")
    return Path("/sys")
