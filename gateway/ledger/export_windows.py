"""Which requests an export holds, in what order, in pages: the ledger's side of
``xrouter export``.

An export selects requests by when they were served (``since``/``until`` on ``created_at``)
or, for incremental pipelines, by when their rows reached the database (``logged_since``/
``logged_until`` on ``requests.logged_at``, which the database stamps at insert): rows are
written late — batched, or replayed from a journal hours later with their original
``created_at`` — and only the second kind of window is sure to catch them. The command line
(``gateway.ledger.export_cli``) ends such a window a settle time behind the database's clock
(:func:`safe_logged_until`), so that writes still in flight commit before it, and keeps its
end in a cursor file. Windows by when requests were first *scored* (``scored=True``) page
``feedback.logged_at`` instead. Each page of requests becomes records through
``gateway.ledger.export_records.build_record``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.ledger.export_records import ExportStats, build_record
from gateway.ledger.schema import calls, feedback, ledger_now, requests
from gateway.ledger.spend import TimeBound, request_filters, to_utc

_CHUNK = 500


def _time_range(
    column: sa.ColumnElement[datetime], lo: datetime | None, hi: datetime | None
) -> list[sa.ColumnElement[bool]]:
    clauses: list[sa.ColumnElement[bool]] = []
    if lo is not None:
        clauses.append(column >= lo)
    if hi is not None:
        clauses.append(column < hi)
    return clauses


def _answered(scored: Any) -> sa.ColumnElement[str]:
    """The request whose answer feedback on ``scored`` (an alias of ``requests``) scores:
    itself, or for a cache hit the request whose answer it reused."""
    return sa.func.coalesce(scored.c.cached_from, scored.c.request_id)


def _scored_before(
    answer: sa.ColumnElement[str],
    lo: sa.ColumnElement[datetime] | datetime,
    key_id: str | None,
    tie_id: sa.ColumnElement[int] | None = None,
) -> sa.ColumnElement[bool]:
    """Whether the request ``answer`` had feedback that reached the database before
    ``lo`` (or at ``lo`` with an id below ``tie_id``, for a first-feedback test against
    one feedback row): its own, or given on one of its cache hits (by ``key_id``'s requests
    only, when given, as a key's export counts its own feedback only; a row from before
    ``feedback.logged_at`` counts at its ``created_at``)."""
    earlier = feedback.alias("earlier")
    hit = requests.alias("hit")
    when = sa.func.coalesce(earlier.c.logged_at, earlier.c.created_at)
    before = when < lo
    if tie_id is not None:
        before = sa.or_(before, sa.and_(when == lo, earlier.c.id < tie_id))
    own = sa.exists().where(earlier.c.request_id == answer, before)
    on_hit = sa.exists().where(
        hit.c.cached_from == answer, earlier.c.request_id == hit.c.request_id, before
    )
    if key_id is not None:
        on_hit = on_hit.where(hit.c.key_id == key_id)
    return sa.or_(own, on_hit)


def _first_feedback_in(
    lo: datetime | None, hi: datetime | None, key_id: str | None
) -> sa.Select[Any]:
    """The feedback rows logged in ``[lo, hi)`` that are the first feedback of the request
    they score (``answer``: the request itself, or for a cache hit the request whose answer
    it reused): no feedback of that request came before, by (logged time, id). Each scored
    request has exactly one, so consecutive windows hold it once, however often it is
    scored. With ``key_id``, only that key's feedback counts."""
    scored = requests.alias("scored")
    answer = _answered(scored)
    logged = feedback.c.logged_at
    query = (
        sa.select(answer.label("answer"), logged.label("logged_at"), feedback.c.id)
        .select_from(feedback.join(scored, scored.c.request_id == feedback.c.request_id))
        .where(logged.is_not(None), *_time_range(logged, lo, hi))
        .where(~_scored_before(answer, logged, key_id, feedback.c.id))
    )
    if key_id is not None:
        query = query.where(scored.c.key_id == key_id)
    return query


async def iter_export_records(
    engine: AsyncEngine,
    since: TimeBound = None,
    until: TimeBound = None,
    key_id: str | None = None,
    include_unscored: bool = False,
    chunk_size: int = _CHUNK,
    stats: ExportStats | None = None,
    *,
    logged_since: TimeBound = None,
    logged_until: TimeBound = None,
    scored: bool = False,
) -> AsyncIterator[list[dict[str, Any]]]:
    """Chunks of outcome records (keyset pagination: constant memory, no long-lived cursor
    holding a snapshot). ``stats`` counts what is yielded and skipped.

    ``since``/``until`` bound ``requests.created_at`` (when the request was served), and
    records come oldest request first. ``logged_since`` (inclusive) / ``logged_until``
    (exclusive) bound when the row reached the database (``requests.logged_at``; a row
    from before that column counts as logged at its ``created_at``), and records come in
    that order: consecutive windows hold every row exactly once, however late it was
    written, provided each window closed once the rows stamped before its end had
    committed (see :func:`safe_logged_until`). Both pairs may be given: they combine.

    With ``scored``, ``logged_since``/``logged_until`` bound instead when a request's
    *first* feedback reached the database (``feedback.logged_at``; feedback on a cache hit
    counts for the request whose answer it reused): consecutive windows hold every scored
    request exactly once, in the window it was first scored in, with the feedback it has
    when exported — however long after it was served. Unscored requests are not in any
    such window; feedback from before ``feedback.logged_at`` (migration 13) starts none.
    """
    if scored and include_unscored:
        raise ValueError("an export of scored windows holds scored requests only")
    failed_call = sa.exists().where(
        calls.c.request_id == requests.c.request_id,
        calls.c.role == "downstream",
        calls.c.status == "error",
    )
    base = [
        *request_filters(since, until, key_id),
        # Answered requests, and any request with a failed call (build_record keeps those
        # whose chosen model is the one that failed).
        sa.or_(
            sa.and_(
                requests.c.status >= 200,
                requests.c.status < 300,
                requests.c.final_model.is_not(None),
            ),
            failed_call,
        ),
        # Answers from the cache made no decision and cost nothing: not evidence about
        # what routing to a model buys.
        requests.c.cached_from.is_(None),
    ]
    if scored:
        async for chunk in _iter_first_scored(
            engine,
            to_utc(logged_since),
            to_utc(logged_until),
            base,
            key_id,
            chunk_size,
            stats,
        ):
            yield chunk
        return
    if logged_since is None and logged_until is None:
        passes = [(requests.c.created_at, base)]
    else:
        lo, hi = to_utc(logged_since), to_utc(logged_until)
        logged_at = requests.c.logged_at
        passes = [
            # Rows from before migration 11 (or an older release's, after a rollback):
            # logged when they were created. Read by created_at, whose index serves it.
            (
                requests.c.created_at,
                [*base, logged_at.is_(None), *_time_range(requests.c.created_at, lo, hi)],
            ),
            # Every other row, by ix_requests_logged_at.
            (logged_at, [*base, logged_at.is_not(None), *_time_range(logged_at, lo, hi)]),
        ]
    # A request is exported with the feedback it had when its window closed: feedback that
    # came after is late (``count_late_feedback`` says so in the next window), and a window
    # exported again gives the same records.
    feedback_until = to_utc(logged_until)
    for order, where in passes:
        async for chunk in _iter_pass(
            engine, order, where, key_id, include_unscored, chunk_size, stats, feedback_until
        ):
            yield chunk


async def _iter_pass(
    engine: AsyncEngine,
    order: sa.Column[datetime],
    where: Sequence[sa.ColumnElement[bool]],
    key_id: str | None,
    include_unscored: bool,
    chunk_size: int,
    stats: ExportStats | None,
    feedback_until: datetime | None = None,
) -> AsyncIterator[list[dict[str, Any]]]:
    """The records of the requests matching ``where``, by (``order``, request_id), with
    the feedback that reached the database before ``feedback_until``."""
    columns = [c for c in requests.c]
    after: tuple[datetime, str] | None = None
    while True:
        query = sa.select(*columns).where(*where)
        if after is not None:
            query = query.where(
                # The plain bound lets the index start the page where the last one ended
                # (neither database takes one from the OR), instead of re-reading from the
                # range's start on every page.
                order >= after[0],
                sa.or_(
                    order > after[0],
                    sa.and_(order == after[0], requests.c.request_id > after[1]),
                ),
            )
        query = query.order_by(order, requests.c.request_id).limit(chunk_size)
        async with engine.connect() as conn:
            rows = [dict(r._mapping) for r in await conn.execute(query)]
            if not rows:
                return
            chunk = await _records_of(conn, rows, key_id, include_unscored, stats, feedback_until)
        after = (rows[-1][order.name], rows[-1]["request_id"])
        if chunk:
            yield chunk
        if len(rows) < chunk_size:
            return


async def _iter_first_scored(
    engine: AsyncEngine,
    lo: datetime | None,
    hi: datetime | None,
    where: Sequence[sa.ColumnElement[bool]],
    key_id: str | None,
    chunk_size: int,
    stats: ExportStats | None,
) -> AsyncIterator[list[dict[str, Any]]]:
    """The records of the requests matching ``where`` whose first feedback reached the
    database in ``[lo, hi)``, in that order: a page of such first feedback rows at a time
    (by ``ix_feedback_logged_at``), so the cost of a page does not grow with the window."""
    first = _first_feedback_in(lo, hi, key_id)
    columns = [c for c in requests.c]
    after: tuple[datetime, int] | None = None
    logged, fid = first.selected_columns.logged_at, first.selected_columns.id
    while True:
        page = first
        if after is not None:
            page = page.where(
                feedback.c.logged_at >= after[0],
                sa.or_(
                    feedback.c.logged_at > after[0],
                    sa.and_(feedback.c.logged_at == after[0], feedback.c.id > after[1]),
                ),
            )
        page = page.order_by(logged, fid).limit(chunk_size)
        async with engine.connect() as conn:
            marks = (await conn.execute(page)).all()
            if not marks:
                return
            answers = [m.answer for m in marks]
            found = await conn.execute(
                sa.select(*columns).where(*where, requests.c.request_id.in_(answers))
            )
            by_id = {r.request_id: dict(r._mapping) for r in found}
            rows = [by_id[a] for a in dict.fromkeys(answers) if a in by_id]
            chunk = await _records_of(conn, rows, key_id, False, stats) if rows else []
        after = (marks[-1].logged_at, marks[-1].id)
        if chunk:
            yield chunk
        if len(marks) < chunk_size:
            return


async def _records_of(
    conn: AsyncConnection,
    rows: list[dict[str, Any]],
    key_id: str | None,
    include_unscored: bool,
    stats: ExportStats | None,
    feedback_until: datetime | None = None,
) -> list[dict[str, Any]]:
    """The outcome records of these request rows, with their calls and feedback (theirs and
    their cache hits', that reached the database before ``feedback_until``); counted in
    ``stats``."""
    ids = [r["request_id"] for r in rows]
    in_time = (
        []
        if feedback_until is None
        else [sa.func.coalesce(feedback.c.logged_at, feedback.c.created_at) < feedback_until]
    )
    call_rows = await conn.execute(
        sa.select(calls)
        .where(calls.c.request_id.in_(ids))
        .order_by(calls.c.request_id, calls.c.seq)
    )
    fb_rows = await conn.execute(
        sa.select(feedback)
        .where(feedback.c.request_id.in_(ids), *in_time)
        .order_by(feedback.c.request_id, feedback.c.created_at, feedback.c.id)
    )
    by_call: dict[str, list[dict[str, Any]]] = {}
    for c in call_rows:
        by_call.setdefault(c.request_id, []).append(dict(c._mapping))
    # Feedback given on a cache hit scores the very answer this request bought: it is this
    # request's too (else scores of popular prompts, answered from the cache, would never
    # reach training).
    # In two steps, each by its index (the hits by ix_requests_cached_from, their feedback
    # by ix_feedback_request_id): as one join, PostgreSQL hashes the hits and scans the
    # whole feedback table for every page.
    hits = sa.select(requests.c.request_id, requests.c.cached_from).where(
        requests.c.cached_from.in_(ids)
    )
    if key_id is not None:
        # A key's export holds that key's feedback only (with a global cache, other keys'
        # hits reuse its answers too).
        hits = hits.where(requests.c.key_id == key_id)
    answer_of = {h.request_id: h.cached_from for h in await conn.execute(hits)}
    by_fb: dict[str, list[dict[str, Any]]] = {}
    for f in fb_rows:
        by_fb.setdefault(f.request_id, []).append(dict(f._mapping))
    if answer_of:
        hit_fb_rows = await conn.execute(
            sa.select(feedback).where(feedback.c.request_id.in_(list(answer_of)), *in_time)
        )
        for f in hit_fb_rows:
            by_fb.setdefault(answer_of[f.request_id], []).append(dict(f._mapping))
    for given in by_fb.values():
        given.sort(key=lambda f: (f["created_at"], f["id"]))  # the latest one counts
    chunk = [
        rec
        for r in rows
        if (
            rec := build_record(
                r,
                by_call.get(r["request_id"], []),
                by_fb.get(r["request_id"], []),
                include_unscored,
                stats,
            )
        )
        is not None
    ]
    if stats is not None:
        stats.records += len(chunk)
        stats.failures += sum(
            1 for rec in chunk if any(o.get("failed") for o in rec["outcomes"].values())
        )
    return chunk


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
) -> int:
    """How many feedback rows reached the database in ``[since, until)`` for requests that
    had reached it before ``since``: scores an incremental export's earlier windows could
    not carry (a request is exported with the feedback it has when its window closes, and
    an unscored one is skipped), and that this window does not carry either. Feedback on a
    cache hit counts for the request whose answer it reused, as the export attributes it.
    Feedback rows from before ``feedback.logged_at`` (migration 13) are not counted.

    With ``scored`` (windows by first feedback), the late ones are instead the scores of
    requests first scored in an earlier window: re-scores, which no export carries."""
    lo, hi = to_utc(since), to_utc(until)
    assert lo is not None and hi is not None
    hit = requests.alias("scored")  # the request the feedback was given on
    answered = _answered(hit)
    logged = feedback.c.logged_at
    joined = feedback.join(hit, hit.c.request_id == feedback.c.request_id)
    where = [logged.is_not(None), logged >= lo, logged < hi]
    if scored:
        where.append(_scored_before(answered, lo, key_id))
    else:
        original = requests.alias("original")
        joined = joined.join(original, original.c.request_id == answered)
        where.append(sa.func.coalesce(original.c.logged_at, original.c.created_at) < lo)
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
) -> int:
    """How many requests (cache hits aside, as the export leaves them out) reached the
    database at or after ``after``, a logged window's end: the ones a later window holds,
    which an export that wrote nothing must name, or the user cannot tell why. One COUNT by
    ``ix_requests_logged_at``; rows without ``logged_at`` are older than any window's end."""
    lo = to_utc(after)
    query = sa.select(sa.func.count()).where(
        *request_filters(since, until, key_id),
        requests.c.logged_at >= lo,
        requests.c.cached_from.is_(None),
    )
    async with engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())
