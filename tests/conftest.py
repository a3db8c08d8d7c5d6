"""Fixtures shared by every test package."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.replay import REPO_ROOT


@dataclass
class ScriptedRouter:
    base_url: str
    control: httpx.Client

    def script(self, *turns: dict[str, Any], usage: dict[str, int] | bool | None = None) -> None:
        self.control.post(
            "/_script", json={"turns": list(turns), "usage": usage}
        ).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        return self.control.get("/_requests").json()


def start_scripted_router(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "scripted.port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.scripted_router", "--port-file", str(port_file)],
        cwd=REPO_ROOT,
    )
    deadline = time.monotonic() + 20
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("scripted router did not start")
        time.sleep(0.02)
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


@pytest.fixture(scope="session")
def scripted_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedRouter]:
    proc, root = start_scripted_router(tmp_path_factory.mktemp("scripted"))
    with httpx.Client(base_url=root, timeout=10) as ctl:
        yield ScriptedRouter(f"{root}/v1", ctl)
    proc.terminate()
    proc.wait(5)
