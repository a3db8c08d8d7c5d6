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

from gateway.echo import echo
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
# values of its group_by columns) with the group_by it was made under, base64url JSON so that
# it travels as one query value. The rows are ordered by group, None first, then by value in
# byte (code point) order — the database orders and pages them (``spend_report``'s ``after``
# and ``limit``) — so "after" is a position, not a row that has to exist: a group that appears
# between two pages (a new key, a new day) lands on its page, and a cursor stays valid however
# the ledger grows. The filters (since, until, key, user, tag) change which groups there are,
# as the ledger growing does, not the order, so a cursor is not tied to them; group_by (its
# names and their order) is the order, so a cursor made under another one names a place in a
# different order — a user compared with days — and is refused rather than read as one.
SpendGroup = list[str | None]

_CURSOR_HELP = "after must be the last_id of a previous page of this report, with the same group_by"


def _spend_cursor(row: dict[str, Any], fields: list[str], group_by: list[str]) -> str:
    group = [None if row[f] is None else str(row[f]) for f in fields]
    cursor = {"group_by": group_by, "group": group}
    return base64.urlsafe_b64encode(orjson.dumps(cursor)).decode().rstrip("=")


def _is_group(value: object, width: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == width
        and all(v is None or isinstance(v, str) for v in value)
    )


def _spend_cursor_group(cursor: str | None, group_by: list[str]) -> SpendGroup | None:
    """The group a cursor (a previous page's ``last_id``) names, for a report grouped by
    ``group_by``; a 400 naming ``after`` for anything else."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = orjson.loads(raw)
    except ValueError:  # not base64 or not JSON (both errors are ValueErrors)
        decoded = None
    if isinstance(decoded, list) and _is_group(decoded, len(decoded)):
        # A cursor as gateways made them until 2026-11-29: the group alone. Which group_by
        # it was made under is lost, and a group of one grouping is a place in another's
        # order too (a user among days), so it cannot be told from a cursor of this report.
        raise bad_request(
            "after is a cursor from an earlier release of the gateway, which does not say "
            "which group_by it was made under: page the report again from its first page "
            "(without after)",
            param="after",
        )
    if not isinstance(decoded, dict) or set(decoded) != {"group_by", "group"}:
        raise bad_request(_CURSOR_HELP, param="after")
    made_under, group = decoded["group_by"], decoded["group"]
    if not isinstance(made_under, list) or not all(isinstance(g, str) for g in made_under):
        raise bad_request(_CURSOR_HELP, param="after")
    if made_under != group_by:
        raise bad_request(
            f"after is a cursor of the report grouped by {','.join(made_under) or '(nothing)'}, "
            f"not of this one, grouped by {','.join(group_by) or '(nothing)'}: send the "
            "group_by it was made under, or page this report from its first page (without after)",
            param="after",
        )
    if not _is_group(group, len(group_by)):
        raise bad_request(_CURSOR_HELP, param="after")
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
            f"group_by accepts {', '.join(GROUP_BY_CHOICES)}; got {echo(bad)}", param="group_by"
        )
    # The rows' names for their groups: grouped by key, a row says key_id.
    fields = ["key_id" if g == "key" else g for g in group_by]
    limit = page_limit(q.get("limit"))
    after = _spend_cursor_group(q.get("after"), group_by)
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
            "first_id": _spend_cursor(rows[0], fields, group_by) if rows else None,
            "last_id": _spend_cursor(rows[-1], fields, group_by) if rows else None,
            "has_more": has_more,
        }
    )
