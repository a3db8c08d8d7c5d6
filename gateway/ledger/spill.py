"""The journal: append-only JSONL segments for records that are not (yet) in the database.

Two series share one directory and one format:

- *WAL* segments hold durable records (``submit_durable``) from the moment they are
  acknowledged until the database has committed them; then the segment is deleted.
- *spill* segments hold records the database could not take (down, or the queue was full)
  until a replay has inserted them.

One writer process per file (the owner id ``<pid>-<token>`` is in every name), fsync'ed per
batch so an acknowledged record survives ``kill -9`` (and power loss). Each
owner holds an exclusive ``flock`` on its lock file for as long as it lives; the kernel drops
the lock when the process dies, which is how a live writer recognizes the files of a dead
one and adopts them (renames them into its own namespace) for replay.

Files in ``spill_dir``::

    writer-<owner>.lock              held (flock) while the owner runs
    wal-<owner>-<seq>.jsonl          durable records not yet known to be committed
    spill-<owner>-<seq>.jsonl        records waiting for a replay
    rejected-<owner>.jsonl           records the database refused as invalid (never replayed)

Every file here is made 0600, and the directory, when the journal makes it, 0700: they
hold whole ledger records (prompts, with ``ledger.log_content: full``).

Everything here is blocking file I/O: the writer calls it from ONE dedicated thread, which
also serializes all operations, so this class needs no locks of its own.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import orjson

from gateway.ledger.private_files import FILE_MODE, make_private_dir, open_private_append
from gateway.ledger.records import LedgerRecord, dumps, record_from_envelope, record_to_envelope

logger = logging.getLogger(__name__)

# Rotate segments so a replay reads a bounded amount at a time.
DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024
# WAL segments are deleted once committed: small ones are deleted soon after the traffic that
# filled them, and a crash leaves little already-committed data to replay.
DEFAULT_WAL_SEGMENT_BYTES = 1024 * 1024


def _fsync_dir(path: Path) -> None:
    # A new file's directory entry must be durable too, or fsync'ed data can be unreachable
    # after a power loss.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _segment_owner(name: str) -> str | None:
    """``spill-<pid>-<token>-<seq>.jsonl`` (or ``wal-...``) -> ``<pid>-<token>``."""
    prefix, _, rest = name.partition("-")
    if prefix not in ("spill", "wal") or not rest.endswith(".jsonl"):
        return None
    owner, _, seq = rest[: -len(".jsonl")].rpartition("-")
    return owner if owner and seq.isdigit() else None


class _Segments:
    """The open segment of one series (wal or spill) and its rotation."""

    def __init__(
        self, directory: Path, prefix: str, owner: str, max_bytes: int, fsync: bool = True
    ) -> None:
        self.directory = directory
        self.fsync = fsync
        self.prefix = prefix
        self.owner = owner
        self.max_bytes = max_bytes
        self.seq = 0
        self.file: IO[bytes] | None = None
        self.path: Path | None = None
        self.size = 0
        # The last write to the open segment failed part-way (a full disk): the file may end
        # in the middle of a line.
        self.torn = False

    def path_for(self, seq: int) -> Path:
        return self.directory / f"{self.prefix}-{self.owner}-{seq:08d}.jsonl"

    def write(self, data: bytes) -> tuple[int, int | None]:
        """Append (and fsync if asked); return (seq written to, seq sealed by a rotation or
        None). Without fsync the bytes are in the OS page cache once ``write`` returns: they
        survive the process being killed, not the machine crashing."""
        sealed = None
        if self.file is None or self.size >= self.max_bytes:
            sealed = self.close()
            self.seq += 1
            self.path = self.path_for(self.seq)
            self.file = open_private_append(self.path)
            self.size, self.torn = 0, False
            _fsync_dir(self.directory)
        assert self.file is not None
        if self.torn:
            # Start on a line of our own: the torn one (its records were not acknowledged,
            # and are retried) must stay the only unreadable line, not swallow the first
            # record written now.
            data = b"\n" + data
        try:
            self.file.write(data)
            self.file.flush()
            if self.fsync:
                os.fsync(self.file.fileno())
        except BaseException:
            self.torn = True
            raise
        self.torn = False
        self.size += len(data)
        return self.seq, sealed

    def close(self) -> int | None:
        """Close the open segment; return its seq (None if none was open). A segment that
        never got a byte is removed: it would only be noise for the next adopter."""
        if self.file is None:
            return None
        self.file.close()
        seq, path, size = self.seq, self.path, self.size
        self.file, self.path, self.size = None, None, 0
        if path is not None and size == 0:
            path.unlink(missing_ok=True)
        return seq


class SpillJournal:
    def __init__(
        self,
        directory: str | Path,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        wal_segment_bytes: int = DEFAULT_WAL_SEGMENT_BYTES,
        wal_fsync: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.owner = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._lock_fd: int | None = None
        self._spill = _Segments(self.directory, "spill", self.owner, segment_bytes)
        self._wal = _Segments(self.directory, "wal", self.owner, wal_segment_bytes, fsync=wal_fsync)
        # Read from the event loop thread as a hint ("is there anything to replay?"); a bool
        # assignment is atomic, and a stale value only delays a replay by one cycle.
        self.has_data = False

    # -- lifecycle --------------------------------------------------------------------

    def open(self) -> None:
        make_private_dir(self.directory)
        # Locked under a name no other writer looks at, then renamed into place: a lock file
        # that is seen unlocked is a dead writer's, and a writer scanning between our create
        # and our flock would take this live one's for dead, delete it, and from then on
        # adopt our segments as we write them.
        final = self._lock_path(self.owner)
        pending = final.with_name(f".{final.name}.new")
        fd = os.open(pending, os.O_RDWR | os.O_CREAT, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(pending, final)
        self._lock_fd = fd
        _fsync_dir(self.directory)

    def close(self) -> None:
        """Close the open segments and release the lock. Files holding records stay for the
        next writer to adopt; the lock file goes when nothing is left."""
        self._spill.close()
        self._wal.close()
        if self._lock_fd is None:
            return
        leftovers = list(self.directory.glob(f"spill-{self.owner}-*.jsonl")) + list(
            self.directory.glob(f"wal-{self.owner}-*.jsonl")
        )
        if not leftovers:
            self._lock_path(self.owner).unlink(missing_ok=True)
        os.close(self._lock_fd)  # releases the flock
        self._lock_fd = None

    # -- the WAL series ---------------------------------------------------------------

    def wal_append(self, records: Iterable[LedgerRecord]) -> tuple[int, int | None]:
        """Journal durable records; written (and fsync'ed if the journal is) when this returns. Returns the segment they are
        in and the segment a rotation sealed (no longer written to), if any."""
        return self._wal.write(_encode(records))

    def wal_seal(self) -> int | None:
        """Close the open WAL segment (shutdown); return its seq."""
        return self._wal.close()

    def wal_remove(self, seq: int) -> None:
        """Every record of this sealed segment is committed: drop it."""
        self._wal.path_for(seq).unlink(missing_ok=True)

    def wal_to_spill(self, seq: int) -> None:
        """Some records of this sealed segment did not reach the database: hand the whole
        segment to the replay (records that did are skipped there by ON CONFLICT)."""
        self._spill.seq += 1
        try:
            self._wal.path_for(seq).rename(self._spill.path_for(self._spill.seq))
        except FileNotFoundError:
            return
        self.has_data = True

    # -- the spill series -------------------------------------------------------------

    def append(self, records: Iterable[LedgerRecord]) -> int:
        """Spill records; fsync'ed when this returns."""
        data = _encode(records)
        if not data:
            return 0
        self._spill.write(data)
        self.has_data = True
        return data.count(b"\n")

    def reject(self, records: Iterable[LedgerRecord], reason: str) -> None:
        """Keep records the database refused as invalid, for a human to look at."""
        lines = []
        for r in records:
            env = record_to_envelope(r)
            env["reason"] = reason
            lines.append(dumps(env) + b"\n")
        path = self.directory / f"rejected-{self.owner}.jsonl"
        with open_private_append(path) as fh:
            fh.write(b"".join(lines))
            fh.flush()
            os.fsync(fh.fileno())

    # -- replay -----------------------------------------------------------------------

    def seal(self) -> list[Path]:
        """Close the open spill segment (new spills start a new one) and return every spill
        segment of this owner, oldest first. The returned files are no longer written to."""
        self._spill.close()
        segments = self.spill_segments()
        self.has_data = bool(segments)
        return segments

    def spill_segments(self) -> list[Path]:
        return sorted(
            (
                p
                for p in self.directory.glob(f"spill-{self.owner}-*.jsonl")
                if p != self._spill.path
            ),
            key=lambda p: p.name,
        )

    @staticmethod
    def read(path: Path) -> list[LedgerRecord]:
        """Parse a sealed segment (safe from any thread). A torn last line (crash mid-write)
        was never acknowledged and is skipped; any other bad line is logged and skipped
        rather than blocking the records after it."""
        records: list[LedgerRecord] = []
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return records
        for lineno, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(record_from_envelope(orjson.loads(line)))
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                logger.warning("skipping unreadable journal line %s:%d: %s", path, lineno, exc)
        return records

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        self.has_data = bool(self.spill_segments()) or self._spill.file is not None

    def adopt_orphans(self) -> int:
        """Take over the segments (WAL and spill) of writers that are gone; return how many
        were adopted.

        A writer is gone when its lock file can be flock'ed (the kernel released it when the
        process died) or when its segments have no lock file at all. Adopted segments are
        renamed into this owner's spill series, so they replay and get removed like our own.
        """
        adopted = 0
        for lock_path in sorted(self.directory.glob("writer-*.lock")):
            owner = lock_path.name[len("writer-") : -len(".lock")]
            if owner == self.owner:
                continue
            try:
                fd = os.open(lock_path, os.O_RDWR)
            except FileNotFoundError:
                continue  # adopted by someone else meanwhile
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # alive
                adopted += self._adopt_segments_of(owner)
                lock_path.unlink(missing_ok=True)
            finally:
                os.close(fd)
        # Segments whose owner left no lock file (a closed writer, or files copied in).
        owners = {_segment_owner(p.name) for p in self.directory.glob("*.jsonl")}
        for owner in sorted(o for o in owners if o and o != self.owner):
            if not self._lock_path(owner).exists():
                adopted += self._adopt_segments_of(owner)
        if adopted:
            self.has_data = True
            _fsync_dir(self.directory)
        return adopted

    # -- internals --------------------------------------------------------------------

    def _lock_path(self, owner: str) -> Path:
        return self.directory / f"writer-{owner}.lock"

    def _adopt_segments_of(self, owner: str) -> int:
        n = 0
        # WAL before spill: roughly the order the records were made in.
        for prefix in ("wal", "spill"):
            for seg in sorted(self.directory.glob(f"{prefix}-{owner}-*.jsonl")):
                if _segment_owner(seg.name) != owner:
                    continue  # a longer owner id sharing this prefix
                self._spill.seq += 1
                try:
                    seg.rename(self._spill.path_for(self._spill.seq))
                except FileNotFoundError:
                    continue  # another writer adopted it first
                logger.info("adopted journal segment %s of stopped writer %s", seg.name, owner)
                n += 1
        return n


def _encode(records: Iterable[LedgerRecord]) -> bytes:
    return b"".join(dumps(record_to_envelope(r)) + b"\n" for r in records)
