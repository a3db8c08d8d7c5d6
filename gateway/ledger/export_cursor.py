"""The incremental window of ``xrouter export``: its options (``--logged-since``,
``--logged-until``, ``--cursor``, ``--settle-seconds``, ``--scored``) checked, and the cursor
file that keeps its place between runs."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gateway.ledger.spend import parse_time_bound, to_utc


@dataclass
class LoggedWindow:
    """An export by ``requests.logged_at``: its bounds, and the cursor file if any."""

    since: datetime | None
    until: datetime | None
    cursor: Path | None
    scored: bool = False

    @property
    def end(self) -> datetime | None:
        """Where the next window starts: never before this one's start (a database clock
        that went back, or a longer settle time, must not make the next run repeat rows)."""
        if self.since is not None and (self.until is None or self.until < self.since):
            return self.since
        return self.until


def logged_window(args: argparse.Namespace) -> LoggedWindow | None:
    """The ``--logged-*``/``--cursor`` options checked, the cursor file read; None when
    the export is not by logged time. Raises ValueError with the message for the user."""
    cursor, since_arg, until_arg = args.cursor, args.logged_since, args.logged_until
    settle = args.settle_seconds
    if not (math.isfinite(settle) and settle >= 0):
        raise ValueError(f"--settle-seconds must be a number of seconds >= 0, got {settle:g}")
    if cursor is None and since_arg is None and until_arg is None:
        if args.scored:
            raise ValueError("--scored pages incremental windows: give --cursor or --logged-since")
        return None
    if args.scored and args.include_unscored:
        raise ValueError("--scored windows hold scored requests only: drop --include-unscored")
    if cursor is not None and since_arg is not None:
        raise ValueError(
            "--cursor says where the export starts: give --cursor or --logged-since, not both"
        )
    since = parse_bound(since_arg, "--logged-since")
    until = parse_bound(until_arg, "--logged-until")
    path = Path(cursor) if cursor is not None else None
    if path is not None:
        since = _read_cursor(path, args.scored)
    return LoggedWindow(since, until, path, args.scored)


# A cursor of --scored windows says so: a position in one kind of window is not one in the
# other, and mixing them would pass over requests or export them twice.
_SCORED = "scored "


def _read_cursor(path: Path, scored: bool) -> datetime | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None  # the first run: everything logged so far
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the cursor file {path}: {exc}") from None
    was_scored = text.startswith(_SCORED)
    if was_scored != scored:
        made, given = ("with", "without") if was_scored else ("without", "with")
        raise ValueError(
            f"the cursor file {path} was written by an export {made} --scored; this one is "
            f"{given} it: use the same kind of window with a cursor, or another cursor file"
        )
    try:
        return to_utc(datetime.fromisoformat(text.removeprefix(_SCORED)))
    except ValueError:
        raise ValueError(
            f"the cursor file {path} holds no ISO 8601 time ({text[:60]!r}); it is written "
            "by xrouter export --cursor"
        ) from None


def write_cursor(path: Path, value: datetime, scored: bool = False) -> None:
    """Replace the cursor file atomically: a crash leaves the old position or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write((_SCORED if scored else "") + value.isoformat() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def parse_bound(value: str | None, option: str) -> datetime | None:
    """An option's time bound, as ``GET /admin/spend`` takes one; said with the option."""
    if value is None:
        return None
    try:
        return parse_time_bound(value)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
