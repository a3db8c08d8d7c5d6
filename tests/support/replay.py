"""Start the replay upstream as a real subprocess on loopback (for replay and gateway tests).

    proc, base_url = start_replay_upstream(tmp_path, "--latency-ms", "5")
    client = openai.OpenAI(base_url=base_url, api_key="unused")
    ...
    stop_replay_upstream(proc)

``base_url`` is ``http://127.0.0.1:<port>/v1`` (what OpenAI clients and pool configs take);
``replay_root(base_url)`` is the server root, where ``/health`` and ``/_replay/*`` live.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 20.0


def start_replay_upstream(tmp_path: Path, *extra_args: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``python -m gateway.replay --port 0`` and wait until it listens.

    ``extra_args`` go to the CLI (``--table``, ``--api-key``, ``--latency-ms``, ...). The
    server's log is ``tmp_path/replay-<n>.log``; it is included in the error if startup fails."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    n = sum(1 for _ in tmp_path.glob("replay-*.log"))
    port_file = tmp_path / f"replay-{n}.port"
    log_path = tmp_path / f"replay-{n}.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "gateway.replay", "--host", "127.0.0.1", "--port", "0",
           "--port-file", str(port_file), *extra_args]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_replay_upstream(proc)
            raise RuntimeError(
                f"replay upstream did not start (exit {proc.returncode}):\n"
                + log_path.read_text(errors="replace")
            )
        time.sleep(0.02)
    port = int(port_file.read_text().strip())
    return proc, f"http://127.0.0.1:{port}/v1"


def stop_replay_upstream(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM (graceful), then SIGKILL if it does not exit in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def replay_root(base_url: str) -> str:
    """``http://127.0.0.1:<port>`` from ``http://127.0.0.1:<port>/v1``."""
    return base_url.removesuffix("/").removesuffix("/v1")
