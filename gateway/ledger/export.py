"""Ledger -> outcome table (JSONL or Parquet): logged traffic for off-policy training.

One record per successful request, with *partial feedback*: only the action the policy took
has an outcome (its latest feedback score, its cost and tokens), and ``logged`` says which
action it was and with which probability (``propensity``), which is what off-policy
estimators need. Every JSONL line parses with ``router.outcomes.parse_record``.

A request whose chosen model *failed* (an error, a timeout, a refusal of the input; not a
stream its client hung up on) is exported too, answered or not: its outcome is that call's,
with score 0 and ``"failed": true``, whatever a fallback then answered. Leaving such
requests out (or folding them into the fallback's trajectory, which single-model learners
skip) would show each model's outcomes without its failures, and off-policy estimates
would overrate unreliable models.

The outcome is keyed by the logged action (the decision's first action, falling back to the
model that answered). They differ only when a fallback answered for the chosen model; the
record then still says what happened when *that action* was taken, and the outcome's
``model`` field names the model that actually answered. A request that made several calls
(a cascade's plan) also lists them in ``logged.actions``: its outcome is the trajectory's,
and the single-model off-policy learners and estimators skip it. Requests answered from the
answer cache (``requests.cached_from``) are not exported: no decision, no cost.

Parquet is a flat table (one row per record; layout in ``router.export_parquet``, which the
outcome-table reader shares) that analytics tools read directly; :func:`read_export` turns
either format back into ``OutcomeRecord``s.

An export selects requests by when they were served (``since``/``until`` on ``created_at``)
or, for incremental pipelines, by when their rows reached the database (``logged_since``/
``logged_until`` on ``requests.logged_at``, which the database stamps at insert): rows are
written late — batched, or replayed from a journal hours later with their original
``created_at`` — and only the second kind of window is sure to catch them. The command line
(``gateway.ledger.export_cli``) ends such a window a settle time behind the database's clock
(:func:`safe_logged_until`), so that writes still in flight commit before it, and keeps its
end in a cursor file.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.ledger.schema import calls, feedback, ledger_now, requests
from gateway.ledger.spend import TimeBound, request_filters, to_utc
from pricing import micros_to_usd
from router.export_parquet import flatten, parquet_schema, read_parquet_records
from router.outcomes import OutcomeRecord

logger = logging.getLogger(__name__)

ExportFormat = Literal["jsonl", "parquet"]
_CHUNK = 500


@dataclass
class ExportStats:
    """What an export wrote and what it left out."""

    records: int = 0
    # Successful requests without feedback, skipped unless ``include_unscored``.
    unscored_skipped: int = 0
    # Records of a chosen model's failed call (score 0; counted in ``records`` too).
    failures: int = 0
    # Requests whose policy could not say how likely its choice was (the ``llm`` router
    # sampling at temperature > 0): without a propensity they are no off-policy data.
    unknown_propensity: int = 0


_CALL_FIELDS = (
    "turn",
    "role",
    "model",
    "status",
    "error_type",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost_micros",
    "latency_ms",
    "attempts",
    "fallback_from",
    # Which of the model's deployments (pool ``deployments:``) served the call, if several.
    "deployment",
)


# -- building records -----------------------------------------------------------------


def _propensity(decision: dict[str, Any] | None, first_only: bool = False) -> float | None:
    """The probability the policy gave its whole action sequence (or, ``first_only``, its
    first action); 1.0 for a request that named its model (no decision was made). None when
    unknown or invalid."""
    if not decision:
        return 1.0
    props = decision.get("propensities")
    p = decision.get("propensity")
    if first_only and props:
        p = props[0]
    elif p is None:
        # An unknown propensity (null: a sampling LLM router) makes the whole one unknown.
        if not props or any(q is None for q in props):
            return None
        p = math.prod(float(q) for q in props)
    if p is None:
        return None
    p = float(p)
    if not math.isfinite(p) or p <= 0.0:
        return None
    return min(p, 1.0)  # a product of floats can overshoot 1 by an ulp


# A call that was never made tells nothing about the model: refused by a budget, or skipped
# while its circuit breaker was open.
_NOT_CALLED = frozenset({"budget", "circuit_open"})


# The status of a request whose client went away before its answer was complete.
_CLIENT_CLOSED = 499


def _first_call_failure(
    call_rows: Sequence[dict[str, Any]], action: str, status: int
) -> dict[str, Any] | None:
    """The first downstream call, when it was the logged action's and it failed: its row,
    or, when a configured fallback answered in its place (the row then names the fallback,
    with ``fallback_from``), the failure's own share of it, which is nothing."""
    downstream = [c for c in call_rows if c["role"] == "downstream"]
    if not downstream:
        return None
    first = downstream[0]
    if first.get("fallback_from") == action and first["model"] != action:
        return {
            "cost_micros": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "latency_ms": 0.0,
            "error_type": "fell_back",
        }
    if status == _CLIENT_CLOSED and first is downstream[-1] and first["error_type"] == "connection":
        # The client hung up on the stream it was reading (a chat UI's "stop generating"):
        # the call is logged as cut before its usage, but the model did not fail.
        return None
    if first["model"] != action or first["status"] != "error" or first["error_type"] in _NOT_CALLED:
        return None
    return first


def _action(decision: dict[str, Any] | None, final_model: str) -> str:
    actions = (decision or {}).get("actions") or []
    if actions and isinstance(actions[0], str) and actions[0]:
        return str(actions[0])
    return final_model


def build_record(
    row: dict[str, Any],
    call_rows: Sequence[dict[str, Any]],
    feedback_rows: Sequence[dict[str, Any]],
    include_unscored: bool = False,
    stats: ExportStats | None = None,
) -> dict[str, Any] | None:
    """The outcome-table record of one logged request (``feedback_rows`` oldest first), or
    None when it has no feedback and unscored records are not wanted, when its policy's
    propensity is unknown, or when it is a failed request whose chosen model did not fail
    (nothing to learn about that model). ``stats`` counts the records left out, by why."""
    decision = row["decision"] if isinstance(row["decision"], dict) else None
    content = row["content"] if isinstance(row["content"], dict) else None
    final_model: str | None = row["final_model"]
    action = _action(decision, final_model or "")
    failed = _first_call_failure(call_rows, action, int(row["status"])) if action else None
    if failed is not None:
        score: float | None = 0.0
    elif final_model is None or not 200 <= int(row["status"]) < 300:
        return None
    else:
        score = feedback_rows[-1]["score"] if feedback_rows else None
        if score is None and not include_unscored:
            if stats is not None:
                stats.unscored_skipped += 1
            return None
    # A failure's record is its first decision's: the steps after it (a failover) were
    # forced by the failure, not chosen.
    propensity = _propensity(decision, first_only=failed is not None)
    if propensity is None:
        if stats is not None:
            stats.unknown_propensity += 1
        return None

    record: dict[str, Any] = {"id": row["request_id"]}
    response = None
    if content is not None and content.get("messages"):
        record["messages"] = content["messages"]
        response = content.get("response")
        record["content_logged"] = "full"
    elif content is not None and content.get("prompt_sha256"):
        record["prompt"] = f"[content not logged; prompt_sha256={content['prompt_sha256']}]"
        record["prompt_sha256"] = content["prompt_sha256"]
        record["content_logged"] = "hash"
    else:
        record["prompt"] = "[content not logged]"
        record["content_logged"] = "none"

    outcome: dict[str, Any] = {}
    if score is not None:
        outcome["score"] = float(score)
    # The chosen model's failure is its call alone, not what a fallback bought after it;
    # an answered request's outcome is the whole request's.
    source = failed if failed is not None else {**row, "cost_micros": row["total_cost_micros"]}
    cost = int(source["cost_micros"])
    outcome.update(
        cost_usd=micros_to_usd(cost),
        cost_micros=cost,
        prompt_tokens=int(source["prompt_tokens"]),
        completion_tokens=int(source["completion_tokens"]),
        latency_ms=float(source["latency_ms"]),
        model=action if failed is not None else final_model,
    )
    if failed is not None:
        outcome.update(failed=True, error_type=failed["error_type"])
    elif response is not None:
        outcome["response"] = response
    record["outcomes"] = {action: outcome}
    if score is None:
        record["scored"] = False  # needs a score (e.g. a judge) before training

    record["logged"] = {
        "action": action,
        "propensity": propensity,
        "cost_weight": row["cost_weight"],
        "policy": row["policy"],
    }
    checkpoint = (decision or {}).get("checkpoint")
    if checkpoint:
        record["logged"]["checkpoint"] = str(checkpoint)  # which deployed router decided
    actions = (decision or {}).get("actions") or []
    if len(actions) > 1 and failed is None:
        # A multi-call trajectory (a cascade's plan): its outcome is not ``action``'s
        # alone, and off-policy learners over single models must know to skip it.
        record["logged"]["actions"] = [str(a) for a in actions]
    record["created_at"] = row["created_at"].isoformat()
    if row.get("logged_at") is not None:
        # When the row reached the database (absent for rows from before migration 11).
        record["logged_at"] = row["logged_at"].isoformat()
    record.update(
        key_id=row["key_id"],
        policy=row["policy"],
        requested_model=row["requested_model"],
        router_cost_micros=int(row["router_cost_micros"]),
        downstream_cost_micros=int(row["downstream_cost_micros"]),
        calls=[{f: c[f] for f in _CALL_FIELDS} for c in call_rows],
        feedback=[
            {
                "score": float(f["score"]),
                "source": f["source"],
                "comment": f["comment"],
                "created_at": f["created_at"].isoformat(),
                "request_id": f["request_id"],
            }
            for f in feedback_rows
        ],
    )
    return record


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
    for order, where in passes:
        async for chunk in _iter_pass(
            engine, order, where, key_id, include_unscored, chunk_size, stats
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
) -> AsyncIterator[list[dict[str, Any]]]:
    """The records of the requests matching ``where``, by (``order``, request_id)."""
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
            chunk = await _records_of(conn, rows, key_id, include_unscored, stats)
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
) -> list[dict[str, Any]]:
    """The outcome records of these request rows, with their calls and feedback (theirs and
    their cache hits'); counted in ``stats``."""
    ids = [r["request_id"] for r in rows]
    call_rows = await conn.execute(
        sa.select(calls)
        .where(calls.c.request_id.in_(ids))
        .order_by(calls.c.request_id, calls.c.seq)
    )
    fb_rows = await conn.execute(
        sa.select(feedback)
        .where(feedback.c.request_id.in_(ids))
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
            sa.select(feedback).where(feedback.c.request_id.in_(list(answer_of)))
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


# -- writing and reading --------------------------------------------------------------


class _JsonlSink:
    def __init__(self, path: Path) -> None:
        self._fh = path.open("wb")

    def write(self, records: list[dict[str, Any]]) -> None:
        self._fh.write(b"".join(orjson.dumps(r) + b"\n" for r in records))

    def close(self) -> None:
        # Twice when the output cannot be put in place: the second (discarding) call must
        # not hide the first error behind "flush of closed file".
        if self._fh.closed:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


class _ParquetSink:
    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self._schema = parquet_schema()
        self._writer = pq.ParquetWriter(str(path), self._schema, compression="zstd")

    def write(self, records: list[dict[str, Any]]) -> None:
        import pyarrow as pa

        table = pa.Table.from_pylist([flatten(r) for r in records], schema=self._schema)
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()


async def export_ledger(
    engine: AsyncEngine,
    out_path: str | os.PathLike[str],
    fmt: ExportFormat = "jsonl",
    since: TimeBound = None,
    until: TimeBound = None,
    key_id: str | None = None,
    include_unscored: bool = False,
    stats: ExportStats | None = None,
    *,
    logged_since: TimeBound = None,
    logged_until: TimeBound = None,
    scored: bool = False,
) -> int:
    """Write the outcome table of the logged traffic; return the number of records.

    Requests without feedback are skipped unless ``include_unscored`` (their outcome then
    has no ``score`` and the record says ``"scored": false``; they must be scored before
    they load as an outcome table); ``stats`` counts them. ``since``/``until`` bound when
    requests were served, ``logged_since``/``logged_until`` when their rows reached the
    database — or, with ``scored``, when they were first scored (see
    :func:`iter_export_records`). The file appears atomically when complete.
    """
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"unknown export format {fmt!r}")
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    await asyncio.to_thread(out.parent.mkdir, parents=True, exist_ok=True)
    sink: _JsonlSink | _ParquetSink
    if fmt == "parquet":
        sink = await asyncio.to_thread(_ParquetSink, tmp)
    else:
        sink = await asyncio.to_thread(_JsonlSink, tmp)
    n = 0
    try:
        async for chunk in iter_export_records(
            engine,
            since,
            until,
            key_id,
            include_unscored,
            stats=stats,
            logged_since=logged_since,
            logged_until=logged_until,
            scored=scored,
        ):
            await asyncio.to_thread(sink.write, chunk)
            n += len(chunk)
        await asyncio.to_thread(sink.close)
        await asyncio.to_thread(os.replace, tmp, out)
    except BaseException:
        await asyncio.to_thread(_discard, sink, tmp)
        raise
    logger.info("exported %d ledger records to %s", n, out)
    return n


def _discard(sink: _JsonlSink | _ParquetSink, tmp: Path) -> None:
    try:
        sink.close()
    finally:
        tmp.unlink(missing_ok=True)


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


def read_export(path: str | os.PathLike[str], skip_unscored: bool = True) -> list[OutcomeRecord]:
    """Load an export (``.parquet`` or JSONL) as outcome records. Blocking; for offline
    tools and training, not the request path."""
    p = Path(path)
    if p.suffix == ".parquet":
        rows = read_parquet_records(p)
    else:
        rows = [orjson.loads(line) for line in p.read_bytes().splitlines() if line.strip()]
    return [
        OutcomeRecord.model_validate(r)
        for r in rows
        if not (skip_unscored and r.get("scored") is False)
    ]


# -- CLI: xrouter export ----------------------------------------------------------------
