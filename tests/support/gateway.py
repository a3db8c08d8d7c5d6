"""Start the gateway as a real ``xrouter serve`` subprocess on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.replay import REPO_ROOT

DEMO_MODELS = [
    "llama-3.2-3b-instruct",
    "gemma-2-9b-it",
    "mistral-small-24b-instruct-2501-bf16",
    "qwen2.5-7b-instruct",
    "llama-3.1-8b-instruct",
    "mixtral-8x7b-instruct-v0.1",
    "llama-3.3-70b-instruct",
    "mixtral-8x22b-instruct-v0.1",
]
ADMIN_KEY = "admin-test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_config(tmp_path: Path, replay_base: str, **sections: Any) -> dict[str, Any]:
    """A config with the demo pool on the replay upstream, a SQLite ledger in tmp_path and
    auth off; ``sections`` override top-level sections (deep-merged one level)."""
    cfg: dict[str, Any] = {
        "auth": {"enabled": False, "admin_key": ADMIN_KEY},
        "ledger": {
            "url": f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}",
            "spill_dir": str(tmp_path / "spill"),
            "flush_interval_ms": 20,
        },
        # Module-scoped gateways share one process across tests that inject failures on
        # purpose; its circuit breakers would carry one test's failures into the next. The
        # breaker's own tests turn it on.
        "router": {"watch_files": False, "circuit_breaker": {"failures": 0}},
        "pool": [
            {
                "name": m,
                "model": f"openai/{m}",
                "api_base": replay_base,
                "timeout_s": 5,
                "max_retries": 1,
            }
            for m in DEMO_MODELS
        ],
    }
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    return cfg


@dataclass
class Gateway:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    config_path: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_gateway(
    tmp_path: Path,
    config: dict[str, Any],
    *,
    workers: int = 1,
    env: dict[str, str] | None = None,
    name: str = "gateway",
    wait_ready: bool = True,
    config_path: Path | None = None,
) -> Gateway:
    """Start ``xrouter serve``; unless ``wait_ready`` is False, return once it answers
    /readyz (with several workers: once one of them does). ``config_path``: serve the
    config file the caller laid out there (``config`` is then not written)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg_path = config_path or tmp_path / f"{name}.yaml"
    if config_path is None:
        cfg_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = tmp_path / f"{name}.log"
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--config",
        str(cfg_path),
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=tmp_path,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    gw = Gateway(proc, f"http://127.0.0.1:{port}", log_path, cfg_path)
    if not wait_ready:
        return gw
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n{gw.log()}")
        try:
            if httpx.get(f"{gw.url}/readyz", timeout=1).status_code == 200:
                return gw
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    gw.stop(signal.SIGKILL)
    raise RuntimeError(f"gateway did not become ready:\n{gw.log()}")
