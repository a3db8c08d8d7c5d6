"""The CLI contract of DESIGN.md: every command answers ``--help`` (its flags described, exit
0) without starting anything, and a user's mistake is one line of error, not a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.gateway.conftest import Upstream, ledger_rows
from tests.support.gateway import ADMIN_KEY, free_port, gateway_config, start_gateway
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


def test_a_spill_dir_that_cannot_be_a_directory_is_one_line_of_error(tmp_path: Path) -> None:
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    (tmp_path / "a-file").write_text("")
    cfg["ledger"]["spill_dir"] = str(tmp_path / "a-file")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli("serve", "--config", str(path), "--port", "0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "ledger.spill_dir" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("policy", ["nonsense", "fixed:no-such-model"])
def test_a_default_policy_that_is_no_policy_is_one_line_of_error(
    tmp_path: Path, policy: str
) -> None:
    # Not served as cascade with a warning: a typo would change what `xrouter` means.
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["router"]["default_policy"] = policy
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli("serve", "--config", str(path), "--port", "0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "router.default_policy" in proc.stderr and "Traceback" not in proc.stderr


def test_a_cascade_order_that_repeats_a_model_is_one_line_of_error(tmp_path: Path) -> None:
    # It started, and every request the cascade policy routed was a 500 (the plan refused
    # the repeat per request).
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["router"]["cascade_order"] = ["gemma-2-9b-it", "gemma-2-9b-it"]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli("serve", "--config", str(path), "--port", str(free_port()), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "router.cascade_order" in proc.stderr and "gemma-2-9b-it" in proc.stderr
    assert "Traceback" not in proc.stderr


def empty_ledger(path: Path) -> str:
    """A ledger with its schema and no rows at ``path``; its URL."""
    from gateway.ledger.store import open_ledger_engine

    url = f"sqlite+aiosqlite:///{path}"

    async def make() -> None:
        await (await open_ledger_engine(url)).dispose()

    asyncio.run(make())
    return url


def test_an_export_that_cannot_be_put_in_place_says_why(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    empty_ledger(tmp_path / "ledger.db")
    proc = run_cli(
        "export", "--ledger", f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}", "--out", "out",
        cwd=tmp_path,
    )  # fmt: skip
    # Refused before the ledger is read: it was read whole, then the line named the output's
    # temporary file (`IsADirectoryError: … '.out.1234.tmp' -> 'out'`).
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "error: --out out is a directory: give the path of a file\n"


@pytest.mark.parametrize(("out", "fmt"), [("x.jsonl", "parquet"), ("x.parquet", "jsonl")])
def test_an_export_whose_format_disagrees_with_its_name_is_refused(
    tmp_path: Path, out: str, fmt: str
) -> None:
    # train and eval read a table by its extension: a Parquet file named .jsonl would be
    # read as broken JSON lines.
    empty_ledger(tmp_path / "ledger.db")
    proc = run_cli(
        "export", "--ledger", f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}", "--out", out,
        "--format", fmt, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and "--format" in proc.stderr, proc.stderr
    assert not (tmp_path / out).exists()


def test_an_export_reads_only_the_configs_ledger_section(tmp_path: Path) -> None:
    """The README's cron recipe (`xrouter export --config gateway.yaml ...`) failed where the
    gateway's secrets are not set: every ${VAR} of the config had to be, a provider's API key
    included, even with --ledger given."""
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["pool"][0]["api_key"] = "${XROUTER_TEST_NEVER_SET_KEY}"
    cfg["ledger"]["url"] = f"sqlite+aiosqlite:///{tmp_path / 'from-config.db'}"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    for db in ("from-config.db", "flag.db"):
        empty_ledger(tmp_path / db)
    proc = run_cli("export", "--config", str(path), "--out", "a.jsonl", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.jsonl").is_file()
    # The ledger section's own references are still expanded, and must be set.
    cfg["ledger"]["url"] = "${XROUTER_TEST_NEVER_SET_URL}"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli("export", "--config", str(path), "--out", "b.jsonl", cwd=tmp_path)
    assert proc.returncode == 2 and "XROUTER_TEST_NEVER_SET_URL" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    # --ledger needs no config at all, broken or not.
    url = f"sqlite+aiosqlite:///{tmp_path / 'flag.db'}"
    proc = run_cli(
        "export", "--config", str(path), "--ledger", url, "--out", "c.jsonl", cwd=tmp_path
    )
    assert proc.returncode == 0 and (tmp_path / "c.jsonl").is_file(), proc.stderr


def test_an_export_from_no_ledger_makes_none(tmp_path: Path) -> None:
    # SQLite takes a missing file, an empty one or a database without tables for a new
    # database: the export made it a ledger (the schema written into it, 112 KiB) and
    # exported nothing, exit 0, from a path with a typo.
    (tmp_path / "empty.db").touch()
    sqlite3.connect(tmp_path / "blank.db").execute("PRAGMA user_version = 1").connection.close()
    (tmp_path / "dir.db").mkdir()
    # Another application's database: the migrations added the ledger's tables beside its own
    # (and the ledger's engine set it to WAL).
    other = sqlite3.connect(tmp_path / "other.db")
    other.execute("CREATE TABLE notes (body TEXT)")
    other.commit()
    other.close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    for name, says in (
        ("none/ledger.db", ""),
        ("empty.db", " (an empty file)"),
        ("blank.db", " (an empty SQLite database)"),
        ("dir.db", " (a directory)"),
        ("other.db", " (it holds no xrouter ledger: no schema_version table)"),
    ):
        db = tmp_path / name
        proc = run_cli(
            "export", "--ledger", f"sqlite+aiosqlite:///{db}", "--out", "x.jsonl", cwd=tmp_path
        )
        assert proc.returncode == 2, (name, proc.stderr)
        assert proc.stderr.strip().splitlines() == [f"error: no ledger database at {db}{says}"]
    assert not (tmp_path / "none").exists() and not (tmp_path / "x.jsonl").exists()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert not list((tmp_path / "dir.db").iterdir())


def test_a_parquet_export_without_pyarrow_says_which_extra_before_reading(
    tmp_path: Path,
) -> None:
    # On the gateway's own install (make serve, the Docker image) it read the ledger and then
    # failed with "ModuleNotFoundError: No module named 'pyarrow'". An interpreter where
    # pyarrow cannot be imported: None in sys.modules makes any import of it fail.
    code = (
        "import sys; sys.modules['pyarrow'] = None; from gateway.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    db = tmp_path / "nowhere.db"
    proc = subprocess.run(
        [sys.executable, "-c", code, "export", "--ledger", f"sqlite+aiosqlite:///{db}",
         "--out", "t.parquet"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    # Said before the ledger is looked at (this one does not exist: that error would follow).
    assert proc.stderr.strip().splitlines() == [
        "error: writing Parquet needs pyarrow, which the gateway's own install leaves out: "
        "pip install 'xrouter[export]' (or write .jsonl)"
    ]
    assert not (tmp_path / "t.parquet").exists()


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_a_long_command_is_one_line_and_exit_130(tmp_path: Path) -> None:
    # Was a full traceback ending in KeyboardInterrupt (main caught only BrokenPipeError).
    out = tmp_path / "eval"
    table = REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "eval", "--table", str(table),
         "--bootstrap", "20000", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        # Ctrl-C as a terminal delivers it: a runner that started the tests in the
        # background (`cmd &` without job control) leaves SIGINT ignored, which the child
        # would inherit, rightly ignoring the signal the test sends.
        preexec_fn=_sigint_default,
    )  # fmt: skip
    try:
        # Interrupted once the CLI has started: numpy is mapped into the process only when
        # the parser imports the training commands' arguments, and on a loaded machine the
        # signal may land then or during the evaluation; either way one line and 130.
        maps = Path(f"/proc/{proc.pid}/maps")
        deadline = time.monotonic() + 60
        while "numpy" not in maps.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, "eval ended before it could be interrupted"
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, "eval ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.rstrip().endswith("interrupted"), stderr
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


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
        proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "k")
        assert proc.returncode == 1, proc.stderr
        assert "did not answer as an xrouter gateway" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
    finally:
        server.shutdown()
        server.server_close()


class _Recorder(BaseHTTPRequestHandler):
    """A loopback server whose answer a test sets (``answer``) and that records the
    Authorization header of every request it gets (``seen``), whatever the method."""

    answer: tuple[int, dict[str, str], bytes] = (200, {}, b"{}")
    seen: list[tuple[str, str | None]]

    def _handle(self) -> None:
        type(self).seen.append((self.command, self.headers.get("Authorization")))
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, headers, body = type(self).answer
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _handle

    def log_message(self, format: str, *args: object) -> None:
        pass


def _recorder(
    status: int, headers: dict[str, str], body: bytes
) -> tuple[ThreadingHTTPServer, type[_Recorder]]:
    handler = type("Handler", (_Recorder,), {"answer": (status, headers, body), "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, handler


def _close(*servers: ThreadingHTTPServer) -> None:
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_deploy_does_not_follow_a_redirect_nor_send_the_admin_key_on(status: int) -> None:
    # The admin key went to whatever host a redirect named (as a GET, after a 301/302), and
    # the deploy was reported done.
    target, seen_by_target = _recorder(200, {"Content-Type": "application/json"}, b"{}")
    elsewhere = f"http://127.0.0.1:{target.server_address[1]}/admin/reload"
    gateway, seen_by_gateway = _recorder(status, {"Location": elsewhere}, b"moved")
    try:
        url = f"http://127.0.0.1:{gateway.server_address[1]}"
        proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "SECRET")
    finally:
        _close(gateway, target)
    assert proc.returncode == 1, proc.stderr
    assert seen_by_gateway.seen == [("POST", "Bearer SECRET")]
    assert seen_by_target.seen == []
    assert "redirected" in proc.stderr and elsewhere in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_deploy_strips_the_admin_key_and_never_shows_one_no_header_can_carry() -> None:
    # A key from `$(cat key)` or a Kubernetes secret ends with a newline: http.client refused
    # the header with a ValueError quoting it, logged as "did not answer as an xrouter
    # gateway: Invalid header value b'Bearer SECRET\\n'".
    gateway, seen = _recorder(200, {"Content-Type": "application/json"}, b"{}")
    try:
        url = f"http://127.0.0.1:{gateway.server_address[1]}"
        proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "SECRET\n")
        assert proc.returncode == 0, proc.stderr
        assert seen.seen == [("POST", "Bearer SECRET")]
        for bad in ("SEC\nRET", "SEC\x01RET", "SECRET\u2019"):
            proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", bad)
            assert proc.returncode == 2, (bad, proc.stderr)
            assert "SEC" not in proc.stderr and "cannot carry" in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr, proc.stderr
        assert len(seen.seen) == 1
    finally:
        _close(gateway)


def test_deploy_sends_a_path_that_is_only_on_the_gateways_machine() -> None:
    # A checkpoint on the volume a remote gateway mounts was refused here ("no such
    # checkpoint") without the gateway being asked, which checks the path itself.
    gateway, seen = _recorder(200, {"Content-Type": "application/json"}, b'{"pool": []}')
    try:
        url = f"http://127.0.0.1:{gateway.server_address[1]}"
        proc = run_cli("deploy", "/srv/checkpoints/run-7", "--url", url, "--admin-key", "k")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["deployed"] == "/srv/checkpoints/run-7" and out["checkpoint_pool"] is None
        assert seen.seen == [("POST", "Bearer k")]
        # A relative path means nothing on another machine: refused, nothing sent.
        proc = run_cli("deploy", "runs/nope", "--url", url, "--admin-key", "k")
        assert proc.returncode == 2 and "absolute path there" in proc.stderr, proc.stderr
        assert len(seen.seen) == 1
    finally:
        _close(gateway)


def test_deploy_refuses_a_url_with_a_user_and_never_shows_its_password() -> None:
    gateway, seen = _recorder(500, {}, b"boom")
    port = gateway.server_address[1]
    try:
        for url in (
            f"http://admin:SECRETPW@127.0.0.1:{port}",  # urllib takes it for a bad port
            "http://admin:SECRETPW@127.0.0.1:9",  # nothing listens there
            "http://admin:SECRETPW@[::1",  # malformed
            f"http://admin:SECRET%50W@127.0.0.1:{port}",  # percent-encoded
        ):
            proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "k")
            # Refused before any request (the admin key is the credential; urllib took the
            # user and password for part of the host name).
            assert proc.returncode == 2, (url, proc.stderr)
            assert "SECRET" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
            assert "admin:***@" in proc.stderr and "names a user" in proc.stderr, proc.stderr
        assert seen.seen == []
    finally:
        _close(gateway)


def test_deploy_refuses_a_url_it_cannot_send_to_before_sending_anything() -> None:
    # "127.0.0.1:PORT" (no scheme) exited 1, "cannot reach the gateway … unknown url type",
    # though nothing was sent: 2 is the status of a deploy refused before anything was sent.
    gateway, seen = _recorder(200, {"Content-Type": "application/json"}, b"{}")
    where = f"127.0.0.1:{gateway.server_address[1]}"
    try:
        for url, says in (
            (where, f"has no scheme: give the gateway's URL as http://{where}"),
            (f"localhost:{gateway.server_address[1]}", "has no scheme"),
            (f"ftp://{where}", "starts with http:// or https://"),
            ("http://", "names no host"),
            ("http://127.0.0.1:99999", "is not a URL: Port out of range"),
            ("http://[::1", "is not a URL: Invalid IPv6 URL"),  # was exit 1
            ("http://127.0.0.1:0", "names port 0"),
            (f"http://{where}?x=1", "has a query or fragment"),
            (f"http://{where}\n", "holds a space or a control character"),
        ):
            proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "k")
            assert proc.returncode == 2, (url, proc.stderr)
            [line] = proc.stderr.strip().splitlines()
            assert says in line and "--url" in line, (url, line)
        assert seen.seen == []
        proc = run_cli("deploy", "packaged:demo", "--url", f"HTTP://{where}/", "--admin-key", "k")
        assert proc.returncode == 0 and len(seen.seen) == 1, proc.stderr
    finally:
        _close(gateway)


@pytest.mark.parametrize("status", [404, 405, 501])
def test_deploy_to_a_url_without_the_admin_api_says_what_url_to_give(status: int) -> None:
    # Reported as "the gateway refused the checkpoint (404): <the whole HTML page>".
    page = (
        b"<html>\n<head><title>Not Found</title></head>\n<body>"
        + b"x" * 5000
        + b"</body>\n</html>\n"
    )
    gateway, _ = _recorder(status, {"Content-Type": "text/html"}, page)
    try:
        url = f"http://127.0.0.1:{gateway.server_address[1]}/v1"
        proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "k")
    finally:
        _close(gateway)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "does not serve POST /admin/reload" in lines[0] and "without /v1" in lines[0]
    assert "refused the checkpoint" not in lines[0] and "xxxx" not in lines[0]


def test_deploy_quotes_a_refusal_s_body_as_one_line_cut_if_not_the_gateway_s_error() -> None:
    # An answer that is not the gateway's JSON error (a proxy's HTML page) is cut, generously;
    # the gateway's own reason never is (test_deploy: a refused deploy's whole reason).
    page = b"<html>\n<body>\n" + b"y" * 5000 + b"\n</body>\n</html>\n"
    gateway, _ = _recorder(400, {"Content-Type": "text/html"}, page)
    try:
        url = f"http://127.0.0.1:{gateway.server_address[1]}"
        proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "k")
    finally:
        _close(gateway)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused the checkpoint (400): <html> <body> yyy" in lines[0]
    assert "y" * 900 in lines[0] and lines[0].endswith("y...") and len(lines[0]) < 1200, lines


def test_deploy_takes_only_the_gateway_s_deployment_superseded_for_a_lost_race() -> None:
    # Exit 3 says "another deploy won"; a 409 from anything else (a proxy, another server
    # at that URL) says nothing of the kind: it is a refusal like any other, exit 1.
    body = b'{"error": {"message": "busy", "type": "x", "param": null, "code": "conflict"}}'
    gateway, _ = _recorder(409, {"Content-Type": "application/json"}, body)
    try:
        url = f"http://127.0.0.1:{gateway.server_address[1]}"
        proc = run_cli("deploy", "packaged:demo", "--url", url, "--admin-key", "k")
    finally:
        _close(gateway)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "refused the checkpoint (409): conflict: busy" in line, line


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_log_level_error_silences_xrouter_s_own_info_lines(
    tmp_path: Path, workers: int
) -> None:
    # --log-level reached uvicorn only: the ledger, runtime and listening lines still came.
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(gateway_config(tmp_path, "http://127.0.0.1:9/v1")))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--port",
         str(port), "--workers", str(workers), "--log-level", "error"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        ready = False
        while not ready and proc.poll() is None and time.monotonic() < deadline:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).is_success
            except httpx.HTTPError:
                time.sleep(0.1)
        assert ready, "the gateway did not become ready"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    # xrouter's lines (" INFO ") and uvicorn's ("INFO:"), the supervisor's and the workers'.
    assert " INFO " not in output and "INFO:" not in output, output


def test_serve_at_its_default_level_does_not_log_every_sql_statement(tmp_path: Path) -> None:
    # Keeping SQLAlchemy's engine "at INFO" under --log-level debug lowered it from its own
    # WARNING to INFO at every level, which is where it echoes each statement: a ledger
    # flush or a key lookup was 3 to 5 lines of SQL in the log.
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1", auth={"enabled": True})
    gw = start_gateway(tmp_path, cfg)
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        for n in range(4):  # a key made, looked up, and its requests' rows flushed
            key = httpx.post(f"{gw.url}/admin/keys", headers=admin, json={"alias": f"a{n}"})
            headers = {"Authorization": f"Bearer {key.json()['key']}"}
            body = {
                "model": "llama-3.2-3b-instruct",
                "messages": [{"role": "user", "content": "hi"}],
            }
            httpx.post(f"{gw.base_url}/chat/completions", headers=headers, json=body, timeout=30)
        time.sleep(0.5)  # past the flush interval (20 ms)
    finally:
        gw.stop()
    log = gw.log()
    assert "ledger ready at" in log, log  # the workers' own INFO lines are there
    assert "sqlalchemy.engine" not in log, log[-3000:]


def test_serve_says_it_listens_only_once_it_does(tmp_path: Path) -> None:
    # "xrouter listening on" came before uvicorn bound the port: a port in use read as
    # listening, then failed. Now xrouter says it is starting; uvicorn says "running on"
    # once it has bound.
    gw = start_gateway(tmp_path, gateway_config(tmp_path, "http://127.0.0.1:9/v1"))
    try:
        log = gw.log()
    finally:
        gw.stop()
    assert "xrouter listening" not in log, log
    port = gw.url.rsplit(":", 1)[1]
    starting = log.index(f"xrouter starting on http://127.0.0.1:{port} (1 worker)")
    assert log.index(f"Uvicorn running on http://127.0.0.1:{port}") > starting, log


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_in_use_is_one_line_and_leaves_nothing_behind(tmp_path: Path, workers: int) -> None:
    # Was: "xrouter listening on ...", the ledger and spill directory made, the app started,
    # then uvicorn's bind error and exit 3.
    work = tmp_path / "work"
    work.mkdir()
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    del cfg["ledger"]  # the defaults: ./xrouter.db and ./xrouter-spill
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli(
            "serve", "--config", str(path), "--port", str(port), "--workers", str(workers),
            cwd=work,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and f"port {port} on 127.0.0.1 is in use" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "listening" not in proc.stderr, proc.stderr
    assert not list(work.iterdir())


def _unpriced(cfg: dict[str, Any], tmp_path: Path) -> None:
    cfg["pool"].append(
        {"name": "unpriced", "model": "openai/no-such-priced-model", "api_base": "http://x/v1"}
    )


def _missing_checkpoint(cfg: dict[str, Any], tmp_path: Path) -> None:
    cfg["router"]["checkpoint"] = str(tmp_path / "no-such-checkpoint")


@pytest.mark.parametrize(
    ("break_config", "says"), [(_unpriced, "has no price"), (_missing_checkpoint, "no such")]
)
def test_a_start_that_fails_leaves_nothing_it_made_behind(
    tmp_path: Path, break_config: Any, says: str
) -> None:
    # A config refused at startup left ./xrouter.db (a new ledger) and ./xrouter-spill in
    # the working directory; what was there before stays.
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    break_config(cfg, tmp_path)
    work = tmp_path / "work"
    for ledger in (
        {},  # the defaults, in the working directory
        {"url": f"sqlite+aiosqlite:///{work}/a/b/ledger.db", "spill_dir": f"{work}/c/d"},
        {"url": f"sqlite+aiosqlite:///{work}/kept/ledger.db", "spill_dir": f"{work}/kept/s"},
    ):
        work.mkdir()
        (work / "kept").mkdir()
        cfg["ledger"] = ledger
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = run_cli("serve", "--config", str(path), "--port", "0", cwd=work)
        assert proc.returncode == 2 and "cannot start" in proc.stderr, proc.stderr
        assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert [p.name for p in work.rglob("*")] == ["kept"], ledger
        shutil.rmtree(work)


def test_a_spill_dir_that_cannot_be_made_leaves_no_new_ledger(tmp_path: Path) -> None:
    # The ledger was made (and migrated) before the spill directory was tried.
    work = tmp_path / "work"
    work.mkdir()
    (work / "a-file").write_text("")
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["ledger"] = {
        "url": f"sqlite+aiosqlite:///{work}/new/ledger.db",
        "spill_dir": str(work / "a-file" / "spill"),
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli("serve", "--config", str(path), "--port", "0", cwd=work)
    assert proc.returncode == 2 and "ledger.spill_dir" in proc.stderr, proc.stderr
    assert [p.name for p in work.rglob("*")] == ["a-file"]


def test_a_new_ledger_that_cannot_be_made_takes_the_spill_dir_made_for_it_away(
    tmp_path: Path,
) -> None:
    # A new SQLite ledger is made last, after the spill directory: when it fails, the
    # directories this start made go too (those that were there stay).
    work = tmp_path / "work"
    (work / "kept").mkdir(parents=True)
    (work / "a-file").write_text("")
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["ledger"] = {
        "url": f"sqlite+aiosqlite:///{work}/a-file/ledger.db",
        "spill_dir": str(work / "kept" / "new" / "spill"),
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = run_cli("serve", "--config", str(path), "--port", "0", cwd=work)
    assert proc.returncode == 2 and "is not usable" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in work.rglob("*")) == ["a-file", "kept"]


# -- xrouter serve with several workers ---------------------------------------------------


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_workers_log_as_the_supervisor_does(upstream: Upstream, tmp_path: Path) -> None:
    # Workers are spawned interpreters: without logging of their own, their info lines
    # (a reload, a deployment followed, the ledger opened) went nowhere and their errors
    # came out bare, without time, level or logger.
    # Each worker's lines name it by its pid, the supervisor's none.
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url), workers=2)
    ready = r"INFO (\[\d+\] )?gateway\.ledger\.store: ledger ready at"
    try:
        deadline = time.monotonic() + 10
        while len(re.findall(ready, gw.log())) < 3:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        workers = [pid for pid in re.findall(ready, gw.log()) if pid]
        assert len(set(workers)) == 2 and len(workers) == 2, gw.log()
    finally:
        gw.stop()


@pytest.mark.parametrize("workers", [2, 1])
def test_several_workers_start_from_clean_metrics_and_leave_none_behind(
    upstream: Upstream, tmp_path: Path, workers: int
) -> None:
    """prometheus_client's multiprocess directory must be emptied between runs: an
    operator's (PROMETHEUS_MULTIPROC_DIR) is emptied at start — a previous run's counts were
    added to this one's, also with one worker, which the variable puts in multiprocess mode
    too — and the one `serve` makes itself is removed when it stops."""
    # An operator's directory, with a previous run's requests counted in it.
    given = tmp_path / "prom"
    given.mkdir()
    stale = tmp_path / "first"
    gw = start_gateway(
        stale,
        gateway_config(stale, upstream.base_url),
        workers=workers,
        env={"PROMETHEUS_MULTIPROC_DIR": str(given)},
    )
    body = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):
        assert httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30).is_success
    gw.stop()
    assert list(given.glob("*.db"))  # what the first run left
    again = tmp_path / "second"
    gw = start_gateway(
        again,
        gateway_config(again, upstream.base_url),
        workers=workers,
        env={"PROMETHEUS_MULTIPROC_DIR": str(given)},
    )
    try:
        text = httpx.get(f"{gw.url}/metrics", timeout=10).text
        assert "xrouter_requests_total{" not in text or all(
            float(line.rsplit(" ", 1)[1]) == 0
            for line in text.splitlines()
            if line.startswith("xrouter_requests_total{")
        ), "the first run's requests were counted again"
    finally:
        gw.stop()
    if workers == 1:
        return  # one worker without the variable keeps its metrics in memory
    # Without one, `serve` makes its own and removes it when it stops.
    before = set(Path(tempfile.gettempdir()).glob("xrouter-prom-*"))
    own = tmp_path / "third"
    gw = start_gateway(own, gateway_config(own, upstream.base_url), workers=2)
    made = set(Path(tempfile.gettempdir()).glob("xrouter-prom-*")) - before
    assert made, "no metrics directory while serving with two workers"
    gw.stop()
    assert not any(d.exists() for d in made)


def test_workers_do_not_outlive_a_killed_supervisor(upstream: Upstream, tmp_path: Path) -> None:
    # SIGKILL of the supervisor (an OOM kill, a container runtime's last resort) must not
    # leave orphaned workers holding the port, which the next start could not bind.
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url), workers=2)
    try:
        workers = _children(gw.proc.pid)
        assert len(workers) >= 2, workers  # the two workers (and a resource tracker)
        r = httpx.post(
            f"{gw.base_url}/chat/completions",
            json={"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert r.status_code == 200
        os.kill(gw.proc.pid, signal.SIGKILL)
        gw.proc.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in workers):
            assert time.monotonic() < deadline, f"orphaned workers still alive:\n{gw.log()}"
            time.sleep(0.2)
        # They went down gracefully: the ledger has the answered request.
        assert gw.log().count("Application shutdown complete") >= 2, gw.log()
        ledger_rows(gw, r.headers["x-xrouter-request-id"])
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{gw.url}/healthz", timeout=2)
    finally:
        try:
            os.killpg(gw.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_workers_still_starting_do_not_outlive_a_killed_supervisor(
    upstream: Upstream, tmp_path: Path
) -> None:
    # A worker spends seconds importing before it builds its app. Killed in that time, the
    # supervisor had already handed its workers to init when they first looked at their
    # parent: they watched init's pid for good, and asked for a parent-death signal too
    # late. (Killed before a worker serves, as when the one above is killed while its
    # second worker is still starting.)
    gw = start_gateway(
        tmp_path, gateway_config(tmp_path, upstream.base_url), workers=2, wait_ready=False
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            children = _children(gw.proc.pid)
            spawned = [p for p in children if b"spawn_main" in _cmdline(p)]
            if len(spawned) >= 2:
                break
            assert gw.proc.poll() is None, gw.log()
            assert time.monotonic() < deadline, f"no two workers spawned:\n{gw.log()}"
            time.sleep(0.02)
        # Not at once: the supervisor writes each worker its start-up data just after it
        # exists (killed before, a worker just fails to unpickle it). Whatever this pause,
        # the test passes; it only keeps it about workers still importing.
        time.sleep(0.3)
        os.kill(gw.proc.pid, signal.SIGKILL)
        gw.proc.wait()
        # They finish starting (their imports, under load, are what takes long), then see
        # the supervisor gone and shut down.
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in children):
            assert time.monotonic() < deadline, f"orphaned workers still alive:\n{gw.log()}"
            time.sleep(0.2)
    finally:
        try:
            os.killpg(gw.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_several_workers_refuse_new_connections_once_their_shutdown_begins(
    upstream: Upstream, tmp_path: Path
) -> None:
    # The workers closed their listening sockets on SIGTERM, but the supervisor's copy
    # stayed open until they had exited: the kernel went on accepting connections no worker
    # would read, and reset them when the supervisor exited — requests lost with no answer
    # and no ledger row, where one worker refuses them at once.
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url), workers=2)
    try:
        got: list[httpx.Response] = []
        slow = {
            "model": "gemma-2-9b-it",
            "messages": [{"role": "user", "content": "hi [[replay:latency=4000]]"}],
        }
        waiting = threading.Thread(
            target=lambda: got.append(
                httpx.post(f"{gw.base_url}/chat/completions", json=slow, timeout=60)
            )
        )
        waiting.start()
        deadline = time.monotonic() + 30
        while upstream.stats()["requests"].get("gemma-2-9b-it", 0) < 1:
            assert time.monotonic() < deadline, upstream.stats()
            time.sleep(0.05)
        gw.proc.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # the supervisor checks for signals every 0.5 s, then tells the workers
        assert gw.proc.poll() is None  # still finishing the slow request
        t0 = time.monotonic()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{gw.url}/healthz", timeout=10)
        assert time.monotonic() - t0 < 1.0  # refused, not held and reset later
        waiting.join(60)
        assert got and got[0].status_code == 200, got
        gw.proc.wait(30)
    finally:
        try:
            os.killpg(gw.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_requests_cut_by_the_graceful_shutdown_timeout_get_an_error_not_a_traceback(
    upstream: Upstream, tmp_path: Path
) -> None:
    # A request still waiting on its upstream when uvicorn's graceful shutdown gives up (30 s)
    # is cancelled: it must be answered as every error is (a 503 an SDK retries elsewhere,
    # in its API's own shape, with its request id), not with uvicorn's bare text 500 and a
    # traceback, and its ledger row still lands, saying what the client got.
    cfg = gateway_config(tmp_path, upstream.base_url)
    for m in cfg["pool"]:
        m["timeout_s"] = 120
    gw = start_gateway(tmp_path, cfg)
    try:
        upstream.fault("gemma-2-9b-it", "timeout=100", count=2)
        got: dict[str, httpx.Response] = {}
        message = [{"role": "user", "content": "hi"}]
        sent = {
            "chat/completions": {"model": "gemma-2-9b-it", "messages": message},
            "messages": {"model": "gemma-2-9b-it", "max_tokens": 10, "messages": message},
        }
        waiting = [
            threading.Thread(
                target=lambda p=path, b=body: got.setdefault(
                    p, httpx.post(f"{gw.base_url}/{p}", json=b, timeout=90)
                )
            )
            for path, body in sent.items()
        ]
        for t in waiting:
            t.start()
        # Both are with the upstream (it counts a request as it arrives) before the signal:
        # one not yet accepted would be refused, not cut.
        deadline = time.monotonic() + 30
        while upstream.stats()["requests"].get("gemma-2-9b-it", 0) < 2:
            assert time.monotonic() < deadline, upstream.stats()
            time.sleep(0.05)
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.wait(60)
        for t in waiting:
            t.join(30)
        chat, anthropic = got["chat/completions"], got["messages"]
        assert chat.status_code == anthropic.status_code == 503, (chat.text, anthropic.text)
        assert chat.json()["error"]["code"] == "shutting_down"
        assert anthropic.json()["type"] == "error" and anthropic.headers["request-id"]
        assert "Traceback" not in gw.log(), gw.log()
        with sqlite3.connect(tmp_path / "ledger.db") as db:
            rows = dict(db.execute("SELECT request_id, status || ' ' || error_type FROM requests"))
        # The rows say what the clients got, under the ids their answers carry.
        assert rows == {
            chat.headers["x-request-id"]: "503 shutting_down",
            anthropic.headers["request-id"]: "503 shutting_down",
        }
    finally:
        gw.stop()


def test_several_workers_follow_a_config_mounted_as_kubernetes_mounts_a_configmap(
    upstream: Upstream, tmp_path: Path
) -> None:
    """A ConfigMap's file is a symlink through ``..data`` into a dated directory, which an
    update replaces (and deletes): the workers must keep the path they were given, or the
    change, a reload and a worker restarted after a crash would all look for a file that is
    gone."""
    mount = tmp_path / "cm"
    mount.mkdir()

    def publish(stamp: str, cfg: dict[str, Any]) -> None:
        (mount / stamp).mkdir()
        (mount / stamp / "config.yaml").write_text(yaml.safe_dump(cfg))
        (mount / "..data_tmp").symlink_to(stamp)
        os.replace(mount / "..data_tmp", mount / "..data")  # atomic, as the kubelet swaps it

    cfg = gateway_config(tmp_path, upstream.base_url)
    cfg["router"] = {**cfg["router"], "watch_files": True, "default_policy": "cascade"}
    cfg["auth"] = {**cfg["auth"], "admin_key": ADMIN_KEY}
    publish("..2026_01_01_a", cfg)
    (mount / "config.yaml").symlink_to("..data/config.yaml")
    gw = start_gateway(tmp_path, cfg, workers=2, config_path=mount / "config.yaml")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        # Both workers up (each read the first config; a change while the second was still
        # starting is seen by its watcher as well, but would make this test's count moot).
        deadline = time.monotonic() + 30
        while gw.log().count("Application startup complete") < 2:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        cfg["router"] = {**cfg["router"], "default_policy": "cheapest"}
        publish("..2026_01_01_b", cfg)
        shutil.rmtree(mount / "..2026_01_01_a")
        # Each worker's watcher reloads it (the kernel may hand every request to one worker,
        # so the workers' own log lines say it, not their answers).
        deadline = time.monotonic() + 30
        while gw.log().count("reloaded: pool=") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert gw.log().count("reloaded: pool=") == 2, gw.log()
        # Each line names its worker: they were the same line twice.
        pids = set(re.findall(r" INFO \[(\d+)\] gateway\.reload: reloaded: pool=", gw.log()))
        assert len(pids) == 2, gw.log()
        r = httpx.get(f"{gw.url}/admin/router", headers=admin, timeout=10).json()
        assert r["default_policy"] == "cheapest"
        r = httpx.post(f"{gw.url}/admin/reload", headers=admin, timeout=30)
        assert r.status_code == 200, r.text
        assert "config file not found" not in gw.log()
    finally:
        gw.stop()
