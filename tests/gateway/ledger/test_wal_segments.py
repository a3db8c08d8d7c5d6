"""The WAL segment bookkeeping on worked sequences: a sealed segment is retired once every
queued record of it was tried, deleted if all committed and replayed otherwise."""

from __future__ import annotations

from gateway.ledger.wal_segments import WalSegments


def test_a_segment_is_removed_once_sealed_and_all_its_records_committed() -> None:
    wal = WalSegments()
    wal.appended(1, queued=3, journal_only=0)
    assert wal.settle([1, 1], committed=True) == []  # one record still queued
    assert wal.seal(1) == []  # sealed, but that record has not been tried
    assert wal.settle([1, None], committed=True) == [(1, "remove")]
    assert wal.settle([], committed=True) == []  # retired once only


def test_a_segment_sealed_after_its_records_committed_is_removed_at_the_seal() -> None:
    wal = WalSegments()
    wal.appended(4, queued=2, journal_only=0)
    wal.appended(4, queued=1, journal_only=0)  # the next group commit, same segment
    assert wal.settle([4, 4, 4], committed=True) == []
    assert wal.seal(4) == [(4, "remove")]


def test_a_record_that_failed_to_commit_sends_its_segment_to_the_replay() -> None:
    wal = WalSegments()
    wal.appended(2, queued=2, journal_only=0)
    wal.settle([2], committed=False)  # database down: spilled, the segment is dirty
    assert wal.current_dirty
    assert wal.seal(2) == []
    assert wal.settle([2], committed=True) == [(2, "replay")]


def test_records_that_never_joined_the_full_queue_send_the_segment_to_the_replay() -> None:
    wal = WalSegments()
    wal.appended(3, queued=1, journal_only=2)
    assert wal.current_dirty
    wal.settle([3], committed=True)
    assert wal.seal(3) == [(3, "replay")]


def test_segments_retire_independently() -> None:
    wal = WalSegments()
    wal.appended(1, queued=1, journal_only=0)
    wal.appended(2, queued=1, journal_only=0)
    assert wal.current == 2 and not wal.current_dirty
    assert wal.seal(1) == []
    assert wal.settle([2, 1], committed=True) == [(1, "remove")]  # 2 is still open
    assert wal.seal(2) == [(2, "remove")]
