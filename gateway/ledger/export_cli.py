"""``xrouter export``: the command line over ``gateway.ledger.export`` — its options, what it
refuses before it reads the ledger (``gateway.ledger.export_checks``), the incremental
window and its cursor file (``gateway.ledger.export_cursor``), and what it says when done
(``gateway.ledger.export_summary``); one-line errors instead of tracebacks."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.export import export_ledger
from gateway.ledger.export_bounds import (
    DEFAULT_SETTLE_S,
    count_late_feedback,
    count_logged_after,
    safe_logged_until,
)
from gateway.ledger.export_checks import (
    check_paths_apart,
    check_writable,
    no_ledger_in,
    output_format,
)
from gateway.ledger.export_checks import (
    ledger_url as parse_ledger_url,
)
from gateway.ledger.export_cursor import LoggedWindow, logged_window, parse_bound
from gateway.ledger.export_records import ExportStats
from gateway.ledger.export_summary import (
    report_window,
    summary,
    warn_late_feedback,
    warn_unsettled,
)
from gateway.ledger.migrations import latest_version, newer_schema
from gateway.ledger.readable import UnreadableLedger, open_ledger_to_read
from gateway.ledger.store import describe_error, sqlite_file


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


async def run_export(args: argparse.Namespace, ledger_url: str) -> int:
    """Run ``xrouter export``; return the process exit code."""
    try:
        fmt = output_format(args.out, args.format)
        db_file = sqlite_file(parse_ledger_url(ledger_url))
        check_paths_apart(args, db_file)
        await asyncio.to_thread(_check_outputs, args)
        since, until = parse_bound(args.since, "--since"), parse_bound(args.until, "--until")
        window = await asyncio.to_thread(logged_window, args)
    except (ValueError, sa.exc.ArgumentError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if db_file is not None:
        missing = await asyncio.to_thread(no_ledger_in, db_file)
        if missing is not None:
            # Said before the engine opens the file, which would make a new one (or set
            # another application's database to WAL): an export reads a ledger, it never
            # makes one.
            print(f"error: no ledger database at {db_file}{missing}", file=sys.stderr)
            return 2
    settle = float(args.settle_seconds)
    unsettled = False
    late = 0
    waiting: int | None = None
    settled_by = None if args.logged_until else f"--settle-seconds {settle:g}"
    try:
        try:
            # Not migrated: an export reads a ledger, it never makes one (in a database that
            # holds none) nor upgrades one (under the older gateway that writes it).
            engine, version = await open_ledger_to_read(ledger_url)
        except UnreadableLedger as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        stats = ExportStats()
        try:
            if version > latest_version():
                print(
                    f"warning: {newer_schema(version, latest_version())}: its records are "
                    "exported as this release knows them",
                    file=sys.stderr,
                )
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
            if window is not None:
                late, waiting = await _count_outside(engine, window, since, until, args.key)
        finally:
            await engine.dispose()
    except (OSError, ValueError, ImportError, sa.exc.SQLAlchemyError) as exc:
        # An unreachable database, one of a kind the ledger does not run on (its driver is
        # not installed), or an output that failed as it was written (a full disk): one
        # line, not a traceback (and no statement or bound values, which would be prompts).
        print(f"error: export failed: {describe_error(exc)}", file=sys.stderr)
        return 2
    print(summary(n, args.out, stats))
    if window is None:
        return 0
    if unsettled:
        warn_unsettled(settle)
    if late:
        warn_late_feedback(late, window.scored, settle)
    return await report_window(window, waiting, settled_by)


def _check_outputs(args: argparse.Namespace) -> None:
    check_writable(Path(args.out), "--out")
    if args.cursor is not None:
        check_writable(Path(args.cursor), "--cursor")


async def _count_outside(
    engine: AsyncEngine,
    window: LoggedWindow,
    since: datetime | None,
    until: datetime | None,
    key_id: str | None,
) -> tuple[int, int | None]:
    """What the written window could not carry: the late feedback scores in it, and the
    requests past its end (None when they could not be counted); both of the requests this
    export selects (``--since``/``--until``, ``--key``, and the export's own rules)."""
    late = 0
    waiting: int | None = None
    if window.since is not None and window.until is not None:
        try:
            late = await count_late_feedback(
                engine,
                window.since,
                window.until,
                key_id,
                scored=window.scored,
                served_since=since,
                served_until=until,
            )
        except sa.exc.SQLAlchemyError as exc:
            # A diagnostic: the export is written, and its window must still move on.
            print(
                f"warning: could not count late feedback: {describe_error(exc)}",
                file=sys.stderr,
            )
    if window.until is not None:
        try:
            waiting = await count_logged_after(
                engine, window.until, since, until, key_id, scored=window.scored
            )
        except sa.exc.SQLAlchemyError as exc:
            print(
                f"warning: could not count requests after the window: {describe_error(exc)}",
                file=sys.stderr,
            )
    return late, waiting
