"""Which feedback scores an exported request, and which feedback row first scored it.

Feedback given on a cache hit scores the very answer the hit reused: it is the request's
that bought that answer too (else scores of popular prompts, answered from the cache, would
never reach training), and a ``--key`` export counts that key's own feedback only. The
paging (``gateway.ledger.export_windows``) and the counts of what falls outside a window
(``gateway.ledger.export_bounds``) select by these rules; :func:`records_of` turns a page
of request rows into records with their calls and that feedback.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.ledger.export_records import ExportStats, build_record
from gateway.ledger.schema import calls, feedback, requests


def time_range(
    column: sa.ColumnElement[datetime], lo: datetime | None, hi: datetime | None
) -> list[sa.ColumnElement[bool]]:
    """``column`` in ``[lo, hi)``, either bound left open when None."""
    clauses: list[sa.ColumnElement[bool]] = []
    if lo is not None:
        clauses.append(column >= lo)
    if hi is not None:
        clauses.append(column < hi)
    return clauses


def answered(scored: Any) -> sa.ColumnElement[str]:
    """The request whose answer feedback on ``scored`` (an alias of ``requests``) scores:
    itself, or for a cache hit the request whose answer it reused."""
    return sa.func.coalesce(scored.c.cached_from, scored.c.request_id)


def scored_before(
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


def first_feedback_in(
    lo: datetime | None, hi: datetime | None, key_id: str | None
) -> sa.Select[Any]:
    """The feedback rows logged in ``[lo, hi)`` that are the first feedback of the request
    they score (``answer``: the request itself, or for a cache hit the request whose answer
    it reused): no feedback of that request came before, by (logged time, id). Each scored
    request has exactly one, so consecutive windows hold it once, however often it is
    scored. With ``key_id``, only that key's feedback counts."""
    scored = requests.alias("scored")
    answer = answered(scored)
    logged = feedback.c.logged_at
    query = (
        sa.select(answer.label("answer"), logged.label("logged_at"), feedback.c.id)
        .select_from(feedback.join(scored, scored.c.request_id == feedback.c.request_id))
        .where(logged.is_not(None), *time_range(logged, lo, hi))
        .where(~scored_before(answer, logged, key_id, feedback.c.id))
    )
    if key_id is not None:
        query = query.where(scored.c.key_id == key_id)
    return query


async def records_of(
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
