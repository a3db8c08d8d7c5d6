from __future__ import annotations

import base64
import dataclasses
import itertools
import random
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.errors import APIError
from gateway.ledger import spend as spend_module
from gateway.ledger.records import CallRecord, RequestRecord
from gateway.ledger.spend import budget_spend, cache_savings, get_request, spend_report, totals
from gateway.ledger.store import create_ledger_engine, open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.routes import admin_spend as admin_routes
from gateway.settings import LedgerSettings

from .factories import make_request

DAY0 = datetime(2025, 3, 10, tzinfo=UTC).timestamp()
KEYS = ["key_aaaa0001", "key_bbbb0002", None]
POLICIES = ["compact", "llm", "passthrough"]
MODELS = ["gpt-4o-mini", "claude-haiku", "llama-70b"]
USERS = ["alice", "bob", None]
TAGS: list[list[str] | None] = [None, ["search"], ["chat"], ["search", "chat"]]


def dataset() -> list[RequestRecord]:
    rng = random.Random(7)
    out = []
    # Both sides of two UTC midnights, where a local-time "day" would go wrong.
    times = [DAY0 + 86400 - 0.5, DAY0 + 86400 + 0.5, DAY0 + 2 * 86400 - 0.001, DAY0 + 2 * 86400]
    times += [DAY0 + rng.uniform(0, 3 * 86400) for _ in range(56)]
    for i, t in enumerate(times):
        n_calls = rng.randint(1, 3)
        out.append(
            make_request(
                f"req{i:03d}",
                created_at=t,
                key_id=rng.choice(KEYS),
                policy=rng.choice(POLICIES),
                models=tuple(rng.choice(MODELS) for _ in range(n_calls)),
                router_cost=rng.choice([0, rng.randint(1, 999)]),
                status=200 if i % 9 else 502,
                rng=rng,
            )
        )
        out[-1].end_user = rng.choice(USERS)
        out[-1].tags = rng.choice(TAGS)
        if i % 11 == 5:
            # A call the key's budget refused: in the row, never made. It was counted
            # under its model in model groups (twenty times the calls made, on a key
            # spent down by concurrent requests).
            r = out[-1]
            turn = max(c.turn for c in r.calls) + 1
            r.calls.append(
                CallRecord(
                    r.request_id, turn, "downstream", MODELS[0], "refused", "budget",
                    0, 0, 0, 0, 0, 0.0,
                )
            )  # fmt: skip
        if i % 7 == 3:
            # Answered from the answer cache: no call, nothing paid, counted as a hit.
            hit = out[-1]
            hit.calls, hit.cached_from = [], "req000"
            hit.total_cost_micros = hit.router_cost_micros = hit.downstream_cost_micros = 0
            hit.prompt_tokens = hit.completion_tokens = 0
    return out


def expected_report(
    records: Sequence[RequestRecord], groups: Sequence[str]
) -> list[dict[str, Any]]:
    """The same report computed in Python from the records."""
    field = {
        "key": "key_id",
        "policy": "policy",
        "day": "day",
        "model": "model",
        "user": "user",
        "tag": "tag",
    }
    acc: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: defaultdict(int))
    seen: dict[tuple[Any, ...], set[str]] = defaultdict(set)

    def base(r: RequestRecord) -> dict[str, Any]:
        day = datetime.fromtimestamp(r.created_at, UTC).date().isoformat()
        tag = r.tags[0] if r.tags else None  # see by_tag: one tag per record here
        return {"key": r.key_id, "policy": r.policy, "day": day, "user": r.end_user, "tag": tag}

    for r in records:
        if "model" in groups:
            for c in r.calls:
                if c.status == "refused":
                    continue
                k = tuple({**base(r), "model": c.model}[g] for g in groups)
                row = acc[k]
                seen[k].add(r.request_id)
                row["calls"] += 1
                row["total_cost_micros"] += c.cost_micros
                row["router_cost_micros"] += c.cost_micros if c.role == "router" else 0
                row["downstream_cost_micros"] += c.cost_micros if c.role == "downstream" else 0
                row["prompt_tokens"] += c.prompt_tokens
                row["completion_tokens"] += c.completion_tokens
        else:
            k = tuple(base(r)[g] for g in groups)
            row = acc[k]
            row["requests"] += 1
            row["cache_hits"] += r.cached_from is not None
            row["total_cost_micros"] += r.total_cost_micros
            row["router_cost_micros"] += r.router_cost_micros
            row["downstream_cost_micros"] += r.downstream_cost_micros
            row["prompt_tokens"] += r.prompt_tokens
            row["completion_tokens"] += r.completion_tokens
    out = []
    for k, row in acc.items():
        item = {field[g]: v for g, v in zip(groups, k, strict=True)}
        if "key" in groups:
            item["key_alias"] = None  # these keys were not made by the admin API
        item.update(row)
        if "model" in groups:
            item["requests"] = len(seen[k])
        out.append(item)
    return sorted(
        out, key=lambda d: tuple((d[field[g]] is not None, d[field[g]] or "") for g in groups)
    )


def strip_usd(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        for name in ("total", "router", "downstream"):
            assert row.pop(f"{name}_cost_usd") == row[f"{name}_cost_micros"] / 1_000_000
    return rows


@pytest.fixture
async def loaded(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> list[RequestRecord]:
    records = dataset()
    writer = LedgerWriter(engine, make_settings(flush_rows=25))
    await writer.start()
    for r in records:
        writer.submit(r)
    await writer.close()
    return records


GROUPINGS = [
    list(c) for n in range(4) for c in itertools.combinations(["key", "policy", "day", "user"], n)
]


async def test_every_grouping_matches_and_reconciles_to_the_micro_dollar(
    backend: str, ledger_url: str, loaded: list[RequestRecord]
) -> None:
    # Report through a session in a far-from-UTC time zone: days must still be UTC days.
    kwargs = (
        {"connect_args": {"server_settings": {"TimeZone": "Pacific/Kiritimati"}}}
        if backend == "postgresql"
        else {}
    )
    engine = create_ledger_engine(ledger_url, **kwargs)
    try:
        request_total = sum(r.total_cost_micros for r in loaded)
        call_total = sum(c.cost_micros for r in loaded for c in r.calls)
        assert request_total == call_total
        for base in GROUPINGS:
            for groups in (base, [*base, "model"]):
                report = strip_usd(await spend_report(engine, groups))  # type: ignore[arg-type]
                assert report == expected_report(loaded, groups), groups
                assert sum(r["total_cost_micros"] for r in report) == request_total
                assert (
                    sum(r["router_cost_micros"] + r["downstream_cost_micros"] for r in report)
                    == request_total
                )
                if "model" in groups:
                    made = [c for r in loaded for c in r.calls if c.status != "refused"]
                    assert sum(r["calls"] for r in report) == len(made)
                else:
                    assert sum(r["requests"] for r in report) == len(loaded)
        days = [r["day"] for r in await spend_report(engine, ["day"])]
        assert days == ["2025-03-10", "2025-03-11", "2025-03-12"]
    finally:
        await engine.dispose()


def by_tag(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """Each record once per tag it has (once, untagged, without any): how tag groups count."""
    untagged: list[str | None] = [None]
    return [
        dataclasses.replace(r, tags=[t] if t else None)
        for r in records
        for t in (r.tags or untagged)
    ]


async def test_tag_groups_count_a_request_under_each_of_its_tags(
    engine: AsyncEngine, loaded: list[RequestRecord]
) -> None:
    assert any(r.tags and len(r.tags) == 2 for r in loaded) and any(not r.tags for r in loaded)
    for groups in (["tag"], ["tag", "key"], ["day", "tag"], ["tag", "model"]):
        report = strip_usd(await spend_report(engine, groups))  # type: ignore[arg-type]
        assert report == expected_report(by_tag(loaded), groups), groups
    tagged = [r for r in loaded if r.tags and "search" in r.tags]
    only = strip_usd(await spend_report(engine, ["key"], tag="search"))
    assert only == expected_report(tagged, ["key"])
    # Filtered by a tag and grouped by tag: the requests filed under it, under each of
    # their tags (the filter's subquery must not correlate away the grouping's join).
    assert any(len(r.tags or []) == 2 for r in tagged)
    for groups in (["tag"], ["tag", "key"]):
        report = strip_usd(await spend_report(engine, groups, tag="search"))  # type: ignore[arg-type]
        assert report == expected_report(by_tag(tagged), groups), groups
    assert await spend_report(engine, [], tag="nobody-uses-this") == [
        {
            "requests": 0, "cache_hits": 0, "total_cost_micros": 0, "router_cost_micros": 0,
            "downstream_cost_micros": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "total_cost_usd": 0.0, "router_cost_usd": 0.0, "downstream_cost_usd": 0.0,
        }
    ]  # fmt: skip


async def test_filters_and_totals(engine: AsyncEngine, loaded: list[RequestRecord]) -> None:
    since, until = DAY0 + 86400, DAY0 + 2 * 86400
    subset = [r for r in loaded if since <= r.created_at < until and r.key_id == KEYS[0]]
    assert subset
    report = strip_usd(
        await spend_report(
            engine,
            ["policy"],
            since=datetime.fromtimestamp(since, UTC),
            until=until,
            key_id=KEYS[0],
        )
    )
    assert report == expected_report(subset, ["policy"])
    iso = await spend_report(
        engine, [], since="2025-03-11", until="2025-03-12T00:00:00+00:00", key_id=KEYS[0]
    )
    assert iso[0]["total_cost_micros"] == sum(r.total_cost_micros for r in subset)
    # One end user's spend, across keys.
    alices = [r for r in loaded if r.end_user == "alice"]
    assert alices and len({r.key_id for r in alices}) > 1
    by_key = strip_usd(await spend_report(engine, ["key"], end_user="alice"))
    assert by_key == expected_report(alices, ["key"])

    # The dashboard's top list: ranked and cut by the database, costliest first.
    by_user = strip_usd(await spend_report(engine, ["user"]))
    ranked = sorted(by_user, key=lambda r: (-r["total_cost_micros"], r["user"] is not None))
    top = strip_usd(await spend_report(engine, ["user"], limit=2, costliest_first=True))
    assert len(by_user) > 2 and [r["user"] for r in top] == [r["user"] for r in ranked[:2]]
    assert top == ranked[:2]

    t = await totals(engine)
    assert t["requests"] == len(loaded)
    assert (
        t["total_cost_micros"] == t["calls_cost_micros"] == sum(r.total_cost_micros for r in loaded)
    )
    assert t["calls"] == sum(len(r.calls) for r in loaded)
    assert t["router_cost_micros"] + t["downstream_cost_micros"] == t["total_cost_micros"]
    assert t["feedback"] == 0
    empty = await spend_report(engine, ["key"], since=DAY0 + 10 * 86400)
    assert empty == []
    with pytest.raises(ValueError):
        await spend_report(engine, ["team"])  # type: ignore[list-item]


@pytest.mark.parametrize("keys_per_query", [500, 1])
async def test_budget_spend_is_each_keys_cost_since_a_time(
    engine: AsyncEngine,
    loaded: list[RequestRecord],
    keys_per_query: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What a restored budget counter is set to: every call's cost (router and downstream,
    # as a key's budget settles them), from the period's start.
    monkeypatch.setattr(spend_module, "_KEYS_PER_QUERY", keys_per_query)
    wanted = [k for k in KEYS if k is not None] + ["key_without_rows"]
    for since in (None, DAY0 + 86400, DAY0 + 86400 + 0.5, DAY0 + 10 * 86400):
        expected: dict[str, int] = defaultdict(int)
        for r in loaded:
            if r.key_id is not None and (since is None or r.created_at >= since):
                expected[r.key_id] += r.total_cost_micros
        got = await budget_spend(engine, wanted, since)
        assert got == {k: v for k, v in expected.items() if v}
    assert await budget_spend(engine, []) == {}


async def test_get_request(engine: AsyncEngine, loaded: list[RequestRecord]) -> None:
    rec = loaded[5]
    row = await get_request(engine, rec.request_id)
    assert row is not None
    assert (row["key_id"], row["final_model"], row["status"], row["total_cost_micros"]) == (
        rec.key_id,
        rec.final_model,
        rec.status,
        rec.total_cost_micros,
    )
    assert row["created_at"] == datetime.fromtimestamp(rec.created_at, UTC)
    assert "content" not in row
    assert await get_request(engine, "nope") is None


async def test_a_key_report_names_the_keys_by_alias(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    from gateway.ledger.keys import KeyRepository

    info, _ = await KeyRepository(engine).create("team-search")
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    writer.submit(make_request("spend-alias-1", key_id=info.key_id, call_costs=(700,)))
    writer.submit(make_request("spend-alias-2", key_id=None, call_costs=(300,)))
    await writer.close()
    rows = {r["key_id"]: r for r in await spend_report(engine, ["key"])}
    assert rows[info.key_id]["key_alias"] == "team-search"
    assert rows[info.key_id]["total_cost_micros"] == 700
    assert rows[None]["key_alias"] is None


async def test_cache_savings_are_what_the_reused_answers_cost(
    engine: AsyncEngine, loaded: list[RequestRecord]
) -> None:
    by_id = {r.request_id: r for r in loaded}
    hits = [r for r in loaded if r.cached_from is not None]
    assert len(hits) >= 5
    saved = sum(by_id[r.cached_from].total_cost_micros for r in hits if r.cached_from)
    assert await cache_savings(engine) == {
        "cache_hits": len(hits),
        "saved_micros": saved,
        "saved_usd": saved / 1_000_000,
    }
    since = DAY0 + 86400
    recent = [r for r in hits if r.created_at >= since]
    got = await cache_savings(engine, since=datetime.fromtimestamp(since, UTC))
    assert got["cache_hits"] == len(recent) < len(hits)


# Paging a report: ``GET /admin/spend`` asks ``spend_report`` for one page at a time (``after``
# the previous page's last group, ``limit``), and the database orders, filters and limits.
# Values whose byte order (Python's, SQLite's) differs from a language's order ("Bob" before
# "Z" before "_ops" before "alice"), and a None in every grouping column that can hold one.
PAGE_KEYS = ["key_Aa01", "key_aa02", "key_b003", "key_B004", "key_c005", None]
PAGE_USERS = ["alice", "Bob", "bob", "_ops", "a-b", "ab", "Émile", "zoë", "Z", "user 10", "user 9"]
PAGE_TAGS: list[list[str] | None] = [None, ["beta"], ["Beta"], ["search", "beta"], ["a-b"]]
PAGE_MODELS = ["gpt-4o-mini", "Claude-Haiku", "llama-70b"]
PAGE_GROUPINGS: list[list[str]] = [
    ["user"],
    ["tag"],
    ["key"],
    ["model"],
    ["day"],
    ["key", "user"],
    ["user", "key"],
    ["tag", "model"],
    ["day", "tag", "user"],
    ["policy", "key", "model"],
    [],
]


def paging_dataset() -> list[RequestRecord]:
    rng = random.Random(11)
    out = []
    for i in range(90):
        n_calls = rng.randint(1, 2)
        r = make_request(
            f"page{i:03d}",
            created_at=DAY0 + rng.uniform(0, 3 * 86400),
            key_id=rng.choice(PAGE_KEYS),
            policy=rng.choice(POLICIES),
            models=tuple(rng.choice(PAGE_MODELS) for _ in range(n_calls)),
            rng=rng,
        )
        r.end_user = rng.choice([*PAGE_USERS, None])
        r.tags = rng.choice(PAGE_TAGS)
        out.append(r)
    return out


async def write(
    engine: AsyncEngine, settings: LedgerSettings, records: list[RequestRecord]
) -> None:
    writer = LedgerWriter(engine, settings)
    await writer.start()
    for r in records:
        writer.submit(r)
    await writer.close()


def fields_of(groups: Sequence[str]) -> list[str]:
    return ["key_id" if g == "key" else g for g in groups]


def position(row: dict[str, Any], fields: Sequence[str]) -> tuple[tuple[bool, str], ...]:
    """Where the admin API placed a row before paging moved into the database: each group
    value as (is not None, value), compared as Python compares them."""
    return tuple((row[f] is not None, "" if row[f] is None else str(row[f])) for f in fields)


def old_page(
    report: list[dict[str, Any]], fields: Sequence[str], cursor: str | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """A page as ``GET /admin/spend`` made it in Python from the whole report: sorted by
    position, those after the cursor's, ``limit`` of them."""
    rows = sorted(report, key=lambda r: position(r, fields))
    if cursor is not None:
        group = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(group, dict):  # a cursor as the API makes it now: its group_by too
            group = group["group"]
        after = tuple((v is not None, v or "") for v in group)
        rows = [r for r in rows if position(r, fields) > after]
    return rows[:limit], len(rows) > limit


async def page(
    engine: AsyncEngine, groups: Sequence[str], cursor: str | None, limit: int, **filters: Any
) -> tuple[list[dict[str, Any]], bool, str | None]:
    """A page as ``GET /admin/spend`` makes it: the cursor read by the admin API, the page
    and one row more from the database; and the page's ``last_id``."""
    fields = fields_of(groups)
    after = admin_routes._spend_cursor_group(cursor, list(groups))
    rows = await spend_report(engine, groups, after=after, limit=limit + 1, **filters)  # type: ignore[arg-type]
    more, rows = len(rows) > limit, rows[:limit]
    return rows, more, admin_routes._spend_cursor(rows[-1], fields, list(groups)) if rows else None


async def page_through(
    engine: AsyncEngine, groups: Sequence[str], limit: int, **filters: Any
) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    while True:
        rows, more, cursor = await page(engine, groups, cursor, limit, **filters)
        pages.append(rows)
        if not more:
            return pages
        assert len(rows) == limit and cursor is not None


async def assert_pages_are_the_report(
    engine: AsyncEngine, records: list[RequestRecord], groups: list[str]
) -> list[dict[str, Any]]:
    fields = fields_of(groups)
    report = await spend_report(engine, groups)  # type: ignore[arg-type]
    # The unpaged report is every group, once, in cursor order (as Python sorts them).
    counted = by_tag(records) if "tag" in groups else records
    assert strip_usd([dict(r) for r in report]) == expected_report(counted, groups), groups
    assert report == sorted(report, key=lambda r: position(r, fields)), groups
    for limit in (1, 4, 1000):
        pages = await page_through(engine, groups, limit)
        assert [row for p in pages for row in p] == report, (groups, limit)
        assert all(len(p) == limit for p in pages[:-1]), (groups, limit)
    return report


async def test_paging_through_a_report_yields_the_report_in_cursor_order(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    records = paging_dataset()
    await write(engine, make_settings(flush_rows=25), records)
    for groups in PAGE_GROUPINGS:
        report = await assert_pages_are_the_report(engine, records, groups)
        fields = fields_of(groups)
        if groups:  # more groups than a page (of 4; of 1 for model and day, which have 3)
            assert len(report) > (1 if groups in (["model"], ["day"]) else 4), groups
        # Every single-column grouping has a None group here but model and day (which
        # cannot), and it is the first row.
        if groups and groups[0] in ("key", "user", "tag"):
            assert report[0][fields[0]] is None, groups
    # Filters page too: one key's users, one tag's keys.
    for groups, filters in ((["user"], {"key_id": "key_aa02"}), (["key"], {"tag": "beta"})):
        whole = await spend_report(engine, groups, **filters)  # type: ignore[arg-type]
        assert len(whole) > 2
        pages = await page_through(engine, groups, 2, **filters)
        assert [row for p in pages for row in p] == whole
    # A report without groups is one row of totals; the place after it is an empty page.
    assert len(await spend_report(engine, [], limit=2)) == 1
    assert await spend_report(engine, [], after=[]) == []
    with pytest.raises(ValueError):
        await spend_report(engine, ["user", "key"], after=["bob"])
    with pytest.raises(ValueError):
        await spend_report(engine, ["user"], limit=0)


# Cursors as the admin API made them before the database paged, and until 2026-11-29: base64url
# JSON of the last group's values, unpadded. Written out here, so that an encoder change cannot
# hide a break.
OLD_CURSORS: list[tuple[list[str], str]] = [
    (["user"], "WyJiIl0"),  # ["b"]: a place between groups, not a group
    (["user"], "W251bGxd"),  # [null]: after the None group
    (["user"], "WyJhYiJd"),  # ["ab"]: a group
    (["user"], "WyIiXQ"),  # [""]: after None, before every value
    (["user"], "WyJaIl0"),  # ["Z"]: before "_ops" and "alice", as Python orders them
    (["user"], "WyJhXHUwMDAweiJd"),  # ["a\u0000z"]: a NUL, which PostgreSQL cannot take
    (["key", "user"], "W251bGwsImJvYiJd"),  # [null, "bob"]
    (["key", "user"], "WyJrZXlfYWEwMiIsbnVsbF0"),  # ["key_aa02", null]
    (["day", "tag", "user"], "WyIyMDI1LTAzLTExIixudWxsLCJib2IiXQ"),  # ["2025-03-11", null, "bob"]
    (["tag", "model"], "WyJiZXRhIiwibGxhbWEtNzBiIl0"),  # ["beta", "llama-70b"]
]


def cursor_now(groups: Sequence[str], old: str) -> str:
    """The cursor the admin API makes now for the place an old cursor named: the group with
    the group_by it was made under (written out here, not by the API's encoder)."""
    group = orjson.loads(base64.urlsafe_b64decode(old + "=" * (-len(old) % 4)))
    raw = orjson.dumps({"group_by": list(groups), "group": group})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def test_a_place_pages_as_python_paged_and_an_old_cursor_is_refused(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    records = paging_dataset()
    await write(engine, make_settings(flush_rows=25), records)
    for groups, old in OLD_CURSORS:
        # An old cursor does not say which group_by it was made under, so it could be
        # another report's: refused, with a 400 that says to start again.
        with pytest.raises(APIError) as refused:
            admin_routes._spend_cursor_group(old, groups)
        assert refused.value.status == 400 and refused.value.param == "after"
        assert "earlier release" in refused.value.message
        cursor = cursor_now(groups, old)
        fields = fields_of(groups)
        report = await spend_report(engine, groups)  # type: ignore[arg-type]
        for limit in (1, 3, 1000):
            rows, more, _ = await page(engine, groups, cursor, limit)
            assert (rows, more) == old_page(report, fields, cursor, limit), (groups, cursor)
        # The rest of the report from there, page by page, is what the old pages gave.
        rest, _ = old_page(report, fields, cursor, 1000)
        assert 0 < len(rest) < len(report), (groups, cursor)
        got: list[dict[str, Any]] = []
        next_cursor: str | None = cursor
        while next_cursor is not None:
            rows, more, last = await page(engine, groups, next_cursor, 2)
            got += rows
            next_cursor = last if more else None
        assert got == rest, (groups, cursor)


def test_a_cursor_is_refused_under_another_group_by() -> None:
    # Of as many columns, so that its width cannot tell: a day read as a user sorted after
    # every user (the null one too), and the report skipped them all with a 200.
    day = admin_routes._spend_cursor({"day": "2026-11-29"}, ["day"], ["day"])
    assert admin_routes._spend_cursor_group(day, ["day"]) == ["2026-11-29"]
    tag_user = admin_routes._spend_cursor(
        {"tag": "beta", "user": None}, ["tag", "user"], ["tag", "user"]
    )
    for cursor, group_by in ((day, ["user"]), (day, ["key"]), (tag_user, ["user", "tag"])):
        with pytest.raises(APIError) as refused:
            admin_routes._spend_cursor_group(cursor, group_by)
        assert refused.value.status == 400 and refused.value.param == "after"
        assert f"grouped by {','.join(group_by)}" in refused.value.message


async def test_a_page_is_one_bounded_query(
    backend: str, engine: AsyncEngine, make_settings: Callable[..., LedgerSettings]
) -> None:
    from gateway.ledger.keys import KeyRepository

    keys = [(await KeyRepository(engine).create(f"team-{i}"))[0].key_id for i in range(6)]
    records = [
        make_request(f"bounded{i:03d}", key_id=keys[i % 6] if i % 7 else None, rng=random.Random(i))
        for i in range(40)
    ]
    for i, r in enumerate(records):
        r.end_user = f"user{i:03d}"
    await write(engine, make_settings(flush_rows=25), records)
    issued: list[tuple[str, Any]] = []

    def remember(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        issued.append((statement, parameters))

    def selects(statements: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return [(sql, params) for sql, params in statements if sql.lstrip().startswith("SELECT")]

    event.listen(engine.sync_engine, "before_cursor_execute", remember)
    try:
        users = await spend_report(engine, ["user"], after=["user010"], limit=3)
        assert [r["user"] for r in users] == ["user011", "user012", "user013"]
        [(sql, params)] = selects(issued)
        # Ordered, keyset-filtered and limited by the database: it returns the page only.
        assert re.search(r"\bORDER BY\b.*\bLIMIT\b", sql, re.S), sql
        assert 3 in tuple(params) and "user010" in tuple(params), params
        assert re.search(r"end_user( COLLATE \"C\"\))? >", sql), sql
        if backend == "postgresql":
            assert 'COLLATE "C"' in sql.split("ORDER BY")[1], sql
        issued.clear()
        by_key = await spend_report(engine, ["key"], after=[None], limit=2)
        assert [r["key_id"] for r in by_key] == sorted(keys)[:2]
        assert [r["key_alias"] for r in by_key] == [
            f"team-{keys.index(k)}" for k in sorted(keys)[:2]
        ]
        # The aliases are looked up for the page's keys, not for every key of the report.
        [(report_sql, _), (alias_sql, alias_params)] = selects(issued)
        assert "LIMIT" in report_sql and "api_keys" in alias_sql
        assert sorted(p for p in alias_params if isinstance(p, str)) == sorted(keys)[:2]
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", remember)


@pytest.mark.postgres
async def test_pages_follow_byte_order_under_a_language_collation(
    pg_scratch: Callable[[str], str], spill_dir: Path
) -> None:
    # A PostgreSQL database whose default collation is a language's (ICU en-US: "alice"
    # before "Bob" before "Z" before "_ops" is wrong for Python's order): reports are still
    # ordered, and paged, in byte order, as Python and SQLite order them.
    from .factories import pg_admin, pg_url

    name = pg_scratch("icu")
    await pg_admin(
        f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
    )
    url = pg_url(name)
    engine = await open_ledger_engine(url)
    try:
        records = paging_dataset()
        await write(engine, LedgerSettings(url=url, spill_dir=str(spill_dir)), records)
        async with engine.connect() as conn:
            ordered = [
                u
                for (u,) in await conn.execute(
                    sa.text(
                        "SELECT end_user FROM requests WHERE end_user IS NOT NULL "
                        "GROUP BY end_user ORDER BY end_user"
                    )
                )
            ]
        assert ordered != sorted(ordered)  # the database's own order is not Python's
        for groups in (["user"], ["tag"], ["key", "user"], ["tag", "model"]):
            await assert_pages_are_the_report(engine, records, groups)
        for groups, old in OLD_CURSORS:
            cursor = cursor_now(groups, old)
            report = await spend_report(engine, groups)  # type: ignore[arg-type]
            rows, more, _ = await page(engine, groups, cursor, 3)
            assert (rows, more) == old_page(report, fields_of(groups), cursor, 3), cursor
    finally:
        await engine.dispose()
