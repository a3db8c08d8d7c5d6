"""The embedded demo, the README's first command: ``xrouter serve`` with no config starts the
replay upstream itself, serves the demo pool with the packaged checkpoint on a SQLite ledger
in the working directory, and takes the replay upstream down with it."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from gateway.cli import demo_config_path
from router.outcomes import OutcomeRecord
from tests.support.gateway import DEMO_MODELS, free_port
from tests.support.replay import REPO_ROOT
from tests.support.sdk import extra

README_PROMPT = "who is the founder of el pollo loco"  # the README's curl


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"xrouter serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"xrouter serve not healthy within 60 s:\n{log.read_text()}")


def _children(pid: int) -> list[int]:
    return [
        int(c)
        for task in Path(f"/proc/{pid}/task").glob("*")
        for c in (task / "children").read_text().split()
    ]


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


def test_serve_without_a_config_is_the_working_demo(
    tmp_path: Path, demo_table: list[OutcomeRecord]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Nothing of the caller's configuration may leak in: the demo needs none.
    env = {k: v for k, v in os.environ.items() if not k.startswith("XROUTER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_ready(url, proc, log)
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="xrouter", messages=[{"role": "user", "content": README_PROMPT}]
        )
        completion = raw.parse()
        # The routed model's real recorded answer to this demo prompt.
        [record] = [r for r in demo_table if r.text.strip() == README_PROMPT]
        assert completion.model in DEMO_MODELS and completion.model in record.outcomes
        answer = completion.choices[0].message.content
        assert answer == record.outcomes[completion.model].response
        assert raw.headers["x-xrouter-policy"] == "compact"
        assert completion.usage is not None and extra(completion.usage)["cost"] > 0
        # The README's Python example: routing controls in the body.
        resp = client.chat.completions.create(
            model="xrouter",
            messages=[{"role": "user", "content": "Write a haiku about routers."}],
            extra_body={"xrouter": {"cost_weight": 2.0, "max_cost_usd": 0.001}},
        )
        assert resp.model_extra is not None
        decision = resp.model_extra["xrouter"]["decision"]
        assert decision["cost_weight"] == 2.0 and decision["policy"] == "compact"
        # ... and its Responses API lines.
        r = client.responses.create(model="xrouter", input="Write a haiku about routers.")
        assert r.model in DEMO_MODELS and r.output_text and r.usage is not None
        assert extra(r.usage)["cost"] > 0
        assert httpx.get(f"{url}/dashboard", timeout=10).status_code == 200
        request_id = raw.headers["x-xrouter-request-id"]
        # Ctrl-C in a terminal signals the whole foreground group: the replay upstream is
        # not in it, so it serves the gateway's in-flight requests to the end.
        found = re.search(r"demo: replay upstream at http://127.0.0.1:(\d+)", log.read_text())
        assert found is not None, log.read_text()
        (replay_pid,) = [pid for pid in _children(proc.pid) if "--port-file" in _cmdline(pid)]
        assert os.getpgid(replay_pid) != os.getpgid(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    # The ledger is ./xrouter.db in the working directory, with the request in it.
    with sqlite3.connect(tmp_path / "xrouter.db") as db:
        row = db.execute(
            "SELECT policy, final_model FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
    assert row == ("compact", completion.model)
    # The replay upstream the gateway started went down with it.
    found = re.search(r"demo: replay upstream at (http://\S+)", log.read_text())
    assert found is not None, log.read_text()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{found.group(1)}/_replay/stats", timeout=1)
        except httpx.ConnectError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the replay upstream outlived the gateway")


def test_serve_uses_a_replay_upstream_already_running_at_xrouter_replay_url(
    tmp_path: Path,
) -> None:
    """``XROUTER_REPLAY_URL`` names a replay upstream started apart (``xrouter
    replay-upstream --port``): the demo routes to it and starts none of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("XROUTER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    port_file = tmp_path / "replay.port"
    replay = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "replay-upstream", "--port", "0",
         "--port-file", str(port_file)],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    port = free_port()
    log = tmp_path / "serve.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and replay.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        replay_url = f"http://127.0.0.1:{int(port_file.read_text())}"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
                cwd=tmp_path,
                env={**env, "XROUTER_REPLAY_URL": replay_url},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, log)
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model="xrouter", messages=[{"role": "user", "content": README_PROMPT}]
        )
        assert answer.model in DEMO_MODELS
        stats = httpx.get(f"{replay_url}/_replay/stats", timeout=10).json()
        assert stats["requests"].get(answer.model) == 1, stats
        assert "demo: replay upstream at" not in log.read_text()
        assert all("--port-file" not in _cmdline(pid) for pid in _children(proc.pid))
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(30)
        replay.terminate()
        replay.wait(30)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--port", "99999"), "server.port"),
        (("--port", "-1"), "server.port"),
        (("--workers", "0"), "server.workers"),
        (("--host", "no-such-host.invalid", "--port", "0"), "cannot listen on no-such-host"),
        (("--host", "192.0.2.1", "--port", "0"), "cannot listen on 192.0.2.1"),
        (("--port", "in-use"), "is in use"),
    ],
)
def test_a_demo_refused_for_its_server_settings_starts_no_replay_upstream(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    # The replay upstream was started first: its listening and shutting-down lines came
    # around the refusal, a child process for a server that never ran.
    env = {k: v for k, v in os.environ.items() if not k.startswith("XROUTER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", *(port if a == "in-use" else a for a in args)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and " ERROR " in lines[0] and says in lines[0], proc.stderr
    assert "replay upstream" not in proc.stderr
    assert not list(tmp_path.iterdir())  # no ledger, no spill directory


def test_a_replay_table_the_replay_upstream_cannot_read_is_a_refused_start(
    tmp_path: Path,
) -> None:
    # The replay upstream's refusal was followed by a bare "the replay upstream exited with
    # code 1" and exit 1, where every other refused start is a "cannot start:" line, exit 2.
    # A table that is not there is refused before the replay upstream is started at all.
    config = tmp_path / "demo.yaml"
    demo = Path(demo_config_path()).read_text()
    config.write_text(
        demo.replace(
            "  replay_upstream: true\n", "  replay_upstream: true\n  replay_table: none.jsonl\n"
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("XROUTER_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert " ERROR " in line and "replay" not in line, proc.stderr
    assert "cannot start: outcome table none.jsonl: No such file" in line, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["demo.yaml"]
    # One the replay upstream finds malformed: its line, then serve's.
    (tmp_path / "none.jsonl").write_text("not json\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and all(" ERROR " in line for line in lines), proc.stderr
    assert "cannot start: bad outcome table" in lines[0], proc.stderr
    assert lines[1].endswith("xrouter: cannot start: the replay upstream exited with code 2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.yaml", "none.jsonl"]
