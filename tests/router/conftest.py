"""Real servers for the router tests: the replay upstream (downstream models) and the
scripted router model, both subprocesses on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream


@dataclass
class Downstream:
    base_url: str
    control: httpx.Client

    def fault(self, model: str, fault: str, count: int = 1) -> None:
        self.control.post(
            "/_replay/faults", json={"model": model, "fault": fault, "count": count}
        ).raise_for_status()


@pytest.fixture(scope="session")
def downstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Downstream]:
    proc, base = start_replay_upstream(tmp_path_factory.mktemp("downstream"))
    with httpx.Client(base_url=replay_root(base), timeout=10) as ctl:
        yield Downstream(base, ctl)
    stop_replay_upstream(proc)
