"""Which requests an export holds, in what order, in pages: the ledger's side of
``xrouter export``.

An export selects requests by when they were served (``since``/``until`` on ``created_at``)
or, for incremental pipelines, by when their rows reached the database (``logged_since``/
``logged_until`` on ``requests.logged_at``, which the database stamps at insert): rows are
written late — batched, or replayed from a journal hours later with their original
``created_at`` — and only the second kind of window is sure to catch them. The command line
(``gateway.ledger.export_cli``) ends such a window a settle time behind the database's clock
(``gateway.ledger.export_bounds.safe_logged_until``), so that writes still in flight commit
before it, and keeps its end in a cursor file. Windows by when requests were first *scored*
(``scored=True``) page ``feedback.logged_at`` instead. Each page of requests becomes records
through ``gateway.ledger.export_feedback.records_of``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.export_feedback import first_feedback_in, records_of, time_range
from gateway.ledger.export_records import ExportStats
from gateway.ledger.schema import calls, feedback, requests
from gateway.ledger.spend import TimeBound, request_filters, to_utc

_CHUNK = 500


def exported_requests(
    since: TimeBound = None, until: TimeBound = None, key_id: str | None = None
) -> list[sa.ColumnElement[bool]]:
    """WHERE clauses on ``requests`` (the table itself, not an alias) selecting the requests
    an export may hold: served in ``[since, until)``, of ``key_id``, answered or with a
    failed call, not answered from the cache. The paging and the counts of what falls
    outside a window (``gateway.ledger.export_bounds``) share them, so that an export never
    counts as waiting, or as scored late, a request it would not export."""
    failed_call = sa.exists().where(
        calls.c.request_id == requests.c.request_id,
        calls.c.role == "downstream",
        calls.c.status == "error",
    )
    return [
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
    committed (see ``gateway.ledger.export_bounds.safe_logged_until``). Both pairs may be
    given: they combine.

    With ``scored``, ``logged_since``/``logged_until`` bound instead when a request's
    *first* feedback reached the database (``feedback.logged_at``; feedback on a cache hit
    counts for the request whose answer it reused): consecutive windows hold every scored
    request exactly once, in the window it was first scored in, with the feedback it has
    when exported — however long after it was served. Unscored requests are not in any
    such window; feedback from before ``feedback.logged_at`` (migration 13) starts none.
    """
    if scored and include_unscored:
        raise ValueError("an export of scored windows holds scored requests only")
    base = exported_requests(since, until, key_id)
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
                [*base, logged_at.is_(None), *time_range(requests.c.created_at, lo, hi)],
            ),
            # Every other row, by ix_requests_logged_at.
            (logged_at, [*base, logged_at.is_not(None), *time_range(logged_at, lo, hi)]),
        ]
    # A request is exported with the feedback it had when its window closed: feedback that
    # came after is late (``export_bounds.count_late_feedback`` says so in the next window),
    # and a window exported again gives the same records.
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
            chunk = await records_of(conn, rows, key_id, include_unscored, stats, feedback_until)
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
    first = first_feedback_in(lo, hi, key_id)
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
            chunk = await records_of(conn, rows, key_id, False, stats) if rows else []
        after = (marks[-1].logged_at, marks[-1].id)
        if chunk:
            yield chunk
        if len(marks) < chunk_size:
            return
