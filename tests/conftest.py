"""Fixtures shared by every test package."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.port_file_server import start


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
    return start("tests.support.scripted_router", tmp / "scripted.port")


@pytest.fixture(scope="session")
def scripted_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedRouter]:
    proc, root = start_scripted_router(tmp_path_factory.mktemp("scripted"))
    with httpx.Client(base_url=root, timeout=10) as ctl:
        yield ScriptedRouter(f"{root}/v1", ctl)
    proc.terminate()
    proc.wait(5)
