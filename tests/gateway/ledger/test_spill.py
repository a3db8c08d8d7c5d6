"""The journal's ownership of its files: a live writer's segments are never adopted by
another writer, a dead (or closed) one's are."""

from __future__ import annotations

import fcntl
import uuid
from pathlib import Path

import pytest

from gateway.ledger.spill import SpillJournal
from tests.gateway.ledger.factories import make_request


def test_a_closed_writers_records_are_adopted_and_a_live_ones_are_not(tmp_path: Path) -> None:
    live, closed, me = (SpillJournal(tmp_path) for _ in range(3))
    for j in (live, closed, me):
        j.open()
    live.append([make_request(uuid.uuid4().hex)])
    closed.append([make_request(uuid.uuid4().hex)])
    closed.close()  # its spill stays for the next writer to replay
    assert me.adopt_orphans() == 1
    assert [len(SpillJournal.read(p)) for p in me.seal()] == [1]
    assert me.adopt_orphans() == 0 and len(live.seal()) == 1
    for j in (live, me):
        j.close()


def test_a_writer_starting_up_is_never_taken_for_a_dead_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another writer scans for orphans at the worst moment: after this one created its lock
    # file and before it locked it. The starting writer must keep its lock file, or the
    # other would adopt its segments from then on, while it still writes them.
    other, me = SpillJournal(tmp_path), SpillJournal(tmp_path)
    other.open()
    real_flock = fcntl.flock
    scanned: list[int] = []

    def flock_after_a_scan(fd: int, operation: int) -> None:
        if not scanned:
            scanned.append(-1)  # the scan's own flock calls go straight through
            scanned[0] = other.adopt_orphans()
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_scan)
    me.open()
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert scanned == [0]
    me.append([make_request(uuid.uuid4().hex)])
    assert other.adopt_orphans() == 0
    assert len(me.seal()) == 1
    assert sorted(p.name for p in tmp_path.glob("*.lock")) == sorted(
        f"writer-{j.owner}.lock" for j in (other, me)
    )
    for j in (other, me):
        j.close()
