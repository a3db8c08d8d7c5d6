"""The CLI contract of DESIGN.md: every command answers ``--help`` (its flags described, exit
0) without starting anything."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.replay import REPO_ROOT

COMMANDS = [
    "serve", "replay-upstream", "train", "eval", "export", "convert", "deploy",
    "checkpoints", "verl-data",
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_help(command: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: xrouter {command}")
    assert "Traceback" not in proc.stderr
