"""Bookkeeping of the write-ahead journal's segments: when a segment may be deleted, and when
it must be replayed instead.

A durable record is appended to the open WAL segment, acknowledged, and then queued for the
database like any other record. A segment is *sealed* when the journal rotates to a new one
(or the writer closes); once sealed and every record of it that was queued has been tried,
it is *retired*: deleted if all of them were committed, otherwise (a record failed to
commit, or never joined the queue because it was full) handed to the replay with the spill
segments. Owned by the event-loop thread; the journal's file operations are the caller's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Retirement = tuple[int, Literal["remove", "replay"]]


@dataclass
class WalSegments:
    # Records per segment still queued for the database.
    _outstanding: dict[int, int] = field(default_factory=dict)
    # Segments with a record that is on disk but not in the database.
    _dirty: set[int] = field(default_factory=set)
    # Segments no longer written to.
    _sealed: set[int] = field(default_factory=set)
    # The segment being written, as far as the last append said.
    current: int | None = None

    def appended(self, seq: int, queued: int, journal_only: int) -> None:
        """Records were appended to segment ``seq``: ``queued`` of them joined the queue,
        ``journal_only`` did not (the queue was full) and will only reach the database by
        replay."""
        self.current = seq
        self._outstanding[seq] = self._outstanding.get(seq, 0) + queued
        if journal_only:
            self._dirty.add(seq)

    def settle(self, seqs: Iterable[int | None], committed: bool) -> list[Retirement]:
        """A batch was tried: ``seqs`` holds each record's segment (None: not journaled)."""
        touched: set[int] = set()
        for seq in seqs:
            if seq is None:
                continue
            self._outstanding[seq] -= 1
            if not committed:
                self._dirty.add(seq)
            touched.add(seq)
        return [r for seq in sorted(touched) if (r := self._retire(seq)) is not None]

    def seal(self, seq: int) -> list[Retirement]:
        """The journal stopped writing segment ``seq``."""
        self._sealed.add(seq)
        self._outstanding.setdefault(seq, 0)
        retired = self._retire(seq)
        return [] if retired is None else [retired]

    @property
    def current_dirty(self) -> bool:
        """The open segment holds records that are not in the database (it must be sealed
        to be replayed, rather than wait for the next rotation)."""
        return self.current is not None and self.current in self._dirty

    def _retire(self, seq: int) -> Retirement | None:
        if seq not in self._sealed or self._outstanding.get(seq, 0) > 0:
            return None
        self._sealed.discard(seq)
        self._outstanding.pop(seq, None)
        if seq in self._dirty:
            self._dirty.discard(seq)
            return seq, "replay"
        return seq, "remove"
