"""What ``xrouter export`` says when it is done: how many records went where and why
others were left out, and for an incremental window the range it covered, the feedback it
could not carry, the requests that wait for a later run, and where the next run starts
(saved in the cursor file)."""

from __future__ import annotations

import asyncio
import sys

from gateway.ledger.export_cursor import LoggedWindow, write_cursor
from gateway.ledger.export_records import ExportStats


def summary(n: int, out: str, stats: ExportStats) -> str:
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


def warn_unsettled(settle: float) -> None:
    """Warn that an explicit ``--logged-until`` is closer to the database's clock than the
    settle time."""
    print(
        f"warning: --logged-until is less than {settle:g} s behind the database's clock: "
        "a write still in flight may yet commit rows before it, which a next export "
        "from it would not see",
        file=sys.stderr,
    )


def warn_late_feedback(late: int, scored: bool, settle: float) -> None:
    """Warn of the ``late`` feedback scores that reached the ledger in the window for
    requests no export of it carries (``export_bounds.count_late_feedback``)."""
    why = (
        "first scored in earlier windows: no export carries these re-scores (a request is "
        "exported once, with the feedback it has then)"
        if scored
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


async def report_window(
    window: LoggedWindow, waiting: int | None = None, settled_by: str | None = None
) -> int:
    """Say which rows the export covered, how many requests logged (for ``--scored``
    windows: first scored) after it wait for a later run (``waiting``; ``settled_by``, the
    option that ended the window short of now), and where the next one starts; save that
    in the cursor file. Runs once the output is in place."""
    end = window.end
    assert window.until is not None and end is not None  # set before the export ran
    start = window.since.isoformat() if window.since is not None else "the beginning"
    what = "requests first scored" if window.scored else "rows logged"
    line = f"{what} from {start} until {window.until.isoformat()}"
    if window.since is not None and window.until <= window.since:
        line += " (none: the window ends before it starts)"
    if waiting:
        # Without it, an export of fresh traffic under a long settle time (0 records), or
        # of fresh scores, does not say why: those requests are the next windows'.
        why = settled_by or "--logged-until"
        after = "first scored" if window.scored else "logged"
        line += (
            f"; {waiting} request{'s' if waiting != 1 else ''} {after} after "
            f"{window.until.isoformat()} wait for a later run ({why})"
        )
    if window.cursor is None:
        again = "--scored --logged-since" if window.scored else "--logged-since"
        print(f"{line}; continue with {again} {end.isoformat()}")
        return 0
    try:
        await asyncio.to_thread(write_cursor, window.cursor, end, window.scored)
    except OSError as exc:
        print(
            f"error: the export is in place but the cursor {window.cursor} could not be "
            f"saved ({exc}); the next export from it repeats this window",
            file=sys.stderr,
        )
        return 2
    print(f"{line}; cursor {window.cursor} now at {end.isoformat()}")
    return 0
