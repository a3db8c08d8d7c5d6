"""The CLI options, end to end: a custom table, an API key, global latency, per-chunk delay,
startup failures, the ready-fd handshake of ``serve()`` and a clean SIGTERM shutdown."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import orjson
import pytest

from gateway.replay.server import serve
from tests.support.paths import unwritable_dir
from tests.support.replay import REPO_ROOT, replay_root, start_replay_upstream, stop_replay_upstream

API_KEY = "replay-test-key"
LATENCY_MS = 120
CHUNK_DELAY_MS = 80
RECORDS: list[dict[str, Any]] = [
    {
        "id": "chat-1",
        "messages": [
            {"role": "system", "content": "be terse"},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "outcomes": {
            "small": {
                "score": 1,
                "response": "Paris.",
                "prompt_tokens": 17,
                "completion_tokens": 2,
            },
            "large": {
                "score": 1,
                "response": "The capital of France is Paris, on the Seine, in the north of the country.",
                "prompt_tokens": 19,
                "completion_tokens": 18,
            },
        },
    },
    {"id": "p-2", "prompt": "2+2?", "outcomes": {"small": {"score": 0, "response": "5"}}},
]


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("replay-cli")
    table = tmp / "table.jsonl"
    table.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in RECORDS))
    proc, base_url = start_replay_upstream(
        tmp,
        "--table", str(table),
        "--api-key", API_KEY,
        "--latency-ms", str(LATENCY_MS),
        "--stream-chunk-delay-ms", str(CHUNK_DELAY_MS),
        "--log-level", "warning",
    )  # fmt: skip
    yield base_url
    stop_replay_upstream(proc)
    assert proc.returncode == 0


def _client(base_url: str, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=10)


def test_custom_table_with_global_latency(configured: str) -> None:
    with _client(configured) as client:
        assert sorted(m.id for m in client.models.list()) == ["large", "small"]
        started = time.monotonic()
        resp = client.chat.completions.create(
            model="large", messages=[{"role": "user", "content": "What is the capital of France?"}]
        )
        assert time.monotonic() - started >= LATENCY_MS / 1000
        assert resp.choices[0].message.content == RECORDS[0]["outcomes"]["large"]["response"]
        assert resp.usage is not None and (
            resp.usage.prompt_tokens,
            resp.usage.completion_tokens,
        ) == (19, 18)
        # "large" has no answer recorded for "2+2?": deterministic fallback with estimated tokens.
        fb = client.chat.completions.create(
            model="large", messages=[{"role": "user", "content": "2+2?"}]
        )
        text = fb.choices[0].message.content or ""
        assert "large" in text and fb.usage is not None
        assert fb.usage.completion_tokens == math.ceil(len(text) / 4)
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model="gemma-2-9b-it", messages=[{"role": "user", "content": "x"}]
            )


def test_api_key_is_enforced(configured: str) -> None:
    msg: Any = [{"role": "user", "content": "2+2?"}]
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=replay_root(configured)) as http:
        assert http.get("/health").status_code == 200  # liveness needs no key
        for path in ("/_replay/stats", "/v1/models"):
            assert http.get(path).status_code == 401
        before = http.get("/_replay/stats", headers=auth).json()["requests"].get("small", 0)

        anonymous = http.post("/v1/chat/completions", json={"model": "small", "messages": msg})
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["type"] == "authentication_error"
        with _client(configured, "wrong-key") as bad:
            with pytest.raises(openai.AuthenticationError) as exc:
                bad.chat.completions.create(model="small", messages=msg)
        assert isinstance(exc.value.body, dict) and exc.value.body["code"] == "invalid_api_key"
        with _client(configured) as good:
            resp = good.chat.completions.create(model="small", messages=msg)
        assert resp.choices[0].message.content == "5"
        # Only the authenticated request reached the model.
        after = http.get("/_replay/stats", headers=auth).json()["requests"]["small"]
        assert after == before + 1


async def test_stream_events_are_sent_as_produced(configured: str) -> None:
    """With a per-chunk delay, the first delta arrives long before the stream ends: the server
    writes each event as it is produced instead of buffering the response."""
    body = {
        "model": "large",
        "stream": True,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    arrivals: list[tuple[float, bytes]] = []
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{configured}/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
            async for line in r.content:
                if line.startswith(b"data: "):
                    arrivals.append((time.monotonic(), line.strip()))
    assert arrivals[-1][1] == b"data: [DONE]"
    content_events = [t for t, line in arrivals if b'"content":"' in line and b'"role"' not in line]
    assert len(content_events) >= 4
    assert (
        arrivals[-1][0] - content_events[0]
        >= (len(content_events) - 1) * CHUNK_DELAY_MS / 1000 * 0.5  # buffered: ~0
    )


def test_startup_failures_exit_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "outcomes": {}}\n')
    with pytest.raises(RuntimeError, match=r"exit 2"):
        start_replay_upstream(tmp_path, "--table", str(bad))
    # Exit 1 before, where `xrouter serve` refuses a start with 2.
    with pytest.raises(RuntimeError, match=r"exit 2"):
        start_replay_upstream(tmp_path, "--table", str(tmp_path / "missing.jsonl"))


def test_serve_announces_its_port_on_a_file_descriptor() -> None:
    read_fd, write_fd = os.pipe()
    code = (
        "import sys; from gateway.replay.server import serve; "
        "serve('127.0.0.1', 0, ready_fd_or_file=int(sys.argv[1]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(write_fd)], cwd=REPO_ROOT, pass_fds=(write_fd,)
    )
    os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb") as ready:
            port = int(ready.readline())
        health = httpx.get(f"http://127.0.0.1:{port}/health")
        assert health.json() == {"status": "ok"}
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
        assert len(models) == 8  # the packaged demo table
    finally:
        stop_replay_upstream(proc)
    assert proc.returncode == 0


def test_module_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gateway.replay", "--help"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for option in ("--host", "--port", "--table", "--latency-ms", "--api-key", "--port-file"):
        assert option in out


def test_exit_with_parent_stops_when_the_parent_dies(tmp_path: Path) -> None:
    # A parent that starts the replay upstream and is then killed without any cleanup.
    port_file = tmp_path / "port"
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import subprocess, sys, time, pathlib\n"
                f"p = subprocess.Popen([sys.executable, '-m', 'gateway.replay', '--port', '0', '--port-file', {str(port_file)!r}, '--exit-with-parent'])\n"
                f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid))\n"
                "time.sleep(60)\n"
            ),
        ],
        cwd=REPO_ROOT,
    )
    deadline = time.monotonic() + 20
    while not (port_file.exists() and pid_file.exists()):
        assert time.monotonic() < deadline, "replay upstream did not start"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while (
        Path(f"/proc/{child}").exists()
        and Path(f"/proc/{child}/status").read_text().find("State:\tZ") < 0
    ):
        assert time.monotonic() < deadline, "the replay upstream outlived its parent"
        time.sleep(0.1)


def test_a_parent_named_by_pid_that_is_already_gone_stops_it(tmp_path: Path) -> None:
    # `xrouter serve` names itself: a gateway that died before the replay upstream started
    # watching would otherwise leave it watching init (its new parent) forever.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.replay",
            "--port",
            "0",
            "--port-file",
            str(tmp_path / "port"),
            "--exit-with-parent",
            str(gone.pid),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"parent process {gone.pid} is gone" in proc.stderr


def _xrouter_replay(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "replay-upstream", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def _listening_port(proc: subprocess.Popen[str], port_file: Path) -> int:
    """The port ``proc`` wrote to ``port_file`` once listening (30 s at most)."""
    deadline = time.monotonic() + 30
    while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert port_file.exists(), "the replay upstream did not start"
    return int(port_file.read_text())


@pytest.mark.parametrize("level", ["ERROR", "warning"])
def test_xrouter_replay_upstream_obeys_its_log_level(tmp_path: Path, level: str) -> None:
    # Under `xrouter` the root logger was configured (INFO) before the option was read, so
    # the option changed nothing: the listening and shutting-down lines still came.
    port_file = tmp_path / "port"
    proc = _xrouter_replay(
        tmp_path, "--port", "0", "--port-file", str(port_file), "--log-level", level
    )
    try:
        port = _listening_port(proc, port_file)
        assert httpx.get(f"http://127.0.0.1:{port}/health").json() == {"status": "ok"}
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert " INFO " not in output, output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--log-level", "bogus"), "invalid choice: 'bogus'"),
        (("--port", "70000"), "70000 is not a port"),
        (("--port", "-5"), "-5 is not a port"),
        (("--port", "eighty"), "not a port number"),
    ],
)
def test_xrouter_replay_upstream_refuses_a_bad_level_or_port(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    # Accepted before: a bogus level as INFO, 70000 as the wrapped port 4464, -5 as a
    # socket error after startup.
    proc = _xrouter_replay(tmp_path, *args)
    try:
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, output
    assert says in output and "Traceback" not in output, output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--port", "in-use"), "cannot start: port {port} on 127.0.0.1 is in use"),
        (("--host", "no-such-host.invalid"), "cannot start: cannot listen on no-such-host"),
        (("--host", "192.0.2.1"), "cannot start: cannot listen on 192.0.2.1"),
        (("--table", "missing.jsonl"), "cannot start: outcome table missing.jsonl: No such file"),
        (("--table", "."), "cannot start: outcome table .: Is a directory"),
        (("--table", "bad.jsonl"), "cannot start: bad outcome table: bad.jsonl:1: not valid JSON"),
    ],
)
def test_xrouter_replay_upstream_refuses_a_start_as_serve_does(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    # A port in use, a host it cannot bind and a table it cannot read were exit 1 (a
    # malformed table 2), each with the OS's "[Errno N] ..." text; `xrouter serve` refuses
    # every start with one "cannot start:" line and exit 2.
    (tmp_path / "bad.jsonl").write_text('{"id": 1\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = _xrouter_replay(tmp_path, *(port if a == "in-use" else a for a in args))
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    lines = output.splitlines()
    assert len(lines) == 1 and " ERROR " in lines[0], output
    assert says.format(port=port) in lines[0], output


def test_serve_and_replay_upstream_refuse_a_port_in_use_alike(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        outcomes = [
            subprocess.run(
                [sys.executable, "-m", "gateway.cli", command, "--port", port],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=tmp_path,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            )
            for command in ("serve", "replay-upstream")
        ]
    for proc in outcomes:
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.splitlines()
        assert line.endswith(
            f"cannot start: port {port} on 127.0.0.1 is in use (another server listens "
            "there): stop it, or give another --port"
        ), line


@pytest.mark.parametrize(
    ("port_file", "says"),
    [
        ("ports", "--port-file {tmp}/ports: Is a directory"),
        (
            "missing/port",
            "--port-file {tmp}/missing/port: cannot write in {tmp}/missing: No such file or "
            "directory",
        ),
        (
            "a-file/port",
            "--port-file {tmp}/a-file/port: cannot write in {tmp}/a-file: Not a directory",
        ),
        (
            "{unwritable}/port",
            "--port-file {unwritable}/port: cannot write in {unwritable}: Permission denied",
        ),
    ],
)
def test_xrouter_replay_upstream_refuses_a_port_file_it_cannot_write(
    tmp_path: Path, port_file: str, says: str
) -> None:
    # Refused only once it was listening: its "listening" line came first. Onto a
    # directory, the port went to a "ports.tmp" left beside it.
    (tmp_path / "ports").mkdir()
    (tmp_path / "a-file").write_text("")
    names = {"tmp": str(tmp_path)}
    if "unwritable" in port_file:
        names["unwritable"] = str(unwritable_dir(tmp_path))
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _xrouter_replay(
        tmp_path, "--port", "0", "--port-file", str(tmp_path / port_file.format(**names))
    )
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    [line] = output.splitlines()
    assert " ERROR " in line and f"cannot start: {says.format(**names)}" in line, output
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_port_file_names_a_port_only_while_it_is_listened_on(tmp_path: Path) -> None:
    # The port file outlived the run that wrote it, and a later start that was refused
    # left it in place: a script waiting for it read the dead port at once.
    port_file = tmp_path / "port"
    port_file.write_text("4242\n")  # an earlier run's, killed before it could withdraw it
    proc = _xrouter_replay(
        tmp_path, "--port", "0", "--port-file", str(port_file), "--table", "missing.jsonl"
    )
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, output
    assert not port_file.exists()

    proc = _xrouter_replay(tmp_path, "--port", "0", "--port-file", str(port_file))
    try:
        port = _listening_port(proc, port_file)
        assert httpx.get(f"http://127.0.0.1:{port}/health").json() == {"status": "ok"}
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert not port_file.exists()


def test_a_port_file_rewritten_by_another_run_is_left_to_it(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = _xrouter_replay(tmp_path, "--port", "0", "--port-file", str(port_file))
    try:
        _listening_port(proc, port_file)
        port_file.write_text("4242\n")  # another run's port, written meanwhile
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert port_file.read_text() == "4242\n"


def test_serve_leaves_no_temporary_file_beside_a_port_file_it_cannot_write(
    tmp_path: Path,
) -> None:
    # serve() (for embedding) has no check before it listens: the port went to "ports.tmp",
    # which the replace onto the directory then failed to move, and left there.
    (tmp_path / "ports").mkdir()
    with pytest.raises(IsADirectoryError):
        serve("127.0.0.1", 0, ready_fd_or_file=tmp_path / "ports")
    assert [p.name for p in tmp_path.iterdir()] == ["ports"]
