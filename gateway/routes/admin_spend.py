"""``GET /admin/spend``: spend per group (key, model, policy, day, api, user, tag), read
from the ledger and paged in the database, as ``GET /admin/keys`` pages keys."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from typing import Any, cast

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.errors import bad_request
from gateway.ledger.spend import (
    GROUP_BY_CHOICES,
    TIME_BOUND_FORMS,
    GroupBy,
    parse_time_bound,
    spend_report,
)
from gateway.openapi import Param, query
from gateway.response_models import SpendReport
from gateway.routes.admin import PAGE_PARAMS, admin_services, json_response, page_limit
from gateway.routes.ledger_read import ledger_read

router = APIRouter(prefix="/admin")


def _time(v: str | None, name: str) -> dt.datetime | None:
    if not v:
        return None
    try:
        return parse_time_bound(v)
    except ValueError:
        raise bad_request(f"{name} must be {TIME_BOUND_FORMS}", param=name) from None


# Spend rows are groups, not records with ids: a page's cursor is its last row's group (the
# values of its group_by columns, base64url JSON so that it travels as one query value). The
# rows are ordered by group, None first, then by value in byte (code point) order — the
# database orders and pages them (``spend_report``'s ``after`` and ``limit``) — so "after" is
# a position, not a row that has to exist: a group that appears between two pages (a new key,
# a new day) lands on its page, and a cursor stays valid however the ledger grows.
SpendGroup = list[str | None]


def _spend_cursor(row: dict[str, Any], fields: list[str]) -> str:
    group = [None if row[f] is None else str(row[f]) for f in fields]
    return base64.urlsafe_b64encode(orjson.dumps(group)).decode().rstrip("=")


def _spend_cursor_group(cursor: str | None, width: int) -> SpendGroup | None:
    """The group a cursor (a previous page's ``last_id``) names, for rows of ``width``
    groups."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        group = orjson.loads(raw)
    except ValueError:  # not base64 or not JSON (both errors are ValueErrors)
        group = None
    if (
        not isinstance(group, list)
        or len(group) != width
        or not all(v is None or isinstance(v, str) for v in group)
    ):
        raise bad_request(
            "after must be the last_id of a previous page of this report, with the same group_by",
            param="after",
        )
    return cast(SpendGroup, group)


@router.get(
    "/spend",
    response_model=SpendReport,
    openapi_extra=query(
        Param("group_by", {"type": "string"}, "comma-separated: " + ", ".join(GROUP_BY_CHOICES)),
        Param("since", {"type": "string"}, "ISO-8601 date or time, or epoch seconds"),
        Param("until", {"type": "string"}, "ISO-8601 date or time, or epoch seconds"),
        Param("key", {"type": "string"}, "only this key id"),
        Param("user", {"type": "string"}, "only this end user"),
        Param("tag", {"type": "string"}, "only requests with this tag"),
        *PAGE_PARAMS,
    ),
)
@ledger_read
async def spend(request: Request) -> Response:
    """Spend per group, a page at a time as ``GET /admin/keys`` pages: ``limit`` (100, at most
    1000) groups, ``after`` the previous page's ``last_id``, ``has_more``."""
    s = await admin_services(request)
    q = request.query_params
    # Order kept, repeats dropped: the answer echoes the grouping the rows are keyed by.
    group_by = list(dict.fromkeys(g.strip() for g in (q.get("group_by") or "key").split(",")))
    group_by = [g for g in group_by if g]
    bad = [g for g in group_by if g not in GROUP_BY_CHOICES]
    if bad:
        raise bad_request(
            f"group_by accepts {', '.join(GROUP_BY_CHOICES)}; got {bad}", param="group_by"
        )
    # The rows' names for their groups: grouped by key, a row says key_id.
    fields = ["key_id" if g == "key" else g for g in group_by]
    limit = page_limit(q.get("limit"))
    after = _spend_cursor_group(q.get("after"), len(fields))
    since, until = _time(q.get("since"), "since"), _time(q.get("until"), "until")
    # Shielded: a read given up on (ledger.read_timeout_s) must not cancel the flush.
    await asyncio.shield(s.ledger_writer().flush())
    # The page and one row more, to know whether there is a next page.
    rows = await spend_report(
        s.ledger_engine(),
        cast(list[GroupBy], group_by),
        since=since,
        until=until,
        key_id=q.get("key"),
        end_user=q.get("user"),
        tag=q.get("tag"),
        after=after,
        limit=limit + 1,
    )
    has_more, rows = len(rows) > limit, rows[:limit]
    return json_response(
        {
            "object": "list",
            "group_by": group_by,
            "data": rows,
            "first_id": _spend_cursor(rows[0], fields) if rows else None,
            "last_id": _spend_cursor(rows[-1], fields) if rows else None,
            "has_more": has_more,
        }
    )
