"""Starting ``xrouter serve`` for a bench script and waiting until it is ready, as every
script that measures a running gateway does. Imported by the scripts beside it (``python
bench/<script>.py`` puts this directory on ``sys.path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    """Poll ``url`` until it answers 200. Exits (SystemExit) with ``log``, the server's
    output, if ``proc`` exits first; stops it and exits if it is not ready in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"exited:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    # Not left running behind the script that gave up on it.
    proc.terminate()
    proc.wait(10)
    raise SystemExit(f"not ready: {url}")


def start_gateway(
    workdir: Path,
    port: int,
    *,
    args: Sequence[str] = (),
    tree: Path = REPO,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``xrouter serve --port PORT ARGS`` (without ``--config`` in ``args``: the embedded
    demo) imported from ``tree`` and run in ``workdir``, with ``env`` added to this
    process's environment; its output goes to ``workdir/gateway-PORT.log``. Returns once
    ``/readyz`` answers 200: stop it with ``terminate()``."""
    log = workdir / f"gateway-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), *args],
            cwd=workdir,
            env={**os.environ, **(env or {}), "PYTHONPATH": str(tree)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_for(f"http://127.0.0.1:{port}/readyz", proc, log)
    return proc
