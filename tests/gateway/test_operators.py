"""Operators' guarantees end to end, on both stacks: the embedded one (SQLite ledger,
in-process limits) and the production one (PostgreSQL ledger, Redis limits).

Keys and auth, budgets under concurrency, spend reports that reconcile with the ledger,
feedback ownership, metrics that match the ledger, secrets that never leak, and ledger
rows that survive ``kill -9``."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.ledger.store import open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings
from router.outcomes import OutcomeRecord
from tests.gateway.conftest import Upstream, abandon_stream, longest_answer
from tests.gateway.ledger.factories import make_request, pg_admin, pg_url
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.sdk import extra

MODEL = "mixtral-8x22b-instruct-v0.1"  # the dearest demo model: budgets bind quickly
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@dataclass
class Stack:
    name: str
    ledger_url: str
    limits: dict[str, Any]
    tmp: Path


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _query(url: str, sql: str, **params: Any) -> list[Any]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(text(sql), params)).all())
    finally:
        await engine.dispose()


@pytest.fixture(
    scope="module",
    params=[
        "embedded",
        pytest.param("production", marks=[pytest.mark.postgres, pytest.mark.redis]),
    ],
)
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "embedded":
        yield Stack(
            "embedded", f"sqlite+aiosqlite:///{tmp / 'ledger.db'}", {"backend": "memory"}, tmp
        )
        return
    db = f"xrouter_ops_{os.getpid()}_{secrets.token_hex(3)}"
    _run(pg_admin(f'CREATE DATABASE "{db}"'))
    prefix = f"xrtest{secrets.token_hex(4)}"
    yield Stack(
        "production",
        pg_url(db),
        {"backend": "redis", "redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix},
        tmp,
    )
    _run(pg_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
    r = redis.Redis(host="127.0.0.1", port=6379)
    for k in r.scan_iter(f"{prefix}*"):
        r.delete(k)


def config(stack: Stack, upstream: Upstream, **extra: Any) -> dict[str, Any]:
    sections: dict[str, Any] = {
        "auth": {"enabled": True, "admin_key": ADMIN_KEY},
        "ledger": {
            "url": stack.ledger_url,
            "spill_dir": str(stack.tmp / "spill"),
            "flush_interval_ms": 20,
            "log_content": "full",
        },
        "limits": stack.limits,
    }
    return gateway_config(stack.tmp, upstream.base_url, **{**sections, **extra})


@pytest.fixture(scope="module")
def gw(stack: Stack, upstream: Upstream) -> Iterator[Gateway]:
    g = start_gateway(stack.tmp, config(stack, upstream))
    yield g
    g.stop()


def create_key(gw: Gateway, **fields: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{gw.url}/admin/keys", json={"alias": f"k-{secrets.token_hex(4)}", **fields}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    assert r.headers["cache-control"] == "no-store"  # it carries the new key's secret
    return r.json()


def chat(
    gw: Gateway, key: str, content: str = "What is the capital of France?", **kw: Any
) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}
    return httpx.post(
        f"{gw.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_key_lifecycle_and_auth(gw: Gateway) -> None:
    assert httpx.post(f"{gw.url}/admin/keys", json={"alias": "x"}).status_code == 401
    assert (
        httpx.post(
            f"{gw.url}/admin/keys", json={"alias": "x"}, headers={"Authorization": "Bearer wrong"}
        ).status_code
        == 401
    )
    k = create_key(gw, rpm=1000, metadata={"team": "search"})
    secret = k["key"]
    assert secret.startswith("xr-") and len(secret) > 30
    listed = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN).json()["data"]
    mine = next(x for x in listed if x["key_id"] == k["key_id"])
    assert secret not in str(listed) and mine["metadata"] == {"team": "search"}
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.headers["x-request-id"]  # what an SDK's error shows as its request_id
    assert chat(gw, "xr-not-a-real-key").status_code == 401
    assert chat(gw, secret).status_code == 200
    r = httpx.patch(
        f"{gw.url}/admin/keys/{k['key_id']}",
        json={"allowed_models": ["gemma-2-9b-it"]},
        headers=ADMIN,
    )
    assert r.status_code == 200 and r.json()["allowed_models"] == ["gemma-2-9b-it"]
    r = chat(gw, secret)
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    one = httpx.get(f"{gw.url}/admin/keys/{k['key_id']}", headers=ADMIN)
    assert one.status_code == 200 and one.json() == {
        **next(x for x in listed if x["key_id"] == k["key_id"]),
        "allowed_models": ["gemma-2-9b-it"],
    }
    assert httpx.delete(f"{gw.url}/admin/keys/{k['key_id']}", headers=ADMIN).status_code == 200
    assert chat(gw, secret).status_code == 401
    assert httpx.delete(f"{gw.url}/admin/keys/key_nope", headers=ADMIN).status_code == 404
    # A revoked key is still there to look up (what a ledger row's key_id was); none is not.
    gone = httpx.get(f"{gw.url}/admin/keys/{k['key_id']}", headers=ADMIN)
    assert gone.status_code == 200 and gone.json()["revoked"] is True
    missing = httpx.get(f"{gw.url}/admin/keys/key_nope", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "key_not_found"
    assert httpx.get(f"{gw.url}/admin/keys/{k['key_id']}").status_code == 401
    # An alias names one live key: taken, it is a 409; the revoked key's is free again.
    alias = k["alias"]
    live = create_key(gw, alias=alias)
    taken = httpx.post(f"{gw.url}/admin/keys", json={"alias": alias}, headers=ADMIN)
    assert taken.status_code == 409, taken.text
    assert taken.json()["error"]["code"] == "alias_taken"
    assert taken.json()["error"]["param"] == "alias"
    assert chat(gw, live["key"]).status_code == 200 and chat(gw, secret).status_code == 401


def test_keys_are_listed_page_by_page(gw: Gateway) -> None:
    for _ in range(3):
        create_key(gw)

    def page(**params: Any) -> httpx.Response:
        return httpx.get(f"{gw.url}/admin/keys", params=params, headers=ADMIN)

    everything = page(limit=1000).json()
    assert everything["object"] == "list" and not everything["has_more"]
    ids = [k["key_id"] for k in everything["data"]]
    assert len(ids) >= 3 and everything["last_id"] == ids[-1]
    paged: list[str] = []
    after = None
    while True:
        body = page(limit=2, **({"after": after} if after else {})).json()
        assert len(body["data"]) <= 2
        paged += [k["key_id"] for k in body["data"]]
        if not body["has_more"]:
            break
        after = body["last_id"]
    assert paged == ids
    bad_params: tuple[dict[str, object], ...] = (
        {"limit": 0},
        {"limit": 1001},
        {"limit": "ten"},
        {"after": "key_nope"},
        {"include_revoked": "yes"},  # was taken for "no", silently
        {"include_revoked": ""},  # not a boolean, as the OpenAPI document says
    )
    for bad in bad_params:
        r = page(**bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == next(iter(bad)), r.text
    assert page(include_revoked="True").status_code == 200


def test_tool_schemas_count_against_tpm_and_a_refusal_keeps_the_rate_headers(
    gw: Gateway,
) -> None:
    k = create_key(gw, rpm=1000, tpm=1_000_000)
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"x": "y" * 3000}}}
        for i in range(10)
    ]
    r = chat(gw, k["key"], tools=tools)
    assert r.status_code == 200, r.text
    # ~30 KB of schemas are ~10,000 tokens by the gateway's estimate, and providers bill them.
    assert 1_000_000 - int(r.headers["x-ratelimit-remaining-tokens"]) > 10_000
    # A request refused after admission (its budget) counted in the window: the client
    # still gets the window's headers to pace itself by.
    poor = create_key(gw, rpm=1000, budget_usd=0.000001)
    r = chat(gw, poor["key"])
    assert r.status_code == 429 and r.json()["error"]["code"] == "key_budget_exceeded"
    assert r.headers["x-ratelimit-limit-requests"] == "1000"
    assert r.headers["x-ratelimit-remaining-requests"] == "999"


def _parallel_refusals(gw: Gateway) -> float:
    body = httpx.get(f"{gw.url}/metrics", timeout=10).text
    return _metric(body, "xrouter_rate_limited_total", limit="parallel")


def test_a_key_s_parallel_requests_are_bounded(gw: Gateway, upstream: Upstream) -> None:
    # LiteLLM's max_parallel_requests: a key with max_parallel 1 and a slow answer in flight.
    k = create_key(gw, max_parallel=1)
    assert k["max_parallel"] == 1
    before = _parallel_refusals(gw)
    upstream.fault(MODEL, "latency=1500")
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(chat, gw, k["key"])
        deadline = time.monotonic() + 10
        while upstream.stats()["requests"].get(MODEL, 0) == 0:  # it holds the slot
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = chat(gw, k["key"])
        assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("rate_limit_exceeded", "parallel_limit_exceeded")
        assert "1 of its 1" in err["message"] and r.headers["retry-after"] == "1"
        assert slow.result(timeout=30).status_code == 200
    assert _parallel_refusals(gw) - before >= 1
    # Its answer done, the slot is free (released as the request finishes, off its path).
    deadline = time.monotonic() + 5
    while (r := chat(gw, k["key"])).status_code == 429:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    assert r.status_code == 200, r.text
    # Raised to 2: two at once go through; the key says so to its holder and to the admin.
    key_url = f"{gw.url}/admin/keys/{k['key_id']}"
    assert httpx.patch(key_url, json={"max_parallel": 2}, headers=ADMIN).status_code == 200
    assert httpx.get(key_url, headers=ADMIN).json()["max_parallel"] == 2
    own = httpx.get(f"{gw.base_url}/key", headers={"Authorization": f"Bearer {k['key']}"})
    assert own.json()["data"]["max_parallel"] == 2
    upstream.fault(MODEL, "latency=800", count=2)
    with ThreadPoolExecutor(2) as pool:
        both = [pool.submit(chat, gw, k["key"]) for _ in range(2)]
        assert [f.result(timeout=30).status_code for f in both] == [200, 200]
    for bad in (0, -1, True, "2"):
        r = httpx.patch(key_url, json={"max_parallel": bad}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_parallel", bad


def test_tpm_counts_the_output_a_request_may_generate_until_it_ends(gw: Gateway) -> None:
    # As OpenAI and Anthropic count it: a request's max_tokens (times n) is in the window
    # from admission, and corrected to the tokens it used once it ends.
    k = create_key(gw, rpm=1000, tpm=2000)
    r = chat(gw, k["key"], max_tokens=5000)
    assert r.status_code == 429 and r.json()["error"]["code"] == "tpm_limit_exceeded", r.text
    r = chat(gw, k["key"], max_completion_tokens=300, n=2)
    assert r.status_code == 200, r.text
    at_admission = 2000 - int(r.headers["x-ratelimit-remaining-tokens"])
    assert at_admission > 600  # the prompt and 2 × 300
    used = r.json()["usage"]["total_tokens"]
    assert used < 600
    # The next request sees the first one's real tokens, and its own 300.
    r = chat(gw, k["key"], max_tokens=300)
    assert r.status_code == 200, r.text
    before_second = 2000 - int(r.headers["x-ratelimit-remaining-tokens"]) - (at_admission - 600)
    assert before_second - 300 == used, (before_second, used)


def test_key_limits_are_bounded_by_what_the_ledger_stores(gw: Gateway) -> None:
    # The largest values fit the columns (BIGINT micro-USD, INTEGER rpm/tpm on PostgreSQL);
    # anything larger, or not finite, is a 400 naming the field, never a 500.
    k = create_key(gw, budget_usd=1e12, budget_period="total", rpm=2**31 - 1, tpm=2**31 - 1)
    assert k["budget_micros"] == 10**18 and k["rpm"] == k["tpm"] == 2**31 - 1
    for fields, param in (
        ({"budget_usd": 1e13, "budget_period": "total"}, "budget_usd"),
        ({"budget_usd": "Infinity", "budget_period": "total"}, "budget_usd"),
        ({"rpm": 2**31}, "rpm"),
        ({"tpm": 10**19}, "tpm"),
        ({"alias": "nul\x00"}, "alias"),
        # Under half a micro-dollar: it was stored as a budget of 0 that refused everything.
        ({"budget_usd": 1e-9, "budget_period": "total"}, "budget_usd"),
    ):
        r = httpx.post(f"{gw.url}/admin/keys", json={"alias": "big", **fields}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.patch(f"{gw.url}/admin/keys/{k['key_id']}", json={"rpm": 2**40}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "rpm"
    r = httpx.patch(f"{gw.url}/admin/keys/{k['key_id']}", json={"budget_usd": 1e-9}, headers=ADMIN)
    assert r.status_code == 400 and "rounds to 0" in r.json()["error"]["message"], r.text
    half = create_key(gw, alias="half-micro", budget_usd=0.0000005, budget_period="total")
    assert half["budget_micros"] == 1  # half a micro-dollar rounds up, to a budget


def test_admin_bodies_that_cannot_be_taken_are_400s_naming_the_problem(gw: Gateway) -> None:
    k = create_key(gw)
    url = f"{gw.url}/admin/keys/{k['key_id']}"
    with httpx.Client(timeout=10) as c:
        # Not JSON, or not an object: invalid_json, as on every JSON endpoint.
        for method, path, raw in (
            ("POST", f"{gw.url}/admin/keys", b"{not json"),
            ("POST", f"{gw.url}/admin/keys", b"[]"),
            ("PATCH", url, b"null"),
            ("POST", f"{gw.url}/admin/reload", b'"x"'),
        ):
            r = c.request(method, path, content=raw, headers=ADMIN)
            assert r.status_code == 400, (method, path, raw, r.text)
            assert r.json()["error"]["code"] == "invalid_json", r.text
        # An expiry already past is named as the body gave it.
        for fields, param in (
            ({"duration": "0s"}, "duration"),
            ({"expires_at": "2020-01-01"}, "expires_at"),
        ):
            r = c.post(f"{gw.url}/admin/keys", json={"alias": "never", **fields}, headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        # A rule across fields is no JSON problem.
        both = {"alias": "both", "duration": "1h", "expires_at": "2100-01-01"}
        r = c.post(f"{gw.url}/admin/keys", json=both, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["code"] is None, r.text
        # Values of the wrong JSON type are refused, not coerced (`true` was an rpm of 1).
        typed: tuple[tuple[dict[str, object], str], ...] = (
            ({"rpm": True}, "rpm"),
            ({"budget_usd": "5"}, "budget_usd"),
            ({"routing": {"cost_weight": "0.5"}}, "routing.cost_weight"),
        )
        for wrong, param in typed:
            r = c.post(f"{gw.url}/admin/keys", json={"alias": "typed", **wrong}, headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
            r = c.patch(url, json=wrong, headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        # A key's alias is required: null does not clear it (it was a 500).
        r = c.patch(url, json={"alias": None}, headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "alias", r.text
        listed = c.get(f"{gw.url}/admin/keys", params={"limit": 1000}, headers=ADMIN).json()
        assert next(x for x in listed["data"] if x["key_id"] == k["key_id"])["alias"] == k["alias"]


def test_a_budget_given_later_never_resets_as_one_given_at_creation(gw: Gateway) -> None:
    # Without a period a budget is "total", whether the key got it when it was made or later.
    k = create_key(gw)
    url = f"{gw.url}/admin/keys/{k['key_id']}"
    r = httpx.patch(url, json={"budget_usd": 5}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["budget_period"] == "total", r.text
    r = httpx.patch(url, json={"budget_period": None}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["budget_period"] == "total", r.text
    info = httpx.get(f"{gw.base_url}/key", headers={"Authorization": f"Bearer {k['key']}"})
    assert info.json()["data"]["budget_period"] == "total"
    # Without a budget, no period is made up.
    r = httpx.patch(url, json={"budget_usd": None, "budget_period": None}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["budget_period"] is None, r.text


def test_values_the_database_cannot_take_are_client_errors(gw: Gateway) -> None:
    # PostgreSQL refuses NUL characters in text; on either database such input is a 4xx
    # naming the problem, never a 500, and the client's connection stays usable.
    k = create_key(gw)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        r = c.post(
            "/v1/feedback",
            json={"request_id": "abc\x00def", "score": 1},
            headers={"Authorization": f"Bearer {k['key']}"},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "request_id"
        for method, path in (
            ("GET", "/admin/spend?group_by=key&key=key_%00x"),
            ("PATCH", "/admin/keys/key_%00x"),
            ("DELETE", "/admin/keys/key_%00x"),
        ):
            body = {"rpm": 5} if method == "PATCH" else None
            r = c.request(method, path, json=body, headers=ADMIN)
            assert r.status_code in (200, 400, 404), (method, path, r.status_code, r.text)
            assert r.json().get("error", {}).get("type") != "server_error"
        # A report bound UTC cannot hold is the caller's mistake, said with its name.
        r = c.get("/admin/spend?group_by=key&since=9999-12-31T23:00:00-05:00", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "since", r.text
        # A spending cap beyond what the ledger's micro-USD columns hold (or the cache's
        # 64-bit JSON integers) is refused, on the chat API as on the others.
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": "xrouter",
                "messages": [{"role": "user", "content": "hi"}],
                "xrouter": {"max_cost_usd": 1e22},
            },
            headers={"Authorization": f"Bearer {k['key']}"},
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "xrouter.max_cost_usd", r.text
        # A number JSON can write but no float holds: a key's metadata took 1e400 as
        # infinity and stored null; the chat API refuses it as invalid JSON, and so does
        # every other JSON endpoint now.
        r = c.post(
            "/admin/keys",
            content=b'{"alias": "inf", "metadata": {"n": 1e400}}',
            headers={**ADMIN, "content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_json", r.text
        # Same connection, still served.
        assert c.get("/admin/keys", headers=ADMIN).status_code == 200


def test_a_budget_held_by_calls_in_flight_is_a_429_to_retry_not_exhaustion(
    gw: Gateway, upstream: Upstream
) -> None:
    # Concurrent requests' worst-case holds filled a key with 97% of its budget unspent,
    # and the rest were told "key budget exhausted", not to retry, retry-after ~14 hours.
    content, max_tokens = "What is the capital of France?", 40
    worst = -(-(((len(content) + 8) // 3 + 1 + 8) + max_tokens) * 12 // 10)
    k = create_key(gw, budget_usd=(2 * worst - 1) / 1e6, budget_period="daily")  # one hold fits
    upstream.fault(MODEL, "latency=1500")
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(chat, gw, k["key"], content, max_tokens=max_tokens)
        deadline = time.monotonic() + 10
        while upstream.stats()["requests"].get(MODEL, 0) == 0:  # its hold is taken
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = chat(gw, k["key"], content, max_tokens=max_tokens)
        assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert (err["type"], err["code"]) == ("rate_limit_exceeded", "key_budget_held"), err
        assert r.headers["retry-after"] == "1" and "x-should-retry" not in r.headers
        assert "retry when they finish" in err["message"]
        assert slow.result(timeout=30).status_code == 200
    # Settled at what it cost, a fraction of its hold: the next call fits.
    deadline = time.monotonic() + 5
    while (r := chat(gw, k["key"], content, max_tokens=max_tokens)).status_code == 429:
        assert r.json()["error"]["code"] == "key_budget_held", r.text
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    assert r.status_code == 200, r.text


def test_budget_holds_under_100_parallel_requests(gw: Gateway, stack: Stack) -> None:
    prompt = "Explain briefly why the sky is blue."
    max_tokens = 40
    # One request's worst case as the gateway reserves it (prompt estimate x input price +
    # max_tokens x output price, $1.2 per 1M tokens each way); the budget covers ~10.
    worst = -(-(((len(prompt) + 8) // 3 + 1 + 8) + max_tokens) * 12 // 10)
    budget_micros = worst * 10
    k = create_key(gw, budget_usd=budget_micros / 1e6, budget_period="total")

    async def one(ac: httpx.AsyncClient) -> httpx.Response:
        return await ac.post(
            "/chat/completions",
            json={
                "model": MODEL,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": prompt}],
            },
        )

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=gw.base_url,
            headers={"Authorization": f"Bearer {k['key']}"},
            timeout=60,
            limits=httpx.Limits(max_connections=100),
        ) as ac:
            return await asyncio.gather(*(one(ac) for _ in range(100)))

    rs = asyncio.run(burst())
    ok = [r for r in rs if r.status_code == 200]
    refused = [r for r in rs if r.status_code == 429]
    assert len(ok) + len(refused) == 100 and ok and refused
    codes = {r.json()["error"]["code"] for r in refused}
    assert codes <= {"key_budget_exceeded", "key_budget_held"}
    assert all("retry-after" not in r.headers or int(r.headers["retry-after"]) > 0 for r in refused)
    for r in refused:  # only the spent-out budget says not to retry
        exhausted = r.json()["error"]["code"] == "key_budget_exceeded"
        assert (r.headers.get("x-should-retry") == "false") is exhausted
    spent = sum(round(r.json()["usage"]["cost"] * 1e6) for r in ok)
    assert spent <= budget_micros + worst
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)  # flushes the ledger
    rows = _run(
        _query(
            stack.ledger_url,
            "SELECT COALESCE(SUM(total_cost_micros), 0), COUNT(*) FROM requests WHERE key_id = :k AND status = 200",
            k=k["key_id"],
        )
    )
    assert rows[0][0] == spent and rows[0][1] == len(ok)
    listed = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN).json()["data"]
    mine = next(x for x in listed if x["key_id"] == k["key_id"])
    assert round(mine["spent_usd"] * 1e6) == spent  # the store's counter matches the ledger
    gauge = _metric(
        httpx.get(f"{gw.url}/metrics").text,
        "xrouter_key_budget_remaining_usd",
        key_alias=k["alias"],
    )
    assert 0 <= gauge <= budget_micros / 1e6
    # (After the gauge: a budget change drops the key's series until it is read again.)
    # A change answers as the lookup does: with the spend, read against the new budget.
    url = f"{gw.url}/admin/keys/{k['key_id']}"
    changed = httpx.patch(url, json={"budget_usd": 1.0}, headers=ADMIN).json()
    looked_up = httpx.get(url, headers=ADMIN).json()
    assert round(changed["spent_usd"] * 1e6) == spent == round(looked_up["spent_usd"] * 1e6)
    assert changed["remaining_usd"] == looked_up["remaining_usd"] == pytest.approx(1 - spent / 1e6)


def test_request_budget_cap(gw: Gateway) -> None:
    k = create_key(gw)
    r = chat(gw, k["key"], xrouter={"max_cost_usd": 0.0000001})
    assert r.status_code == 429 and r.json()["error"]["code"] == "request_budget_exceeded"
    assert r.headers["x-should-retry"] == "false"  # the OpenAI SDKs would retry it at once


def test_abandoned_stream_is_charged_to_its_key(
    gw: Gateway, stack: Stack, demo_table: list[OutcomeRecord]
) -> None:
    # A client that reads part of an answer and hangs up before the usage chunk still pays
    # for what it used: the key's budget counter and the ledger agree on a non-zero cost.
    rec = longest_answer(demo_table, MODEL)
    k = create_key(gw, budget_usd=1.0, budget_period="total")
    request_id = abandon_stream(gw.base_url, MODEL, rec.text, k["key"])
    spent = 0.0
    deadline = time.monotonic() + 10
    while spent == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        listed = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN).json()["data"]
        spent = next(x for x in listed if x["key_id"] == k["key_id"])["spent_usd"]
    assert spent > 0
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)  # flushes the ledger
    rows = _run(
        _query(
            stack.ledger_url,
            "SELECT status, total_cost_micros FROM requests WHERE request_id = :r",
            r=request_id,
        )
    )
    assert [tuple(row) for row in rows] == [(499, round(spent * 1e6))]


def test_spend_report_reconciles_with_ledger(gw: Gateway, stack: Stack) -> None:
    k = create_key(gw)
    for i in range(5):
        assert chat(gw, k["key"], f"question {i}?").status_code == 200
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)  # flushes the ledger
    total = _run(_query(stack.ledger_url, "SELECT SUM(total_cost_micros) FROM requests"))[0][0]
    calls = _run(_query(stack.ledger_url, "SELECT SUM(cost_micros) FROM calls"))[0][0]
    assert int(total) == int(calls)
    for group in ("key", "model", "policy", "day", "key,model,day"):
        data = httpx.get(f"{gw.url}/admin/spend", params={"group_by": group}, headers=ADMIN).json()[
            "data"
        ]
        assert sum(row["total_cost_micros"] for row in data) == int(total), group
    mine = httpx.get(
        f"{gw.url}/admin/spend", params={"group_by": "key", "key": k["key_id"]}, headers=ADMIN
    ).json()["data"]
    assert sum(row["requests"] for row in mine) == 5
    # A repeated or spaced group is asked once, and the answer says so.
    again = httpx.get(
        f"{gw.url}/admin/spend", params={"group_by": "key, model,key"}, headers=ADMIN
    ).json()
    assert again["group_by"] == ["key", "model"]
    assert sum(row["total_cost_micros"] for row in again["data"]) == int(total)


def test_spend_is_reported_page_by_page(gw: Gateway) -> None:
    for _ in range(3):
        k = create_key(gw)
        assert chat(gw, k["key"]).status_code == 200

    def page(**params: Any) -> httpx.Response:
        return httpx.get(f"{gw.url}/admin/spend", params=params, headers=ADMIN)

    for group_by in ("key", "key,model", "day,api,user"):
        everything = page(group_by=group_by, limit=1000).json()
        assert everything["object"] == "list" and not everything["has_more"]
        rows = everything["data"]
        assert len(rows) >= (3 if group_by != "day,api,user" else 1)
        assert everything["last_id"] is not None
        paged: list[dict[str, Any]] = []
        after = None
        while True:
            r = page(group_by=group_by, limit=2, **({"after": after} if after else {}))
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body["data"]) <= 2 and body["group_by"] == everything["group_by"]
            paged += body["data"]
            if not body["has_more"]:
                break
            after = body["last_id"]
        assert paged == rows, group_by
    # The default page is 100 groups; the last page's cursor leads to an empty page.
    first = page(group_by="key").json()
    assert len(first["data"]) == min(100, len(page(group_by="key", limit=1000).json()["data"]))
    tail = page(group_by="key", after=first["last_id"]).json()
    assert tail["data"] == [] and not tail["has_more"] and tail["first_id"] is None
    # A cursor is a position, not a row that has to exist: a key that spends between two
    # pages is on the page its place in the order puts it on.
    one = page(group_by="key", limit=1).json()
    late = create_key(gw)
    assert chat(gw, late["key"]).status_code == 200
    time.sleep(0.3)  # the ledger writer flushes every 20 ms here
    rest = [
        r["key_id"] for r in page(group_by="key", limit=1000, after=one["last_id"]).json()["data"]
    ]
    everything = [r["key_id"] for r in page(group_by="key", limit=1000).json()["data"]]
    assert late["key_id"] in everything
    # The next page is everything after the first page's last group — the late key included
    # if it sorts after that group (key ids are random: it may sort before, on page one's
    # place, which was read before it existed).
    assert rest == everything[everything.index(one["data"][0]["key_id"]) + 1 :]
    other_grouping = page(group_by="key,model", limit=1).json()["last_id"]
    for bad in (
        {"limit": 0},
        {"limit": 1001},
        {"limit": "ten"},
        {"after": "not a cursor"},
        {"after": "W10"},  # base64 JSON, but not a group
        {"after": other_grouping},  # another group_by's cursor
    ):
        r = page(group_by="key", **bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["param"] == next(iter(bad)), r.text


def test_spend_pages_by_user_and_tag_in_byte_order_with_null_groups(gw: Gateway) -> None:
    # End users and tags (one group each: the groupings with the most groups), some sorting
    # differently by a language's rules than by bytes, and requests with neither (the None
    # group). The database pages them, in the order the cursor names.
    k = create_key(gw)
    sent = [
        ("Bob", ["Beta"]), ("anna", ["beta", "search"]), ("_ops", None), ("Zed", ["a-b"]),
        ("ab", ["ab"]), ("a-b", None), (None, ["beta"]), ("émile", ["Beta"]), (None, None),
    ]  # fmt: skip
    for user, tags in sent:
        extra_body: dict[str, Any] = {"user": user} if user else {}
        if tags:
            extra_body["xrouter"] = {"tags": tags}
        assert chat(gw, k["key"], **extra_body).status_code == 200

    def page(**params: Any) -> dict[str, Any]:
        r = httpx.get(f"{gw.url}/admin/spend", params={"key": k["key_id"], **params}, headers=ADMIN)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    users = [r["user"] for r in page(group_by="user", limit=1000)["data"]]
    assert users == [None, "Bob", "Zed", "_ops", "a-b", "ab", "anna", "émile"]
    tags = [r["tag"] for r in page(group_by="tag", limit=1000)["data"]]
    assert tags == [None, "Beta", "a-b", "ab", "beta", "search"]
    for group_by in ("user", "tag", "tag,user", "user,tag,model"):
        everything = page(group_by=group_by, limit=1000)
        assert not everything["has_more"] and len(everything["data"]) > 3
        paged: list[dict[str, Any]] = []
        after = None
        while True:
            body = page(group_by=group_by, limit=3, **({"after": after} if after else {}))
            paged += body["data"]
            if not body["has_more"]:
                break
            after = body["last_id"]
        assert paged == everything["data"], group_by
    # A cursor is a place in its group_by's order: one made under another group_by of as
    # many columns (a day among users; tag,user read as user,tag) was read as a place in
    # this order and skipped every group before it — every user, the null one included,
    # sorts before "2026-…" — with a 200. It is a 400 naming after and both groupings.
    last_day = page(group_by="day", limit=1)["last_id"]
    last_tag_user = page(group_by="tag,user", limit=2)["last_id"]
    for group_by, cursor, made_under in (
        ("user", last_day, "day"),
        ("user,tag", last_tag_user, "tag,user"),
    ):
        r = httpx.get(
            f"{gw.url}/admin/spend",
            params={"key": k["key_id"], "group_by": group_by, "after": cursor},
            headers=ADMIN,
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "after", r.text
        assert (
            f"grouped by {made_under}, not of this one, grouped by {group_by}" in error["message"]
        ), r.text
    # Cursors as the API made them until 2026-11-29 (base64url JSON of the group alone,
    # unpadded: [null] and ["_ops"] for group_by=user, ["beta", null] for tag,user) do not
    # say their group_by, so they are refused, with a message saying to start again.
    for group_by, cursor in (
        ("user", "W251bGxd"),
        ("user", "WyJfb3BzIl0"),
        ("tag,user", "WyJiZXRhIixudWxsXQ"),
    ):
        r = httpx.get(
            f"{gw.url}/admin/spend",
            params={"key": k["key_id"], "group_by": group_by, "after": cursor},
            headers=ADMIN,
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "after", r.text
        assert "earlier release" in r.json()["error"]["message"], r.text
    # The filters may change between pages: they change which groups there are, as the
    # ledger growing does, not the order a cursor is a place in.
    after_ops = page(group_by="user", limit=4)
    assert after_ops["data"][-1]["user"] == "_ops"
    unfiltered = httpx.get(
        f"{gw.url}/admin/spend",
        params={"group_by": "user", "after": after_ops["last_id"], "limit": 1000},
        headers=ADMIN,
    ).json()["data"]
    everyone = [r["user"] for r in unfiltered]
    assert all(u is not None and u > "_ops" for u in everyone), everyone
    assert {"a-b", "ab", "anna", "émile"} <= set(everyone), everyone


def test_feedback_only_from_the_requesting_key(gw: Gateway, stack: Stack) -> None:
    a, b = create_key(gw), create_key(gw)
    rid = chat(gw, a["key"]).json()["xrouter"]["request_id"]
    fb = {"request_id": rid, "score": 0.75, "comment": "good"}
    r = httpx.post(
        f"{gw.base_url}/feedback", json=fb, headers={"Authorization": f"Bearer {b['key']}"}
    )
    assert r.status_code == 404
    r = httpx.post(
        f"{gw.base_url}/feedback",
        json={**fb, "score": 3},
        headers={"Authorization": f"Bearer {a['key']}"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "score"
    r = httpx.post(
        f"{gw.base_url}/feedback", json=fb, headers={"Authorization": f"Bearer {a['key']}"}
    )
    assert r.status_code == 200
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)
    rows = _run(_query(stack.ledger_url, "SELECT score FROM feedback WHERE request_id = :r", r=rid))
    assert [x[0] for x in rows] == [0.75]


def _metric(body: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in body.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_match_the_ledger(gw: Gateway, stack: Stack) -> None:
    k = create_key(gw)
    for i in range(4):
        chat(gw, k["key"], f"metrics question {i}")
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)
    body = httpx.get(f"{gw.url}/metrics").text
    cost, n = _run(
        _query(stack.ledger_url, "SELECT SUM(total_cost_micros), COUNT(*) FROM requests")
    )[0]
    assert _metric(body, "xrouter_cost_usd_total") == pytest.approx(int(cost) / 1e6, abs=1e-9)
    # Cost by policy (the dashboard's "cost by policy" panel) as the ledger has it.
    by_policy = _run(
        _query(stack.ledger_url, "SELECT policy, SUM(total_cost_micros) FROM requests GROUP BY 1")
    )
    assert any(int(c) > 0 for _, c in by_policy)  # earlier tests' refusals cost nothing
    for policy, c in by_policy:
        assert _metric(body, "xrouter_cost_usd_total", policy=policy) == pytest.approx(
            int(c) / 1e6, abs=1e-9
        )
    assert _metric(body, "xrouter_requests_total") == n
    prompt_tokens = _run(_query(stack.ledger_url, "SELECT SUM(prompt_tokens) FROM calls"))[0][0]
    assert _metric(body, "xrouter_tokens_total", kind="prompt") == int(prompt_tokens)
    assert 'model="' in body and "xrouter_request_duration_seconds_bucket" in body


def test_secrets_never_leak(gw: Gateway, stack: Stack) -> None:
    k = create_key(gw)
    secret = k["key"]
    assert chat(gw, secret).status_code == 200
    assert secret not in httpx.get(f"{gw.url}/metrics").text
    assert secret not in gw.log()
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)
    for table in ("api_keys", "requests", "calls"):
        rows = _run(_query(stack.ledger_url, f"SELECT * FROM {table}"))
        assert secret not in repr(rows)
        assert secret[3:] not in repr(rows)


def test_ledger_rows_survive_kill_9(stack: Stack, upstream: Upstream) -> None:
    cfg = config(stack, upstream, auth={"enabled": False, "admin_key": ADMIN_KEY})
    cfg["ledger"]["spill_dir"] = str(stack.tmp / "spill-kill")
    cfg["ledger"]["flush_interval_ms"] = (
        2000  # rows sit in the queue: only the journal can save them
    )
    g = start_gateway(stack.tmp / "kill", cfg, name="victim")
    got: list[str] = []
    stop = threading.Event()

    def load(stream: bool) -> None:
        # Plain answers count once their 200 arrives, streams once their last chunk (the
        # usage and the xrouter object, just before [DONE]) has.
        c = openai.OpenAI(base_url=g.base_url, api_key="none", max_retries=0, timeout=10)
        i = 0
        while not stop.is_set():
            messages: list[ChatCompletionMessageParam] = [
                {"role": "user", "content": f"durable {stream} {i}"}
            ]
            try:
                if stream:
                    last = list(
                        c.chat.completions.create(model=MODEL, messages=messages, stream=True)
                    )[-1]
                    got.append(extra(last)["xrouter"]["request_id"])
                else:
                    r = c.chat.completions.create(model=MODEL, messages=messages)
                    got.append(extra(r)["xrouter"]["request_id"])
            except (openai.APIError, httpx.HTTPError, KeyError):
                return
            i += 1

    threads = [threading.Thread(target=load, args=(i % 2 == 1,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    g.stop(signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join()
    assert len(got) > 10
    g2 = start_gateway(stack.tmp / "kill", cfg, name="restarted")
    try:
        deadline = time.monotonic() + 20
        missing = set(got)
        while missing and time.monotonic() < deadline:
            ids = {r[0] for r in _run(_query(stack.ledger_url, "SELECT request_id FROM requests"))}
            missing = set(got) - ids
            time.sleep(0.3)
        assert not missing, f"{len(missing)} of {len(got)} acknowledged requests lost"
    finally:
        g2.stop()


def _key_spent(gw: Gateway, key_id: str) -> float:
    listed = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN).json()["data"]
    return float(next(x for x in listed if x["key_id"] == key_id)["spent_usd"])


def _purge_redis(prefix: str) -> int:
    r = redis.Redis(host="127.0.0.1", port=6379)
    keys = list(r.scan_iter(f"{prefix}*"))
    if keys:
        r.delete(*keys)
    return len(keys)


def _redis_has(key: str) -> bool:
    return bool(redis.Redis(host="127.0.0.1", port=6379).exists(key))


def test_key_budgets_survive_a_restart_and_a_redis_that_lost_its_data(
    stack: Stack, upstream: Upstream
) -> None:
    # The limit store's counters are a cache of the ledger: a gateway killed with -9 (and, on
    # the production stack, a Redis that lost its data meanwhile) must not hand the key its
    # budget again.
    limits = {**stack.limits, "budget_sync_s": 0.2}
    if stack.name == "production":
        # A store of their own: the module's gateway (same database) checks every 30 s
        # whether its store lost its data, and on a shared one it could restore the purges
        # below before these gateways do, leaving them nothing to restore or count.
        limits["key_prefix"] = f"{stack.limits['key_prefix']}-budgets"
    cfg = config(stack, upstream, limits=limits)
    cfg["ledger"]["spill_dir"] = str(stack.tmp / "spill-budget")
    cfg["ledger"]["flush_interval_ms"] = 5000  # the rows are only in the journal at the kill
    replica = None
    if stack.name == "production":
        # A replica that keeps running restores the lost Redis from a ledger without the
        # killed gateway's journaled requests: its successor must restore them anyway.
        other = {**cfg, "ledger": {**cfg["ledger"], "spill_dir": str(stack.tmp / "spill-r")}}
        replica = start_gateway(stack.tmp / "budget", other, name="budget-replica")
    g = start_gateway(stack.tmp / "budget", cfg, name="budget-first")
    try:
        k = create_key(g, budget_usd=0.0002, budget_period="total")
        codes = [chat(g, k["key"], f"spend {i}", max_tokens=40).status_code for i in range(30)]
        assert codes[0] == 200 and codes[-1] == 429
        spent = _key_spent(g, k["key_id"])
        assert spent > 0
        # A revoked key keeps what it spent too, though only live keys are restored.
        gone = create_key(g, budget_usd=1.0, budget_period="total")
        assert chat(g, gone["key"], "spend once", max_tokens=40).status_code == 200
        gone_url = f"{g.url}/admin/keys/{gone['key_id']}"
        gone_spent = httpx.get(gone_url, headers=ADMIN).json()["spent_usd"]
        assert gone_spent > 0
        assert httpx.delete(gone_url, headers=ADMIN).status_code == 200
    finally:
        g.stop(signal.SIGKILL)
    if replica is not None:
        try:
            assert _purge_redis(limits["key_prefix"]) > 0
            deadline = time.monotonic() + 10
            while not _redis_has(f"{limits['key_prefix']}:budgets-restored"):
                assert time.monotonic() < deadline, "the replica did not restore the store"
                time.sleep(0.1)
            assert _key_spent(replica, k["key_id"]) < spent  # the journaled rows are missing
        finally:
            replica.stop()
    g = start_gateway(stack.tmp / "budget", cfg, name="budget-restarted")
    try:
        assert _key_spent(g, k["key_id"]) == spent
        view = httpx.get(f"{g.url}/admin/keys/{gone['key_id']}", headers=ADMIN).json()
        assert view["revoked"] is True and view["spent_usd"] == gone_spent
        r = chat(g, k["key"], "one more", max_tokens=40)
        assert r.status_code == 429 and r.json()["error"]["code"] == "key_budget_exceeded"
        rows = _run(
            _query(
                stack.ledger_url,
                "SELECT SUM(total_cost_micros) FROM requests WHERE key_id = :k",
                k=k["key_id"],
            )
        )
        assert rows[0][0] == round(spent * 1e6)  # what the counter holds is the ledger's
        if stack.name == "production":
            # Redis loses its data under a running gateway: restored within a check or two.
            assert _purge_redis(limits["key_prefix"]) > 0
            deadline = time.monotonic() + 10
            while _key_spent(g, k["key_id"]) != spent and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _key_spent(g, k["key_id"]) == spent
            m = httpx.get(f"{g.url}/metrics").text
            assert _metric(m, "xrouter_budget_restores_total", trigger="store_lost") == 1
        else:
            m = httpx.get(f"{g.url}/metrics").text
            assert _metric(m, "xrouter_budget_restores_total", trigger="startup") == 1
    finally:
        g.stop()


def test_a_key_moved_to_another_budget_period_keeps_what_it_spent_in_it(gw: Gateway) -> None:
    k = create_key(gw, budget_usd=1.0, budget_period="monthly")
    for i in range(3):
        assert chat(gw, k["key"], f"period {i}").status_code == 200
    spent = _key_spent(gw, k["key_id"])
    assert spent > 0
    r = httpx.patch(
        f"{gw.url}/admin/keys/{k['key_id']}", json={"budget_period": "daily"}, headers=ADMIN
    )
    assert r.status_code == 200 and r.json()["budget_period"] == "daily"
    assert _key_spent(gw, k["key_id"]) == spent  # all of it today, whatever the period
    r = httpx.patch(
        f"{gw.url}/admin/keys/{k['key_id']}", json={"budget_usd": spent / 2}, headers=ADMIN
    )
    assert r.status_code == 200
    refused = chat(gw, k["key"], "over")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "key_budget_exceeded"
    assert refused.headers["x-should-retry"] == "false"


def test_a_rotated_key_keeps_its_budget_and_spend_under_a_new_secret(gw: Gateway) -> None:
    k = create_key(gw, budget_usd=1.0, budget_period="monthly")
    assert chat(gw, k["key"]).status_code == 200  # its lookup is now cached
    spent = _key_spent(gw, k["key_id"])
    r = httpx.post(f"{gw.url}/admin/keys/{k['key_id']}/rotate", headers=ADMIN)
    assert r.status_code == 200, r.text
    rotated = r.json()
    assert rotated["key"] != k["key"] and rotated["key_id"] == k["key_id"]
    assert r.headers["cache-control"] == "no-store"  # it carries a secret
    assert (rotated["budget_usd"], rotated["budget_period"]) == (1.0, "monthly")
    refused = chat(gw, k["key"])
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert chat(gw, rotated["key"]).status_code == 200
    assert _key_spent(gw, k["key_id"]) > spent > 0  # one budget, before and after
    r = httpx.post(f"{gw.url}/admin/keys/key_nothere/rotate", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "key_not_found"
    httpx.delete(f"{gw.url}/admin/keys/{k['key_id']}", headers=ADMIN)
    r = httpx.post(f"{gw.url}/admin/keys/{k['key_id']}/rotate", headers=ADMIN)
    assert r.status_code == 404  # revoked stays revoked
    r = httpx.post(f"{gw.url}/admin/keys/{k['key_id']}/rotate")
    assert r.status_code == 401  # the admin key, as for every admin call


def test_keys_expire_on_time_even_while_cached(gw: Gateway) -> None:
    def sdk(key: dict[str, Any]) -> openai.OpenAI:
        return openai.OpenAI(base_url=gw.base_url, api_key=key["key"], max_retries=0)

    def ask(key: dict[str, Any]) -> Any:
        return sdk(key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}]
        )

    # LiteLLM's "duration": from now.
    k = create_key(gw, duration="12h")
    expires = datetime.fromisoformat(k["expires_at"])
    assert abs((expires - datetime.now(UTC)).total_seconds() - 12 * 3600) < 60
    assert not k["expired"] and ask(k).choices
    # A key about to expire: its lookup is cached (5 s), its expiry is still on time.
    # 3 s: its creation and first call must come before (on a slow run too), and it must
    # expire well inside the lookup's 5 s cache.
    soon = datetime.now(UTC) + timedelta(seconds=3)
    short = create_key(gw, expires_at=soon.isoformat())
    assert ask(short).choices
    time.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.1)
    with pytest.raises(openai.AuthenticationError) as exc:
        ask(short)
    assert exc.value.status_code == 401
    assert exc.value.body["code"] == "key_expired"  # type: ignore[index]
    assert "expired at" in exc.value.body["message"]  # type: ignore[index]
    listed = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN).json()["data"]
    assert next(x for x in listed if x["key_id"] == short["key_id"])["expired"] is True
    # The operator extends it (PATCH takes effect at once) or lifts the expiry.
    url = f"{gw.url}/admin/keys/{short['key_id']}"
    r = httpx.patch(url, json={"duration": "30d"}, headers=ADMIN)
    assert r.status_code == 200 and not r.json()["expired"]
    assert ask(short).choices
    r = httpx.patch(url, json={"expires_at": "2020-01-01T00:00:00Z"}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["expired"]
    with pytest.raises(openai.AuthenticationError):
        ask(short)
    r = httpx.patch(url, json={"expires_at": None}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["expires_at"] is None
    assert ask(short).choices
    # A date alone is that day's start in UTC, as /admin/spend's `since` reads one.
    r = httpx.patch(url, json={"expires_at": " 2099-03-04 "}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert datetime.fromisoformat(r.json()["expires_at"]) == datetime(2099, 3, 4, tzinfo=UTC)
    # What the admin API refuses, and why.
    for body, param in [
        ({"duration": "3 fortnights"}, "duration"),
        ({"duration": "101000d"}, "duration"),
        ({"expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
        ({"expires_at": "2031-01-01T00:00:00Z", "duration": "1d"}, None),
        ({"expires_at": "soon"}, "expires_at"),
        ({"expires_at": "2020-01-01"}, "expires_at"),
        ({"expires_at": "2031-02-30"}, "expires_at"),
        # Valid ISO times whose UTC time is past year 9999: refused, not an overflow (500).
        ({"expires_at": "9999-12-31T23:00:00-05:00"}, "expires_at"),
    ]:
        r = httpx.post(
            f"{gw.url}/admin/keys", json={"alias": secrets.token_hex(4), **body}, headers=ADMIN
        )
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)


def test_old_prompts_then_old_requests_are_dropped_after_their_retention_periods(
    stack: Stack, upstream: Upstream
) -> None:
    """Content retention clears a 45-day-old prompt and keeps its row; request retention
    deletes a 100-day-old request whole; today's request keeps both."""
    old_id = f"old-{secrets.token_hex(4)}"
    ancient_id = f"ancient-{secrets.token_hex(4)}"

    async def log_an_old_request() -> None:
        engine = await open_ledger_engine(stack.ledger_url)  # migrated, if no gateway did yet
        writer = LedgerWriter(
            engine, LedgerSettings(spill_dir=str(stack.tmp / "spill-old"), log_content="full")
        )
        await writer.start()
        writer.submit(make_request(old_id, created_at=time.time() - 45 * 86400, key_id=None))
        writer.submit(make_request(ancient_id, created_at=time.time() - 100 * 86400, key_id=None))
        await writer.close()
        await engine.dispose()

    _run(log_an_old_request())
    cfg = config(stack, upstream, auth={"enabled": False, "admin_key": ADMIN_KEY})
    cfg["ledger"].update(
        content_retention_days=30, request_retention_days=60, retention_interval_s=0.2
    )
    cfg["ledger"]["spill_dir"] = str(stack.tmp / "spill-retention")
    g = start_gateway(stack.tmp / "retention", cfg, name="retention")
    try:
        c = openai.OpenAI(base_url=g.base_url, api_key="none", max_retries=0)
        fresh = extra(
            c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "kept for 30 days"}]
            )
        )["xrouter"]["request_id"]
        sql = "SELECT content IS NOT NULL FROM requests WHERE request_id = :r"
        deadline = time.monotonic() + 10
        while _run(_query(stack.ledger_url, sql, r=old_id))[0][0] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _run(_query(stack.ledger_url, sql, r=old_id))[0][0]
        httpx.get(f"{g.url}/admin/spend", headers=ADMIN)  # flushes the ledger
        assert _run(_query(stack.ledger_url, sql, r=fresh))[0][0]
        cost = "SELECT total_cost_micros FROM requests WHERE request_id = :r"
        assert _run(_query(stack.ledger_url, cost, r=old_id))[0][0] > 0  # the row stays
        assert _run(_query(stack.ledger_url, cost, r=ancient_id)) == []  # this one went
        calls_sql = "SELECT count(*) FROM calls WHERE request_id = :r"
        assert _run(_query(stack.ledger_url, calls_sql, r=ancient_id))[0][0] == 0
        m = httpx.get(f"{g.url}/metrics").text
        assert _metric(m, "xrouter_ledger_content_dropped_total") >= 1
        assert _metric(m, "xrouter_ledger_requests_deleted_total") >= 1
    finally:
        g.stop()


def test_rate_limits_hold_across_workers(stack: Stack, upstream: Upstream) -> None:
    # Two workers share limits only through Redis; the embedded store is per process.
    workers = 2 if stack.name == "production" else 1
    g = start_gateway(stack.tmp / "two", config(stack, upstream), workers=workers, name="rate")
    try:
        k = create_key(g, rpm=12)

        async def burst() -> list[int]:
            async with httpx.AsyncClient(
                base_url=g.base_url, headers={"Authorization": f"Bearer {k['key']}"}, timeout=30
            ) as ac:
                rs = await asyncio.gather(
                    *(
                        ac.post(
                            "/chat/completions",
                            json={
                                "model": "gemma-2-9b-it",
                                "messages": [{"role": "user", "content": f"r{i}"}],
                            },
                        )
                        for i in range(30)
                    )
                )
            return [r.status_code for r in rs]

        codes = asyncio.run(burst())
        assert codes.count(200) == 12 and codes.count(429) == 18
        r = chat(g, k["key"])
        assert r.status_code == 429 and r.json()["error"]["code"] == "rpm_limit_exceeded"
        assert (
            int(r.headers["retry-after"]) >= 1 and r.headers["x-ratelimit-limit-requests"] == "12"
        )
        # tpm: a key with a small token budget per minute is cut off once it is used up.
        t = create_key(g, tpm=400)
        codes = [chat(g, t["key"], "tokens " * 30).status_code for _ in range(12)]
        assert 200 in codes and codes[-1] == 429
        m = httpx.get(f"{g.url}/metrics").text
        # Aggregated over both workers (multiprocess mode): every refusal is counted once.
        assert _metric(m, "xrouter_rate_limited_total", limit="rpm") == 19
    finally:
        g.stop()


def test_a_budget_without_a_period_never_resets(gw: Gateway) -> None:
    k = create_key(gw, budget_usd=0.5)
    assert (k["budget_usd"], k["budget_period"]) == (0.5, "total")
    assert create_key(gw)["budget_period"] is None  # no budget, no period


def test_the_responses_api_answers_to_the_same_keys_budgets_and_ledger(
    gw: Gateway, stack: Stack
) -> None:
    def respond(key: str | None, **body: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": MODEL, "input": "What is the capital of France?", **body}
        return httpx.post(f"{gw.base_url}/responses", json=body, headers=headers, timeout=30)

    r = respond(None)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    k = create_key(gw, budget_usd=1.0, budget_period="total")
    first = respond(k["key"])
    assert first.status_code == 200 and first.json()["object"] == "response"
    cost = first.json()["usage"]["cost"]
    assert cost > 0
    # A budget of exactly what the first answer cost: the next is refused before any call.
    r = httpx.patch(f"{gw.url}/admin/keys/{k['key_id']}", json={"budget_usd": cost}, headers=ADMIN)
    assert r.status_code == 200, r.text
    r = respond(k["key"])
    assert r.status_code == 429 and r.json()["error"]["code"] == "key_budget_exceeded"
    r = respond(create_key(gw)["key"], xrouter={"max_cost_usd": 0.0000001})
    assert r.status_code == 429 and r.json()["error"]["code"] == "request_budget_exceeded"
    assert r.headers["x-should-retry"] == "false"  # the OpenAI SDKs would retry it at once
    narrow = create_key(gw, allowed_models=["gemma-2-9b-it"])
    r = respond(narrow["key"])
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    # The answer is in the ledger under the key, at the cost the client was told, marked as
    # a Responses API request; the spend report splits by API shape.
    assert chat(gw, create_key(gw)["key"]).status_code == 200
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)  # flushes the ledger
    rows = _run(
        _query(
            stack.ledger_url,
            "SELECT key_id, status, total_cost_micros, api FROM requests WHERE request_id = :r",
            r=first.json()["id"].removeprefix("resp_"),
        )
    )
    assert [tuple(row) for row in rows] == [(k["key_id"], 200, round(cost * 1e6), "responses")]
    by_api = httpx.get(f"{gw.url}/admin/spend?group_by=api", headers=ADMIN).json()["data"]
    assert {"chat", "responses"} <= {r["api"] for r in by_api}
    counted = _run(_query(stack.ledger_url, "SELECT api, COUNT(*) FROM requests GROUP BY api"))
    assert {r["api"]: r["requests"] for r in by_api} == {api: n for api, n in counted}


def test_the_messages_api_answers_to_the_same_keys_budgets_and_ledger(
    gw: Gateway, stack: Stack
) -> None:
    """Anthropic's clients send the key as x-api-key and read Anthropic-shaped errors: the
    same keys, budgets, model restrictions and ledger as chat, in that shape."""

    def message(key: str | None, **body: Any) -> httpx.Response:
        headers = {"x-api-key": key} if key else {}
        body = {
            "model": MODEL,
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            **body,
        }
        return httpx.post(f"{gw.base_url}/messages", json=body, headers=headers, timeout=30)

    r = message(None)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    k = create_key(gw, budget_usd=1.0, budget_period="total")
    first = message(k["key"])
    assert first.status_code == 200 and first.json()["type"] == "message"
    cost = first.json()["usage"]["cost"]
    assert cost > 0
    r = httpx.patch(f"{gw.url}/admin/keys/{k['key_id']}", json={"budget_usd": cost}, headers=ADMIN)
    assert r.status_code == 200, r.text
    r = message(k["key"])
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert r.json()["error"]["code"] == "key_budget_exceeded"
    assert r.headers["x-ratelimit-remaining-budget-usd"] == "0.000000"
    r = message(create_key(gw)["key"], xrouter={"max_cost_usd": 0.0000001})
    assert r.status_code == 429 and r.json()["error"]["code"] == "request_budget_exceeded"
    assert r.headers["x-should-retry"] == "false"  # the OpenAI SDKs would retry it at once
    narrow = create_key(gw, allowed_models=["gemma-2-9b-it"])
    r = message(narrow["key"])
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    httpx.get(f"{gw.url}/admin/spend", headers=ADMIN)  # flushes the ledger
    rows = _run(
        _query(
            stack.ledger_url,
            "SELECT key_id, status, total_cost_micros, api FROM requests WHERE request_id = :r",
            r=first.json()["id"].removeprefix("msg_"),
        )
    )
    assert [tuple(row) for row in rows] == [(k["key_id"], 200, round(cost * 1e6), "messages")]


def test_spend_per_end_user_across_the_three_apis(gw: Gateway) -> None:
    # The caller's own users, as each API names them: chat's and the Responses API's `user`,
    # else their `safety_identifier` (OpenAI's newer name, which it recommends in place of
    # `user`: it counted for nobody before), the Messages API's `metadata.user_id`. A value
    # the database could not store is cleaned.
    k = create_key(gw)
    auth = {"Authorization": f"Bearer {k['key']}"}
    question = [{"role": "user", "content": "What is the capital of France?"}]
    sent: list[tuple[str, str | None, dict[str, Any]]] = [
        ("chat/completions", "alice", {"model": MODEL, "messages": question, "user": "alice"}),
        ("chat/completions", "alice", {"model": MODEL, "messages": question, "user": "alice",
                                       "safety_identifier": "alice-sid"}),
        ("chat/completions", "dave", {"model": MODEL, "messages": question,
                                      "safety_identifier": "dave"}),
        ("responses", "bob", {"model": MODEL, "input": "What is the capital of France?",
                              "user": "bob"}),
        ("responses", "erin", {"model": MODEL, "input": "What is the capital of France?",
                               "safety_identifier": "erin"}),
        ("messages", "carol", {"model": MODEL, "max_tokens": 64, "messages": question,
                               "metadata": {"user_id": "carol\x00"}}),
        ("chat/completions", None, {"model": MODEL, "messages": question}),
    ]  # fmt: skip
    costs: dict[str | None, float] = {}
    for path, user, body in sent:
        r = httpx.post(f"{gw.base_url}/{path}", json=body, headers=auth, timeout=30)
        assert r.status_code == 200, r.text
        costs[user] = costs.get(user, 0.0) + r.json()["usage"]["cost"]
        if path == "responses":  # echoed, as OpenAI echoes both
            assert (r.json()["user"], r.json()["safety_identifier"]) == (
                body.get("user"),
                body.get("safety_identifier"),
            )
    r = httpx.get(
        f"{gw.url}/admin/spend",
        params={"group_by": "user", "key": k["key_id"]},
        headers=ADMIN,
    )
    assert r.status_code == 200, r.text
    rows = {row["user"]: row for row in r.json()["data"]}
    assert {u: row["requests"] for u, row in rows.items()} == {
        "alice": 2, "bob": 1, "carol": 1, "dave": 1, "erin": 1, None: 1,
    }  # fmt: skip
    for user, row in rows.items():
        assert row["total_cost_usd"] == pytest.approx(costs[user], abs=2e-6)
    m = httpx.get(f"{gw.url}/metrics").text
    for api in ("chat", "responses", "messages"):  # each API's requests are told apart
        assert _metric(m, "xrouter_requests_total", api=api) >= 1, api
    one = httpx.get(
        f"{gw.url}/admin/spend", params={"group_by": "api", "user": "alice"}, headers=ADMIN
    )
    assert [(row["api"], row["requests"]) for row in one.json()["data"]] == [("chat", 2)]


def test_a_keys_routing_defaults_apply_where_its_requests_are_silent(
    gw: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    thrifty = create_key(gw, routing={"cost_weight": 20.0})
    lavish = create_key(gw, routing={"cost_weight": 0.0})
    prompts = [r.text for r in demo_table[::25]]

    def costs(key: dict[str, Any], **controls: Any) -> tuple[float, set[float]]:
        c = openai.OpenAI(base_url=gw.base_url, api_key=key["key"], max_retries=0)
        spent, weights = 0.0, set()
        for p in prompts:
            r = c.chat.completions.create(
                model="xrouter",
                messages=[{"role": "user", "content": p}],
                extra_body={"xrouter": controls} if controls else None,
            )
            meta = extra(r)["xrouter"]
            spent += extra(r.usage)["cost"]
            weights.add(meta["decision"]["cost_weight"])
        return spent, weights

    cheap, cheap_weights = costs(thrifty)
    dear, dear_weights = costs(lavish)
    assert (cheap_weights, dear_weights) == ({20.0}, {0.0})
    assert cheap < dear  # the same prompts, routed by each key's trade-off
    # The request's own trade-off wins over its key's.
    _, asked = costs(thrifty, cost_weight=0.0)
    assert asked == {0.0}

    # The policy the name `xrouter` means for this key, and a ceiling on the request's cap.
    baseline = create_key(gw, routing={"default_policy": "cheapest", "max_cost_usd": 1e-7})
    c = openai.OpenAI(base_url=gw.base_url, api_key=baseline["key"], max_retries=0)
    with pytest.raises(openai.RateLimitError) as exc:
        c.chat.completions.create(
            model="xrouter",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            extra_body={"xrouter": {"max_cost_usd": 1.0}},  # asks for more: the key's holds
        )
    assert exc.value.body["code"] == "request_budget_exceeded"  # type: ignore[index]
    r = httpx.patch(
        f"{gw.url}/admin/keys/{baseline['key_id']}",
        json={"routing": {"default_policy": "cheapest"}},
        headers=ADMIN,
    )
    assert r.status_code == 200 and r.json()["routing"] == {"default_policy": "cheapest"}
    raw = c.chat.completions.with_raw_response.create(
        model="xrouter", messages=[{"role": "user", "content": "What is the capital of France?"}]
    )
    assert raw.headers["x-xrouter-policy"] == "cheapest"
    listed = c.models.retrieve("xrouter")
    assert (listed.model_extra or {})["xrouter"]["policy"] == "cheapest"  # as it is served
    mine = httpx.get(f"{gw.base_url}/key", headers={"Authorization": f"Bearer {baseline['key']}"})
    assert mine.json()["data"]["routing"] == {"default_policy": "cheapest"}


def test_routing_defaults_are_checked_against_the_policies(gw: Gateway) -> None:
    def make(**fields: Any) -> httpx.Response:
        return httpx.post(
            f"{gw.url}/admin/keys",
            json={"alias": f"r-{secrets.token_hex(4)}", **fields},
            headers=ADMIN,
        )

    for fields in (
        {"routing": {"default_policy": "no-such-policy"}},
        {"routing": {"default_policy": "fixed:no-such-model"}},
        {"routing": {"default_policy": "cheapest"}, "allowed_policies": ["compact"]},
    ):
        r = make(**fields)
        assert r.status_code == 400 and r.json()["error"]["param"] == "routing.default_policy"
    assert make(routing={"cost_weight": -1}).json()["error"]["param"] == "routing.cost_weight"
    assert make(routing={"lambda": 1}).status_code == 400
    # One pool model, always: as `xrouter/fixed:<model>` names it.
    assert make(routing={"default_policy": f"fixed:{MODEL}"}).status_code == 201
    k = make(routing={"default_policy": "cheapest"}).json()
    url = f"{gw.url}/admin/keys/{k['key_id']}"
    # Narrowing the key's policies may not strand its default policy.
    r = httpx.patch(url, json={"allowed_policies": ["compact"]}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "routing.default_policy"
    r = httpx.patch(url, json={"routing": None, "allowed_policies": ["compact"]}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["routing"] is None


def test_spend_per_tag(gw: Gateway) -> None:
    k = create_key(gw)
    auth = {"Authorization": f"Bearer {k['key']}"}
    question = [{"role": "user", "content": "What is the capital of France?"}]
    sent = [
        ("chat/completions", {"model": MODEL, "messages": question,
                              "xrouter": {"tags": ["search", "beta"]}}),
        ("chat/completions", {"model": MODEL, "messages": question,
                              "xrouter": {"tags": ["search", "search"]}}),
        ("messages", {"model": MODEL, "max_tokens": 64, "messages": question,
                      "xrouter": {"tags": ["beta"]}}),
        ("chat/completions", {"model": MODEL, "messages": question}),
        # LiteLLM's proxy files a request under metadata.tags; xrouter.tags wins over it.
        ("chat/completions", {"model": MODEL, "messages": question,
                              "metadata": {"tags": ["litellm"], "team": ["a"]}}),
        ("chat/completions", {"model": MODEL, "messages": question,
                              "metadata": {"tags": ["litellm"]}, "xrouter": {"tags": ["beta"]}}),
    ]  # fmt: skip
    for path, body in sent:
        r = httpx.post(f"{gw.base_url}/{path}", json=body, headers=auth, timeout=30)
        assert r.status_code == 200, r.text
    r = httpx.get(
        f"{gw.url}/admin/spend", params={"group_by": "tag", "key": k["key_id"]}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    counts = {row["tag"]: row["requests"] for row in r.json()["data"]}
    assert counts == {"search": 2, "beta": 3, "litellm": 1, None: 1}  # a repeat counts once
    r = httpx.get(
        f"{gw.url}/admin/spend",
        params={"group_by": "api", "key": k["key_id"], "tag": "beta"},
        headers=ADMIN,
    )
    assert {row["api"]: row["requests"] for row in r.json()["data"]} == {"chat": 2, "messages": 1}
    for tags in (["x" * 65], [""], [f"t{i}" for i in range(17)], "search"):
        bad = chat(gw, k["key"], xrouter={"tags": tags})
        assert bad.status_code == 400, (tags, bad.text)
        assert bad.json()["error"]["param"].startswith("xrouter.tags"), bad.text


def test_concurrent_rotations_hand_out_one_live_secret_and_409_the_rest(
    gw: Gateway, stack: Stack
) -> None:
    # Every secret a rotation answers 200 with must be one the key answers to: of rotations
    # that contend for the same write, one wins and the rest are told to retry.
    k = create_key(gw, budget_usd=1.0)
    url = f"{gw.url}/admin/keys/{k['key_id']}/rotate"

    async def contend() -> list[httpx.Response]:
        engine = await open_ledger_engine(stack.ledger_url, run_migrations=False)
        try:
            async with httpx.AsyncClient(headers=ADMIN, timeout=30) as ac:
                # Holding the key's row (SQLite: the write lock) makes all ten read the same
                # hash before any writes; they wait for it well inside SQLite's 5 s timeout.
                async with engine.begin() as holder:
                    await holder.execute(
                        text("UPDATE api_keys SET alias = alias WHERE key_id = :k"),
                        {"k": k["key_id"]},
                    )
                    calls = [asyncio.create_task(ac.post(url)) for _ in range(10)]
                    await asyncio.sleep(1.0)
                return list(await asyncio.gather(*calls))
        finally:
            await engine.dispose()

    rs = _run(contend())
    ok = [r for r in rs if r.status_code == 200]
    conflicts = [r for r in rs if r.status_code == 409]
    assert (len(ok), len(conflicts)) == (1, 9), [(r.status_code, r.text) for r in rs]
    for r in conflicts:
        error = r.json()["error"]
        assert (error["code"], error["param"], error["type"]) == (
            "rotate_conflict",
            "key_id",
            "invalid_request_error",
        )
        assert "retry" in error["message"] and "key" not in r.json()  # no secret in it
    live = ok[0].json()["key"]
    assert httpx.get(f"{gw.base_url}/key", headers={"Authorization": f"Bearer {live}"}).is_success
    old = httpx.get(f"{gw.base_url}/key", headers={"Authorization": f"Bearer {k['key']}"})
    assert old.status_code == 401
    retried = httpx.post(url, headers=ADMIN)  # what a loser does: it gets a live secret
    assert retried.status_code == 200, retried.text
    fresh = {"Authorization": f"Bearer {retried.json()['key']}"}
    assert httpx.get(f"{gw.base_url}/key", headers=fresh).is_success
