from __future__ import annotations

import dataclasses
import itertools
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import spend as spend_module
from gateway.ledger.records import RequestRecord
from gateway.ledger.spend import budget_spend, cache_savings, get_request, spend_report, totals
from gateway.ledger.store import create_ledger_engine
from gateway.ledger.writer import LedgerWriter
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
                    assert sum(r["calls"] for r in report) == sum(len(r.calls) for r in loaded)
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
