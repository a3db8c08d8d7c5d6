"""Where an incremental export's window ends, and what falls outside it.

A window by logged time ends a settle time behind the database's clock
(:func:`safe_logged_until`), so that rows of a write still in flight commit before its end
and are the next window's. What the window cannot carry is counted for the export's
summary: feedback that came in it for requests of earlier windows
(:func:`count_late_feedback`), and the requests past its end that a later window holds
(:func:`count_logged_after`: logged, or for ``--scored`` windows first scored, after it).
Both count only the requests the export itself selects, by the same filters.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.export_feedback import answered, first_feedback_in, scored_before
from gateway.ledger.export_windows import exported_requests
from gateway.ledger.schema import feedback, ledger_now, requests
from gateway.ledger.spend import TimeBound, to_utc

# How far behind the database's clock an incremental export's window ends by default. A row
# is stamped when its transaction starts (PostgreSQL) or when it is inserted (SQLite) and
# becomes visible when that transaction commits: a window that ended at "now" could pass
# over rows stamped just before its end and committed just after, and the next window
# (which starts there) would never see them. The ledger writer gives a transaction 10 s.
DEFAULT_SETTLE_S = 60.0


async def database_now(engine: AsyncEngine) -> datetime:
    """The database's clock (UTC), the one ``requests.logged_at`` is stamped with."""
    async with engine.connect() as conn:
        now = (await conn.execute(sa.select(ledger_now()))).scalar_one()
    if not isinstance(now, datetime):
        raise TypeError(f"the database's clock read as {now!r}")
    return now


async def safe_logged_until(engine: AsyncEngine, settle_s: float = DEFAULT_SETTLE_S) -> datetime:
    """An end for an incremental export's window that rows still in flight cannot fall
    behind: the database's clock less ``settle_s``, which must exceed the longest a
    transaction that writes ledger rows stays open. Taken from the database, so the clocks
    of the machines that write and export do not matter."""
    if not (math.isfinite(settle_s) and settle_s >= 0):
        raise ValueError(f"settle time must be a finite number of seconds >= 0, got {settle_s}")
    return await database_now(engine) - timedelta(seconds=settle_s)


async def count_late_feedback(
    engine: AsyncEngine,
    since: datetime,
    until: datetime,
    key_id: str | None = None,
    *,
    scored: bool = False,
    served_since: TimeBound = None,
    served_until: TimeBound = None,
) -> int:
    """How many feedback rows reached the database in ``[since, until)`` for requests that
    had reached it before ``since``: scores an incremental export's earlier windows could
    not carry (a request is exported with the feedback it has when its window closes, and
    an unscored one is skipped), and that this window does not carry either. Feedback on a
    cache hit counts for the request whose answer it reused, as the export attributes it.
    Feedback rows from before ``feedback.logged_at`` (migration 13) are not counted.

    With ``scored`` (windows by first feedback), the late ones are instead the scores of
    requests first scored in an earlier window: re-scores, which no export carries.

    Only requests the export itself selects count (``export_windows.exported_requests``:
    served in ``[served_since, served_until)``, of ``key_id``, answered or with a failed
    call): a score for a request no export of these options holds is not late for it."""
    lo, hi = to_utc(since), to_utc(until)
    assert lo is not None and hi is not None
    hit = requests.alias("scored")  # the request the feedback was given on
    answer = answered(hit)
    logged = feedback.c.logged_at
    # The request the score is for is ``requests`` itself, which the export's filters name.
    joined = feedback.join(hit, hit.c.request_id == feedback.c.request_id).join(
        requests, requests.c.request_id == answer
    )
    where = [
        logged.is_not(None),
        logged >= lo,
        logged < hi,
        *exported_requests(served_since, served_until, key_id),
    ]
    if scored:
        where.append(scored_before(answer, lo, key_id))
    else:
        where.append(sa.func.coalesce(requests.c.logged_at, requests.c.created_at) < lo)
    query = sa.select(sa.func.count()).select_from(joined).where(*where)
    if key_id is not None:
        query = query.where(hit.c.key_id == key_id)
    async with engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())


async def count_logged_after(
    engine: AsyncEngine,
    after: datetime,
    since: TimeBound = None,
    until: TimeBound = None,
    key_id: str | None = None,
    *,
    scored: bool = False,
) -> int:
    """How many requests the export selects (``export_windows.exported_requests``: served
    in ``[since, until)``, of ``key_id``, answered or with a failed call, not cache hits)
    reached the database at or after ``after``, a logged window's end: the ones a later
    window holds, which an export that wrote nothing must name, or the user cannot tell
    why. One COUNT by ``ix_requests_logged_at``; rows without ``logged_at`` are older than
    any window's end.

    With ``scored`` (windows by first feedback), the ones a later window holds are instead
    the requests first scored at or after ``after``, each once however often it was scored:
    a request served long before, but scored only now, waits as well, and one scored before
    ``after`` and again since does not (its later scores are re-scores). Feedback on a cache
    hit counts for the request whose answer it reused, and with ``key_id`` only that key's
    feedback counts, as the export attributes them. By ``ix_feedback_logged_at``."""
    lo = to_utc(after)
    query = sa.select(sa.func.count())
    if scored:
        first = first_feedback_in(lo, None, key_id).subquery()
        query = query.select_from(requests.join(first, first.c.answer == requests.c.request_id))
    else:
        query = query.where(requests.c.logged_at >= lo)
    query = query.where(*exported_requests(since, until, key_id))
    async with engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())
