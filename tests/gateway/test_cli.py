"""The CLI contract of DESIGN.md: every command answers ``--help`` (its flags described, exit
0) without starting anything, and a user's mistake is one line of error, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

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


def run_cli(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_a_config_that_is_not_a_file_is_one_line_of_error(tmp_path: Path) -> None:
    binary = tmp_path / "cfg.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for args, says in (
        (("serve", "--config", str(tmp_path)), "is a directory"),
        (("serve", "--config", str(binary)), "not UTF-8"),
        (("export", "--config", str(tmp_path / "none.yaml"), "--out", "x"), "not found"),
    ):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert says in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)


def test_an_export_that_cannot_be_put_in_place_says_why(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "ledger.db").touch()
    proc = run_cli(
        "export", "--ledger", f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}", "--out", "out",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "Is a directory" in proc.stderr, proc.stderr
    assert "closed file" not in proc.stderr and "Traceback" not in proc.stderr


class _NotAGateway(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = b"<html>hello</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_deploy_to_something_that_is_not_a_gateway_fails_cleanly() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotAGateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for bad_url, says in ((url, "did not answer as an xrouter gateway"), ("http://[::1", "")):
            proc = run_cli("deploy", "packaged:demo", "--url", bad_url, "--admin-key", "k")
            assert proc.returncode == 1, (bad_url, proc.stderr)
            assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    finally:
        server.shutdown()
        server.server_close()
