"""Test servers in their own process on a free loopback port: the child binds port 0 and
writes the port it got to a file (atomically), the parent waits for the file. Used by the
scripted upstreams (``tests.support.scripted_router``, ``tests.support.scripted_upstream``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from tests.support.replay import REPO_ROOT


def serve(create_app: Callable[[], web.Application]) -> None:
    """The child's main: serve ``create_app()`` until terminated (``--port-file`` says where
    to write the port)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port-file", required=True)
    asyncio.run(_serve(create_app(), ap.parse_args().port_file))


async def _serve(app: web.Application, port_file: str) -> None:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await asyncio.to_thread(_announce, port_file, port)
    await asyncio.Event().wait()


def _announce(port_file: str, port: int) -> None:
    tmp = Path(port_file + ".tmp")
    tmp.write_text(str(port))
    os.replace(tmp, port_file)


def start(module: str, port_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m module`` and wait for its port: the process and its root URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port-file", str(port_file)], cwd=REPO_ROOT
    )
    deadline = time.monotonic() + 20
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{module} did not start")
        time.sleep(0.02)
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"
