"""Fixtures: the replay upstream as a real subprocess, driven over loopback.

One default server (packaged demo table) is shared by the session; the ``replay`` fixture
clears its fault queue and counters before each test so tests stay independent.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import httpx
import openai
import pytest

from router.outcomes import OutcomeRecord, load_outcome_table
from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream


@dataclass(frozen=True)
class ReplayServer:
    proc: subprocess.Popen[bytes]
    base_url: str  # http://127.0.0.1:<port>/v1
    http: httpx.Client  # raw client on the server root, for /health and /_replay/*

    @property
    def root(self) -> str:
        return replay_root(self.base_url)


def demo_table_path() -> Path:
    return Path(str(resources.files("router").joinpath("assets/demo_outcomes.jsonl")))


@pytest.fixture(scope="session")
def demo_records() -> list[OutcomeRecord]:
    return load_outcome_table(demo_table_path())


@pytest.fixture(scope="session")
def replay_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplayServer]:
    proc, base_url = start_replay_upstream(tmp_path_factory.mktemp("replay"))
    # Clients are shared by the session: building one costs ~0.1 s (TLS context set-up).
    with httpx.Client(base_url=replay_root(base_url), timeout=15) as http:
        yield ReplayServer(proc, base_url, http)
    stop_replay_upstream(proc)
    assert proc.returncode == 0  # SIGTERM is a clean shutdown


@pytest.fixture
def replay(replay_server: ReplayServer) -> ReplayServer:
    replay_server.http.delete("/_replay/faults").raise_for_status()
    replay_server.http.post("/_replay/reset").raise_for_status()
    return replay_server


@pytest.fixture(scope="session")
def _session_client(replay_server: ReplayServer) -> Iterator[openai.OpenAI]:
    # max_retries=0: a fault must surface as the error it is, not be retried away.
    with openai.OpenAI(
        base_url=replay_server.base_url, api_key="unused", max_retries=0, timeout=15
    ) as c:
        yield c


@pytest.fixture
def client(replay: ReplayServer, _session_client: openai.OpenAI) -> openai.OpenAI:
    return _session_client


@pytest.fixture
async def aclient(replay: ReplayServer) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=replay.base_url, api_key="unused", max_retries=0, timeout=15)
    yield c
    await c.close()
