"""``xrouter export``: the command line over ``gateway.ledger.export`` — its options, the
incremental window (``--logged-since``/``--logged-until``/``--cursor``) and the cursor file,
and one-line errors instead of tracebacks."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import sqlite3
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from gateway.ledger.export import ExportFormat, export_ledger
from gateway.ledger.export_records import ExportStats
from gateway.ledger.export_windows import (
    DEFAULT_SETTLE_S,
    count_late_feedback,
    count_logged_after,
    safe_logged_until,
)
from gateway.ledger.migrations import MigrationError
from gateway.ledger.spend import parse_time_bound, to_utc
from gateway.ledger.store import describe_error, open_ledger_engine, sqlite_file


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="output file (.jsonl or .parquet)")
    parser.add_argument(
        "--format",
        choices=("jsonl", "parquet"),
        default=None,
        help="output format (default: from the file extension, else jsonl); it must "
        "agree with the extension, which is how train and eval read the file",
    )
    parser.add_argument(
        "--since",
        default=None,
        help="requests served from this UTC time (ISO 8601), inclusive; rows written late "
        "(batched, replayed after a crash or an outage) can land before a previous run's "
        "end: page incremental exports with --logged-since or --cursor",
    )
    parser.add_argument(
        "--until", default=None, help="requests served up to this UTC time (ISO 8601), exclusive"
    )
    parser.add_argument(
        "--logged-since",
        default=None,
        help="rows written to the ledger from this UTC time (ISO 8601), inclusive, however "
        "late after their request: the previous incremental export's --logged-until",
    )
    parser.add_argument(
        "--logged-until",
        default=None,
        help="rows written to the ledger before this UTC time (ISO 8601); default, with "
        "--logged-since or --cursor: the database's clock less --settle-seconds",
    )
    parser.add_argument(
        "--cursor",
        default=None,
        metavar="FILE",
        help="incremental export: start where FILE says (from the beginning if there is no "
        "FILE) and, once the output is in place, write this export's end to FILE",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=DEFAULT_SETTLE_S,
        help="how far behind the database's clock the default --logged-until stays, so "
        "that rows of a write still in flight are not passed over (default: %(default)g; "
        "more than the longest a ledger write transaction stays open)",
    )
    parser.add_argument(
        "--scored",
        action="store_true",
        help="incremental windows by when requests were first scored (their first feedback "
        "reached the ledger) rather than logged: each scored request once, as soon as it "
        "has a score, however late that comes; with --cursor or --logged-since/-until",
    )
    parser.add_argument("--key", default=None, help="only requests of this key id")
    parser.add_argument(
        "--include-unscored",
        action="store_true",
        help="also export requests without feedback (outcome without a score)",
    )


@dataclass
class _LoggedWindow:
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


def _logged_window(args: argparse.Namespace) -> _LoggedWindow | None:
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
    since = _parse_bound(since_arg, "--logged-since")
    until = _parse_bound(until_arg, "--logged-until")
    path = Path(cursor) if cursor is not None else None
    if path is not None:
        since = _read_cursor(path, args.scored)
    return _LoggedWindow(since, until, path, args.scored)


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


def _write_cursor(path: Path, value: datetime, scored: bool = False) -> None:
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


async def run_export(args: argparse.Namespace, ledger_url: str) -> int:
    """Run ``xrouter export``; return the process exit code."""
    named: ExportFormat = "parquet" if args.out.endswith(".parquet") else "jsonl"
    fmt: ExportFormat = args.format or named
    if fmt != named:
        # The readers (train, eval, convert) know a table's format by its extension: a
        # Parquet file named .jsonl would be read as broken JSON lines, and the reverse.
        want = ".parquet" if fmt == "parquet" else ".jsonl"
        print(
            f"error: --format {fmt} writes a {want} file, but --out {args.out!r} is named "
            f"as {named}: name it with {want}",
            file=sys.stderr,
        )
        return 2
    if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        # Said before the ledger is read, not as a ModuleNotFoundError after it.
        print(
            "error: writing Parquet needs pyarrow, which the gateway's own install leaves "
            "out: pip install 'xrouter[export]' (or write .jsonl)",
            file=sys.stderr,
        )
        return 2
    try:
        try:
            url = make_url(ledger_url)
        except sa.exc.ArgumentError:
            # Most often a file path given for a URL (`--ledger xrouter.db`); never quoted,
            # as a URL may hold a password.
            raise ValueError(
                "--ledger (or ledger.url) is not a database URL: give one as the gateway's "
                "ledger.url, e.g. sqlite+aiosqlite:///./xrouter.db or "
                "postgresql+asyncpg://user@host/xrouter"
            ) from None
        except ValueError:  # SQLAlchemy's int() of the port; the URL may hold a password
            raise ValueError("--ledger (or ledger.url): the URL's port is not a number") from None
        db_file = sqlite_file(url)
        _check_paths_apart(args, db_file)
        since, until = _parse_bound(args.since, "--since"), _parse_bound(args.until, "--until")
        window = await asyncio.to_thread(_logged_window, args)
    except (ValueError, sa.exc.ArgumentError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if db_file is not None:
        missing = await asyncio.to_thread(_no_ledger_in, db_file)
        if missing is not None:
            # Opening it would make it a ledger (the schema written into the file, or a new
            # file): an export reads a ledger, it never makes one.
            print(f"error: no ledger database at {db_file}{missing}", file=sys.stderr)
            return 2
    settle = float(args.settle_seconds)
    unsettled = False
    late = 0
    waiting: int | None = None
    settled_by = None if args.logged_until else f"--settle-seconds {settle:g}"
    try:
        engine = await open_ledger_engine(ledger_url)
        stats = ExportStats()
        try:
            if window is not None:
                # The window's end is fixed before any row is read: rows that commit while
                # the export runs are the next window's.
                safe = await safe_logged_until(engine, settle)
                if window.until is None:
                    window.until = safe
                else:
                    unsettled = window.until > safe
            n = await export_ledger(
                engine,
                args.out,
                fmt,
                since,
                until,
                args.key,
                args.include_unscored,
                stats,
                logged_since=window.since if window else None,
                logged_until=window.until if window else None,
                scored=window is not None and window.scored,
            )
            if window is not None and window.since is not None and window.until is not None:
                try:
                    late = await count_late_feedback(
                        engine, window.since, window.until, args.key, scored=window.scored
                    )
                except sa.exc.SQLAlchemyError as exc:
                    # A diagnostic: the export is written, and its window must still move on.
                    print(
                        f"warning: could not count late feedback: {describe_error(exc)}",
                        file=sys.stderr,
                    )
            if window is not None and not window.scored and window.until is not None:
                try:
                    waiting = await count_logged_after(engine, window.until, since, until, args.key)
                except sa.exc.SQLAlchemyError as exc:
                    print(
                        f"warning: could not count requests after the window: "
                        f"{describe_error(exc)}",
                        file=sys.stderr,
                    )
        finally:
            await engine.dispose()
    except (OSError, ValueError, ImportError, sa.exc.SQLAlchemyError, MigrationError) as exc:
        # An unreachable database, one holding another schema or of a kind the ledger does
        # not run on (its driver is not installed), or an unwritable output file: one line,
        # not a traceback (and no statement or bound values, which would be prompts).
        print(f"error: export failed: {describe_error(exc)}", file=sys.stderr)
        return 2
    print(_summary(n, args.out, stats))
    if window is None:
        return 0
    if unsettled:
        print(
            f"warning: --logged-until is less than {settle:g} s behind the database's clock: "
            "a write still in flight may yet commit rows before it, which a next export "
            "from it would not see",
            file=sys.stderr,
        )
    if late:
        why = (
            "first scored in earlier windows: no export carries these re-scores (a request is "
            "exported once, with the feedback it has then)"
            if window.scored
            else "of earlier windows: no export carries them (a request is exported with the "
            "feedback it has when its window closes, an unscored one not at all); a longer "
            f"--settle-seconds (now {settle:g}) waits longer for feedback, and --scored "
            "windows export each request once it is scored"
        )
        print(
            f"warning: {late} feedback score{'s' if late != 1 else ''} reached the ledger in "
            f"this window for requests {why}",
            file=sys.stderr,
        )
    return await _report_window(window, waiting, settled_by)


def _same_path(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same path once symlinks and ``..`` are resolved,
    or (both existing) the same inode — a hard link."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_paths_apart(args: argparse.Namespace, db_file: Path | None) -> None:
    """Refuse an ``--out`` or ``--cursor`` that names the ledger's own SQLite file (or its
    journal), or each other. Both are replaced whole when the export is done: the ledger
    would become the export file (a running gateway's database swapped under it), and an
    export written over by the cursor is lost while the cursor moves past its requests."""
    out = Path(args.out)
    cursor = Path(args.cursor) if args.cursor is not None else None
    if cursor is not None and _same_path(out, cursor):
        raise ValueError(
            "--out and --cursor name the same file: the cursor would be written over the "
            "export (and its requests never exported again); give the cursor its own file"
        )
    if db_file is None:
        return
    ledger = [db_file, *(Path(f"{db_file}{suffix}") for suffix in ("-wal", "-shm", "-journal"))]
    for option, path in (("--out", out), ("--cursor", cursor)):
        if path is not None and any(_same_path(path, f) for f in ledger):
            raise ValueError(
                f"{option} names the ledger database's own file ({db_file}): writing it would "
                "replace the ledger; choose another path"
            )


def _no_ledger_in(db_file: Path) -> str | None:
    """Why the SQLite file ``db_file`` holds no ledger (a suffix for the error line: empty
    when there is no file), or None when it may hold one. SQLite takes an empty file, or a
    database without tables, for a new database, which the migrations would turn into an
    empty ledger. Read-only, and anything inconclusive (a locked database, one SQLite cannot
    read) is left to the export itself, whose errors say so."""
    try:
        size = db_file.stat().st_size
    except FileNotFoundError:
        return ""
    except OSError:
        return None
    if db_file.is_dir():
        return " (a directory)"
    if size == 0:
        return " (an empty file)"
    try:
        conn = sqlite3.connect(f"{db_file.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
        try:
            (tables,) = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return " (an empty SQLite database)" if tables == 0 else None


def _summary(n: int, out: str, stats: ExportStats) -> str:
    """The export's one line: how many records went where, and why others were left out."""
    line = f"exported {n} records to {out}"
    if stats.failures:
        line += f" ({stats.failures} of them a chosen model's failed call, scored 0)"
    if stats.unscored_skipped:
        # Most traffic has no feedback: say why it is missing, or an empty export puzzles.
        line += (
            f"; skipped {stats.unscored_skipped} successful requests without feedback "
            "(score them with POST /v1/feedback, or export them unscored with "
            "--include-unscored)"
        )
    if stats.unknown_propensity:
        line += (
            f"; skipped {stats.unknown_propensity} requests whose policy logged no usable "
            "propensity (as the llm router sampling at temperature > 0): no off-policy data"
        )
    if stats.budget_refused_skipped:
        line += (
            f"; skipped {stats.budget_refused_skipped} requests whose chosen model was refused "
            "by a budget (max_cost_usd, the key's) before it was called: whatever answered "
            "instead is no outcome of it"
        )
    if stats.not_called_skipped:
        line += (
            f"; skipped {stats.not_called_skipped} requests whose chosen model was never "
            "called (its open circuit kept the call away) or not waited for: nothing about it"
        )
    return line


async def _report_window(
    window: _LoggedWindow, waiting: int | None = None, settled_by: str | None = None
) -> int:
    """Say which rows the export covered, how many requests logged after it wait for a
    later run (``waiting``; ``settled_by``, the option that ended the window short of now),
    and where the next one starts; save that in the cursor file. Runs once the output is in
    place."""
    end = window.end
    assert window.until is not None and end is not None  # set before the export ran
    start = window.since.isoformat() if window.since is not None else "the beginning"
    what = "requests first scored" if window.scored else "rows logged"
    line = f"{what} from {start} until {window.until.isoformat()}"
    if window.since is not None and window.until <= window.since:
        line += " (none: the window ends before it starts)"
    if waiting:
        # Without it, an export of fresh traffic under a long settle time (0 records) does
        # not say why: those requests are the next windows'.
        why = settled_by or "--logged-until"
        line += (
            f"; {waiting} request{'s' if waiting != 1 else ''} logged after "
            f"{window.until.isoformat()} wait for a later run ({why})"
        )
    if window.cursor is None:
        again = "--scored --logged-since" if window.scored else "--logged-since"
        print(f"{line}; continue with {again} {end.isoformat()}")
        return 0
    try:
        await asyncio.to_thread(_write_cursor, window.cursor, end, window.scored)
    except OSError as exc:
        print(
            f"error: the export is in place but the cursor {window.cursor} could not be "
            f"saved ({exc}); the next export from it repeats this window",
            file=sys.stderr,
        )
        return 2
    print(f"{line}; cursor {window.cursor} now at {end.isoformat()}")
    return 0


def _parse_bound(value: str | None, option: str) -> datetime | None:
    """An option's time bound, as ``GET /admin/spend`` takes one; said with the option."""
    if value is None:
        return None
    try:
        return parse_time_bound(value)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None
