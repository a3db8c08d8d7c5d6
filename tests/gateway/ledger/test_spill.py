"""The journal's ownership of its files: a live writer's segments are never adopted by
another writer, a dead (or closed) one's are."""

from __future__ import annotations

import fcntl
import subprocess
import sys
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


# Runs in a child process: it lowers its own file-size limit so that an append is cut off
# mid-record, as a full disk cuts it, then lifts the limit and carries on.
_TORN_APPEND = """
import resource, signal, sys
from pathlib import Path
from gateway.ledger.spill import SpillJournal
from tests.gateway.ledger.factories import make_request

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
journal = SpillJournal(Path(sys.argv[1]))
journal.open()
journal.append([make_request("a")])
(segment,) = Path(sys.argv[1]).glob("spill-*.jsonl")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (segment.stat().st_size + 100, hard))
batch = [make_request(f"b{i:02d}") for i in range(30)]  # more than a write buffer holds
try:
    journal.append(batch)
except OSError:
    print("torn", flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
journal.append(batch)  # the writer retries what it could not journal
journal.append([make_request("c")])
journal.close()
"""


def test_a_record_appended_after_a_torn_write_is_not_lost(tmp_path: Path) -> None:
    # A full disk cuts an append short: the records were not journaled (the writer keeps
    # them and retries), but the bytes that did reach the file must not swallow the next
    # record appended after them, or the replay skips it as unreadable.
    done = subprocess.run(
        [sys.executable, "-c", _TORN_APPEND, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[3],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torn"]
    (segment,) = tmp_path.glob("spill-*.jsonl")
    ids = [r.request_id for r in SpillJournal.read(segment)]
    # Whatever of the torn batch reached the disk may be read twice (the replay stores it
    # once); every record is read.
    assert set(ids) == {"a", "c", *(f"b{i:02d}" for i in range(30))}
