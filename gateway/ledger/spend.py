"""Spend reports over the ledger, computed by the database.

Every figure is a sum of integer micro-USD, so a report reconciles exactly: the rows of any
grouping by key/policy/day add up to ``sum(requests.total_cost_micros)``, and the rows of a
grouping that includes ``model`` (which reads the per-call costs) add up to
``sum(calls.cost_micros)``. The gateway keeps the two equal by charging a request the sum of
its calls. USD figures are derived from the micros at the end, for display.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.echo import echo
from gateway.ledger.schema import api_keys, calls, feedback, request_tags, requests, utc_day
from pricing import micros_to_usd

GroupBy = Literal["key", "model", "policy", "day", "api", "user", "tag"]
GROUP_BY_CHOICES: tuple[str, ...] = get_args(GroupBy)
TimeBound = datetime | float | int | str | None

# Output name of each grouping column.
_GROUP_FIELD = {
    "key": "key_id",
    "model": "model",
    "policy": "policy",
    "day": "day",
    "api": "api",
    "user": "user",
    "tag": "tag",
}
_MONEY = ("total_cost_micros", "router_cost_micros", "downstream_cost_micros")


def to_utc(value: TimeBound) -> datetime | None:
    """A report bound: an aware or naive (taken as UTC) datetime, epoch seconds, or an ISO
    8601 string (``2025-01-31``, ``2025-01-31T12:00:00Z``)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("a time bound can't be a bool")
    # A bound whose UTC time falls outside years 1-9999 (an epoch of 1e20, or 9999-12-31T23:00
    # at UTC-5) is a caller's bad value: a ValueError the API turns into a 400, not the
    # OverflowError datetime raises.
    try:
        if isinstance(value, int | float):
            return datetime.fromtimestamp(value, tz=UTC)
        if isinstance(value, str):
            value = datetime.fromisoformat(value.strip())
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
    except (OverflowError, OSError) as exc:
        raise ValueError(f"time out of range: {echo(value)}") from exc


_EPOCH = re.compile(r"^[+-]?\d+(\.\d+)?$")
TIME_BOUND_FORMS = "an ISO-8601 date or time, or epoch seconds, between years 1 and 9999 UTC"


def parse_time_bound(text: str) -> datetime:
    """A time bound as a person writes it (a query parameter, a command-line option): an
    ISO 8601 date or time (naive: UTC) or epoch seconds, in UTC. ISO first: 8 digits are
    an ISO date (20250131). A ValueError says what it takes (``TIME_BOUND_FORMS``)."""
    value = text.strip()
    try:
        try:
            parsed = to_utc(datetime.fromisoformat(value))
        except ValueError:
            if _EPOCH.match(value) is None:
                raise
            parsed = to_utc(float(value) if "." in value else int(value))
    except ValueError:
        raise ValueError(f"{echo(text)} is not {TIME_BOUND_FORMS}") from None
    assert parsed is not None  # to_utc of a value is one
    return parsed


def request_filters(
    since: TimeBound = None,
    until: TimeBound = None,
    key_id: str | None = None,
    end_user: str | None = None,
    tag: str | None = None,
) -> list[sa.ColumnElement[bool]]:
    """WHERE clauses on ``requests``: ``since`` inclusive, ``until`` exclusive; ``tag``: the
    requests filed under it."""
    clauses: list[sa.ColumnElement[bool]] = []
    lo, hi = to_utc(since), to_utc(until)
    if lo is not None:
        clauses.append(requests.c.created_at >= lo)
    if hi is not None:
        clauses.append(requests.c.created_at < hi)
    if key_id is not None:
        clauses.append(requests.c.key_id == key_id)
    if end_user is not None:
        clauses.append(requests.c.end_user == end_user)
    if tag is not None:
        # An alias of its own: grouped by tag, ``request_tags`` is also in the outer query,
        # and the subquery would correlate it away (a SELECT with no FROM).
        filed = request_tags.alias("filed")
        tagged = sa.select(filed.c.request_id).where(
            filed.c.request_id == requests.c.request_id, filed.c.tag == tag
        )
        clauses.append(tagged.exists())
    return clauses


def _check_groups(group_by: Sequence[str]) -> list[str]:
    groups: list[str] = []
    for g in group_by:
        if g not in GROUP_BY_CHOICES:
            raise ValueError(f"cannot group by {echo(g)}; choose from {GROUP_BY_CHOICES}")
        if g not in groups:
            groups.append(g)
    return groups


def _group_column(name: str) -> sa.ColumnElement[Any]:
    if name == "key":
        return requests.c.key_id
    if name == "policy":
        return requests.c.policy
    if name == "api":
        return requests.c.api
    if name == "user":
        return requests.c.end_user
    if name == "tag":
        return request_tags.c.tag
    if name == "day":
        return utc_day(requests.c.created_at)
    return calls.c.model


def _with_tags(source: sa.FromClause, groups: Sequence[str]) -> sa.FromClause:
    """``source`` with each request's tags beside it when grouping by tag (untagged requests
    kept, under None)."""
    if "tag" not in groups:
        return source
    return source.outerjoin(request_tags, request_tags.c.request_id == requests.c.request_id)


def _sum(col: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    return sa.func.coalesce(sa.func.sum(col), 0)


def _money(row: dict[str, Any]) -> dict[str, Any]:
    for name in _MONEY:
        row[name] = int(row[name])
        row[name.replace("_micros", "_usd")] = micros_to_usd(row[name])
    for name in ("prompt_tokens", "completion_tokens", "requests", "calls"):
        if name in row:
            row[name] = int(row[name])
    return row


def _byte_order(expr: sa.ColumnElement[Any], dialect: str) -> sa.ColumnElement[Any]:
    """``expr`` compared in byte (code point) order: the order of Python's ``str`` and of
    SQLite's default ``BINARY`` collation. PostgreSQL compares text by the database's
    collation, which may follow a language's rules (``en_US``: ``alice`` before ``Bob``), so
    there it is compared under ``COLLATE "C"``."""
    return expr.collate("C") if dialect == "postgresql" else expr


def _group_order(expr: sa.ColumnElement[Any], dialect: str) -> sa.ColumnElement[Any]:
    """An ORDER BY term for a group column: NULL first, then the values in byte order."""
    if dialect == "postgresql":
        return sa.nulls_first(_byte_order(expr, dialect).asc())
    return expr.asc()  # SQLite: NULL sorts before every value


def _after_clause(
    exprs: Sequence[sa.ColumnElement[Any]], after: Sequence[str | None], dialect: str
) -> sa.ColumnElement[bool]:
    """The rows whose group sorts after ``after`` in ``_group_order``'s order: a keyset
    condition, ``g1 > a1 OR (g1 = a1 AND (g2 > a2 OR (g2 = a2 AND ...)))``, with "after None"
    meaning "not NULL" and "equal to None" meaning "NULL" (a row-value comparison would
    need NULL turned into a value, which neither database can then use an index for).

    It is a WHERE clause rather than a HAVING one: the group columns are plain columns (or
    ``utc_day`` of one), so it drops the rows of earlier groups before they are summed."""
    cond: sa.ColumnElement[bool] | None = None
    for expr, value in reversed(list(zip(exprs, after, strict=True))):
        same: sa.ColumnElement[bool] | None
        if value is None:
            later, same = expr.is_not(None), expr.is_(None)
        elif dialect == "postgresql" and "\x00" in value:
            # PostgreSQL's text holds no NUL (nor takes one as a parameter): no group equals
            # this value, and those after it are those after the part before the NUL.
            later, same = _byte_order(expr, dialect) > value.split("\x00", 1)[0], None
        else:
            # Equality needs no collation: a database's default collation is deterministic.
            later, same = _byte_order(expr, dialect) > value, expr == value
        cond = later if cond is None or same is None else sa.or_(later, sa.and_(same, cond))
    if cond is None:
        raise ValueError("a report without groups has no place after another")
    return cond


async def spend_report(
    engine: AsyncEngine,
    group_by: Sequence[GroupBy],
    since: TimeBound = None,
    until: TimeBound = None,
    key_id: str | None = None,
    end_user: str | None = None,
    tag: str | None = None,
    *,
    after: Sequence[str | None] | None = None,
    limit: int | None = None,
    costliest_first: bool = False,
) -> list[dict[str, Any]]:
    """Request counts, costs (micros and USD) and tokens per group.

    ``model`` groups the calls (``calls.model``, with the calls' own costs and tokens, and
    ``router``/``downstream`` split by call role); the other groupings read the requests.
    ``day`` is the UTC date; ``user`` the end user a request named (None: none); ``tag``
    each tag a request was filed under (None: untagged) — a request with two tags counts
    in both groups, so tag groups add up to more than the total. With no grouping the
    result is one row of totals. Requests
    that made no call (refused before routing) cost nothing and only appear in the
    request-based groupings.

    Rows are ordered by group: by the first group's value, then the second's, and so on,
    each with None first and the values in byte (code point) order — Python's order for
    ``str``, on both databases. The database orders, pages and limits them: ``after`` (one
    value per grouping, in ``group_by``'s order) keeps the groups that sort after it (a
    place in the order, not a group that has to exist: its condition is on the rows, so the
    rows of earlier groups are not summed), and ``limit`` returns at most that many rows, so
    a page of a report with many groups fetches and holds only that page.
    ``costliest_first`` orders by total cost, most first (ties by group), for a top list
    with ``limit``.
    """
    groups = _check_groups(group_by)
    fields = [_GROUP_FIELD[g] for g in groups]
    if after is not None and len(after) != len(groups):
        raise ValueError(f"after names {len(after)} group values; the report has {len(groups)}")
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    if after is not None and not groups:
        return []  # the one row of totals is at the only place in the order
    dialect = engine.dialect.name
    cols = [_group_column(g).label(f) for g, f in zip(groups, fields, strict=True)]
    where = request_filters(since, until, key_id, end_user, tag)
    if after is not None:
        where.append(_after_clause([_group_column(g) for g in groups], after, dialect))
    if "model" in groups:
        # A call the key's budget refused was never made: no model to count it under.
        where.append(calls.c.status != "refused")
        by_role = {
            role: _sum(sa.case((calls.c.role == role, calls.c.cost_micros), else_=0))
            for role in ("router", "downstream")
        }
        query = sa.select(
            *cols,
            sa.func.count(sa.distinct(calls.c.request_id)).label("requests"),
            sa.func.count().label("calls"),
            _sum(calls.c.cost_micros).label("total_cost_micros"),
            by_role["router"].label("router_cost_micros"),
            by_role["downstream"].label("downstream_cost_micros"),
            _sum(calls.c.prompt_tokens).label("prompt_tokens"),
            _sum(calls.c.completion_tokens).label("completion_tokens"),
        ).select_from(
            _with_tags(calls.join(requests, calls.c.request_id == requests.c.request_id), groups)
        )
    else:
        query = sa.select(
            *cols,
            sa.func.count().label("requests"),
            sa.func.count(requests.c.cached_from).label("cache_hits"),
            _sum(requests.c.total_cost_micros).label("total_cost_micros"),
            _sum(requests.c.router_cost_micros).label("router_cost_micros"),
            _sum(requests.c.downstream_cost_micros).label("downstream_cost_micros"),
            _sum(requests.c.prompt_tokens).label("prompt_tokens"),
            _sum(requests.c.completion_tokens).label("completion_tokens"),
        ).select_from(_with_tags(requests, groups))
    if where:
        query = query.where(*where)
    if cols:
        query = query.group_by(*(_group_column(g) for g in groups))
        if costliest_first:
            query = query.order_by(sa.desc("total_cost_micros"))
        query = query.order_by(*(_group_order(_group_column(g), dialect) for g in groups))
    if limit is not None:
        query = query.limit(limit)
    async with engine.connect() as conn:
        rows = [dict(r._mapping) for r in await conn.execute(query)]
        if "key" in groups:
            # The key's alias beside its id, as operators name keys (None: no key, or one
            # the admin API did not make): looked up for these rows' keys only.
            ids = {r["key_id"] for r in rows if r["key_id"] is not None}
            aliases: dict[str, str] = {}
            if ids:
                found = await conn.execute(
                    sa.select(api_keys.c.key_id, api_keys.c.alias).where(api_keys.c.key_id.in_(ids))
                )
                aliases = {k: a for k, a in found}
            for r in rows:
                r["key_alias"] = aliases.get(r["key_id"])
    return [_money(r) for r in rows]


async def cache_savings(
    engine: AsyncEngine, since: TimeBound = None, until: TimeBound = None
) -> dict[str, Any]:
    """Requests answered from the answer cache, and what their answers cost when first
    bought (the requests they name in ``cached_from``)."""
    original = requests.alias("original")
    query = (
        sa.select(
            sa.func.count().label("cache_hits"),
            _sum(original.c.total_cost_micros).label("saved_micros"),
        )
        .select_from(requests.outerjoin(original, requests.c.cached_from == original.c.request_id))
        .where(requests.c.cached_from.is_not(None), *request_filters(since, until, None))
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).one()
    saved = int(row.saved_micros)
    return {
        "cache_hits": int(row.cache_hits),
        "saved_micros": saved,
        "saved_usd": micros_to_usd(saved),
    }


_REQUEST_FIELDS = [c for c in requests.c if c.name != "content"]


async def get_request(engine: AsyncEngine, request_id: str) -> dict[str, Any] | None:
    """One logged request without its content (the feedback endpoint checks ``key_id``)."""
    query = sa.select(*_REQUEST_FIELDS).where(requests.c.request_id == request_id)
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    return dict(row._mapping) if row is not None else None


async def get_calls(engine: AsyncEngine, request_id: str) -> list[dict[str, Any]]:
    """A logged request's calls (router and downstream), in the order they were made."""
    fields = [c for c in calls.c if c.name not in ("id", "request_id")]
    query = sa.select(*fields).where(calls.c.request_id == request_id).order_by(calls.c.seq)
    async with engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(query)]


async def totals(
    engine: AsyncEngine,
    since: TimeBound = None,
    until: TimeBound = None,
    key_id: str | None = None,
) -> dict[str, Any]:
    """Ledger-wide totals: requests and their costs, calls and their cost, feedback count."""
    where = request_filters(since, until, key_id)
    req_q = sa.select(
        sa.func.count().label("requests"),
        _sum(requests.c.total_cost_micros).label("total_cost_micros"),
        _sum(requests.c.router_cost_micros).label("router_cost_micros"),
        _sum(requests.c.downstream_cost_micros).label("downstream_cost_micros"),
        _sum(requests.c.prompt_tokens).label("prompt_tokens"),
        _sum(requests.c.completion_tokens).label("completion_tokens"),
    ).where(*where)
    call_q = (
        sa.select(
            sa.func.count().label("calls"),
            _sum(calls.c.cost_micros).label("calls_cost_micros"),
        )
        .select_from(calls.join(requests, calls.c.request_id == requests.c.request_id))
        .where(*where)
    )
    fb_q = (
        sa.select(sa.func.count().label("feedback"))
        .select_from(feedback.join(requests, feedback.c.request_id == requests.c.request_id))
        .where(*where)
    )
    async with engine.connect() as conn:
        out = dict((await conn.execute(req_q)).one()._mapping)
        out.update((await conn.execute(call_q)).one()._mapping)
        out.update((await conn.execute(fb_q)).one()._mapping)
    out = _money(out)
    out["calls_cost_micros"] = int(out["calls_cost_micros"])
    out["calls_cost_usd"] = micros_to_usd(out["calls_cost_micros"])
    out["feedback"] = int(out["feedback"])
    return out


# Keys per query in ``budget_spend``: far below every database's bound-parameter limit.
_KEYS_PER_QUERY = 500


async def budget_spend(
    engine: AsyncEngine, key_ids: Sequence[str], since: TimeBound = None
) -> dict[str, int]:
    """What the ledger says each key has spent against its budget since ``since`` (all time
    for None), in micro-USD: every call's cost, router and downstream, as a key's budget
    settles them (see ``router.loop.BudgetGuard``). Keys without rows are left out. Served by
    the ``(key_id, created_at)`` index."""
    lo = to_utc(since)
    out: dict[str, int] = {}
    async with engine.connect() as conn:
        for i in range(0, len(key_ids), _KEYS_PER_QUERY):
            chunk = list(key_ids[i : i + _KEYS_PER_QUERY])
            query = (
                sa.select(requests.c.key_id, _sum(requests.c.total_cost_micros))
                .where(requests.c.key_id.in_(chunk))
                .group_by(requests.c.key_id)
            )
            if lo is not None:
                query = query.where(requests.c.created_at >= lo)
            for key_id, micros in await conn.execute(query):
                if micros:
                    out[key_id] = int(micros)
    return out
