"""The answer cache end to end: ``xrouter serve`` with ``cache.enabled`` under uvicorn, the
replay upstream, the real OpenAI SDK — hits for nothing, streams, routing controls, the
request's own cache controls, key scopes, Redis shared by two gateways, a Redis outage, the
ledger, the spend report, metrics, and the Responses and Messages APIs."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis
import yaml
from anthropic.types import TextBlock
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionMessageParam

from router.outcomes import OutcomeRecord
from tests.gateway.conftest import Upstream, ledger_rows
from tests.support.gateway import (
    ADMIN_KEY,
    DEMO_MODELS,
    Gateway,
    free_port,
    gateway_config,
    start_gateway,
)
from tests.support.scripted_upstream import scripted_upstream
from tests.support.sdk import WEATHER_TOOL, extra
from tests.support.strategies import last_turn, turn

MODEL = "mistral-small-24b-instruct-2501-bf16"
OTHER = "qwen2.5-7b-instruct"


def client(gw: Gateway, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)


def prompts(table: list[OutcomeRecord], model: str) -> Iterator[OutcomeRecord]:
    """Recorded prompts for ``model``, each used by one test only (the cache is shared by
    the module's gateway)."""
    return (r for r in table if model in r.outcomes and r.outcomes[model].response)


@pytest.fixture(scope="module")
def table_iter(demo_table: list[OutcomeRecord]) -> Iterator[OutcomeRecord]:
    return prompts(demo_table, MODEL)


@pytest.fixture(scope="module")
def cached(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("cached")
    gw = start_gateway(tmp, gateway_config(tmp, upstream.base_url, cache={"enabled": True}))
    yield gw
    gw.stop()


def cached_from(gw: Gateway, request_id: str) -> str | None:
    ledger_rows(gw, request_id)  # waits for the row
    with sqlite3.connect(gw.config_path.parent / "ledger.db") as conn:
        row = conn.execute(
            "SELECT cached_from FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
    return row[0] if row else None


def ask(gw: Gateway, text: str, model: str = MODEL, key: str = "unused", **body: Any) -> Any:
    return client(gw, key).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": text}], **body
    )


def test_a_repeated_request_is_answered_from_the_cache_for_nothing(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    rec = next(table_iter)
    first_raw = ask(cached, rec.text)
    first = first_raw.parse()
    assert first_raw.headers["x-xrouter-cache"] == "miss"
    assert first.choices[0].message.content == rec.outcomes[MODEL].response
    first_cost = extra(first.usage)["cost"]
    assert first_cost > 0

    # The same question, its JSON keys in another order: the same answer, for nothing.
    body = {"messages": [{"content": rec.text, "role": "user"}], "model": MODEL}
    r = httpx.post(f"{cached.base_url}/chat/completions", json=body, timeout=10)
    assert r.status_code == 200 and r.headers["x-xrouter-cache"] == "hit"
    assert r.headers["x-xrouter-cost-usd"] == "0.000000"
    again = r.json()
    assert again["choices"][0]["message"]["content"] == rec.outcomes[MODEL].response
    assert again["model"] == MODEL and again["id"] != first.id
    assert again["usage"]["prompt_tokens"] == first.usage.prompt_tokens
    assert again["usage"]["cost"] == 0
    first_id = first_raw.headers["x-xrouter-request-id"]
    cache = again["xrouter"]["cache"]
    assert cache["hit"] is True and cache["request_id"] == first_id
    assert cache["saved_usd"] == pytest.approx(first_cost)
    assert again["xrouter"]["calls"] == [] and again["xrouter"]["cost_usd"] == 0
    assert upstream.stats()["requests"][MODEL] == 1  # the upstream was asked once

    # The ledger: a row for each request; the hit made no call, cost nothing and names
    # the request that paid.
    hit_id = r.headers["x-xrouter-request-id"]
    (status, _, total), calls = ledger_rows(cached, hit_id)
    assert (status, total, calls) == (200, 0, [])
    assert cached_from(cached, hit_id) == first_id and cached_from(cached, first_id) is None
    # Its generation stats read back the usage it reported (the answer's tokens), as for
    # a client that missed a stream's usage chunk; the cost, what it paid: nothing.
    g = httpx.get(f"{cached.base_url}/generation", params={"id": hit_id}, timeout=10).json()
    data = g["data"]
    assert (data["tokens_prompt"], data["tokens_completion"], data["total_cost"]) == (
        again["usage"]["prompt_tokens"],
        again["usage"]["completion_tokens"],
        0,
    )
    assert data["cached_from"] == first_id and data["calls"] == []

    # Feedback on the hit is accepted (it is a request of this key) ...
    fb = httpx.post(f"{cached.base_url}/feedback", json={"request_id": hit_id, "score": 1})
    assert fb.status_code == 200
    # ... and its logged reward is the paid request's, whose answer it scores and which the
    # export files it under (it was the hit's own: cost 0, cost weight 0, reward 1).
    reward = fb.json()["reward"]
    assert reward["cost_usd"] == pytest.approx(first_cost) and reward["cost_weight"] == 0.5
    assert reward["reward"] == pytest.approx(1.0 - min(0.5 * first_cost / 0.001, 1.0))


def test_streamed_and_plain_requests_share_answers(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    # Streamed first: the relayed stream's text is stored once it completes.
    rec = next(table_iter)
    chunks = list(
        client(cached).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": rec.text}], stream=True
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == rec.outcomes[MODEL].response
    deadline = time.monotonic() + 5
    while True:  # stored in the background after the stream's last event
        r = ask(cached, rec.text)
        if r.headers["x-xrouter-cache"] == "hit" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r.headers["x-xrouter-cache"] == "hit"
    assert r.parse().choices[0].message.content == streamed

    # Plain first, then streamed from the cache: the same text, and a last chunk that
    # says it cost nothing.
    rec = next(table_iter)
    plain = ask(cached, rec.text).parse()
    with client(cached).chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": rec.text}], stream=True
    ) as resp:
        assert resp.headers["x-xrouter-cache"] == "hit"
        chunks = list(resp.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage is not None and extra(chunks[-1].usage)["cost"] == 0
    assert extra(chunks[-1])["xrouter"]["cache"]["hit"] is True
    assert upstream.stats()["requests"][MODEL] == 2  # one per prompt


def reached_upstream(upstream: Upstream, n: int = 1) -> None:
    """Wait until ``n`` calls to MODEL have reached the upstream (counted on arrival, before
    any injected latency): a request that is upstream has passed its cache lookup."""
    deadline = time.monotonic() + 10
    while upstream.stats()["requests"].get(MODEL, 0) < n:
        assert time.monotonic() < deadline, "the first request never reached the upstream"
        time.sleep(0.01)


def coalesced(gw: Gateway) -> float:
    """How many lookups were answered with an identical request's answer in flight."""
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith('xrouter_cache_lookups_total{result="coalesced"}'):
            return float(line.split(" ")[1])
    raise AssertionError("no coalesced lookups series")


def test_identical_requests_in_flight_buy_one_answer(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    """A burst of the same question (a retry storm, a page many users load) while the first
    is still being answered: the others wait for its answer instead of each buying it —
    plain or streamed."""
    rec = next(table_iter)
    before = coalesced(cached)
    upstream.fault(MODEL, "latency=1500")  # the first call is slow; any other would not be
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(ask, cached, rec.text)
        reached_upstream(upstream)  # the first leads: it is upstream now
        plain = [pool.submit(ask, cached, rec.text) for _ in range(3)]

        def streamed() -> tuple[str, str]:
            with client(cached).chat.completions.with_streaming_response.create(
                model=MODEL, messages=[{"role": "user", "content": rec.text}], stream=True
            ) as resp:
                chunks = list(resp.parse())
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                return resp.headers["x-xrouter-cache"], text

        stream = pool.submit(streamed)
        leader = first.result(timeout=30)
        followers = [f.result(timeout=30) for f in plain]
        stream_cache, stream_text = stream.result(timeout=30)

    assert upstream.stats()["requests"][MODEL] == 1  # bought once
    assert leader.headers["x-xrouter-cache"] == "miss"
    answer = rec.outcomes[MODEL].response
    assert leader.parse().choices[0].message.content == answer
    assert (stream_cache, stream_text) == ("hit", answer)
    leader_id = leader.headers["x-xrouter-request-id"]
    for f in followers:
        assert f.headers["x-xrouter-cache"] == "hit"
        body = f.parse()
        assert body.choices[0].message.content == answer
        assert extra(body.usage)["cost"] == 0
        assert extra(body)["xrouter"]["cache"]["request_id"] == leader_id
        assert cached_from(cached, f.headers["x-xrouter-request-id"]) == leader_id
    assert coalesced(cached) - before == 4


def test_when_the_first_client_hangs_up_one_waiting_request_buys_the_answer(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    """The first request is streamed and its client gives up before the answer (a client
    timeout, the retry already on its way): of the identical requests waiting for it, one
    buys the answer and the others are served it — not every one of them buying it."""
    rec = next(table_iter)
    before = coalesced(cached)
    upstream.fault(MODEL, "latency=1500")  # the first call is slow; any other would not be
    body = {"model": MODEL, "messages": [{"role": "user", "content": rec.text}], "stream": True}

    def impatient() -> None:
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream(
                "POST", f"{cached.base_url}/chat/completions", json=body, timeout=0.5
            ) as resp:
                resp.read()

    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(impatient)
        reached_upstream(upstream)  # the first leads: it is upstream now
        waiting = [pool.submit(ask, cached, rec.text) for _ in range(3)]
        first.result(timeout=30)
        answers = [w.result(timeout=30) for w in waiting]

    assert upstream.stats()["requests"][MODEL] == 2  # the one that left, and one heir
    assert sorted(a.headers["x-xrouter-cache"] for a in answers) == ["hit", "hit", "miss"]
    answer = rec.outcomes[MODEL].response
    assert [a.parse().choices[0].message.content for a in answers] == [answer] * 3
    (heir,) = [a for a in answers if a.headers["x-xrouter-cache"] == "miss"]
    heir_id = heir.headers["x-xrouter-request-id"]
    for a in answers:
        if a is not heir:
            assert cached_from(cached, a.headers["x-xrouter-request-id"]) == heir_id
    assert coalesced(cached) - before == 2


def _gone_while_waiting(gw: Gateway) -> int:
    """Requests booked as gone (499) without a call or a cached answer: ones whose client
    left while they waited for an identical request's answer."""
    with sqlite3.connect(gw.config_path.parent / "ledger.db") as conn:
        (n,) = conn.execute(
            "SELECT count(*) FROM requests r WHERE r.status = 499 AND r.cached_from IS NULL "
            "AND NOT EXISTS (SELECT 1 FROM calls c WHERE c.request_id = r.request_id)"
        ).fetchone()
    return int(n)


def test_a_waiting_request_whose_client_leaves_stops_waiting(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    """Of the requests waiting for the first one's answer, one's client leaves: it is booked
    as gone (499) when it leaves, not served the answer later, and it is no heir to the
    lead — when the first client leaves too, a waiting request that is still there buys the
    answer for the rest."""
    rec = next(table_iter)
    upstream.fault(MODEL, "latency=2500")  # the first call is slow; any other would not be
    body = {"model": MODEL, "messages": [{"role": "user", "content": rec.text}]}
    gone_before = _gone_while_waiting(cached)

    def leaves_after(timeout_s: float) -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{cached.base_url}/chat/completions", json=body, timeout=timeout_s)

    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(leaves_after, 1.5)
        reached_upstream(upstream)  # the first leads: it is upstream now
        waiter = pool.submit(leaves_after, 0.4)  # the first heir, gone at 0.4 s
        time.sleep(0.1)
        staying = [pool.submit(ask, cached, rec.text) for _ in range(2)]
        waiter.result(timeout=30)
        first.result(timeout=30)
        answers = [w.result(timeout=30) for w in staying]

    assert upstream.stats()["requests"][MODEL] == 2  # the first, and one heir still there
    assert sorted(a.headers["x-xrouter-cache"] for a in answers) == ["hit", "miss"]
    deadline = time.monotonic() + 5
    while _gone_while_waiting(cached) == gone_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone_while_waiting(cached) - gone_before == 1  # the waiter, as it left


def test_requests_waiting_for_a_failed_answer_route_for_themselves(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    """The first request's call fails after a while: the identical requests that waited for
    it are not handed its error, they are answered on their own."""
    rec = next(table_iter)
    upstream.fault(MODEL, "timeout=1", count=2)  # slow and failing, retry included
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(ask, cached, rec.text)
        reached_upstream(upstream)  # the first leads: it is upstream now
        others = [pool.submit(ask, cached, rec.text) for _ in range(2)]
        with pytest.raises(openai.APIStatusError):
            first.result(timeout=30)
        answers = [o.result(timeout=30) for o in others]
    assert [a.parse().choices[0].message.content for a in answers] == [
        rec.outcomes[MODEL].response
    ] * 2
    assert upstream.stats()["requests"][MODEL] >= 2


def test_a_request_that_waited_for_a_failed_answer_keeps_to_its_timeout(
    upstream: Upstream, demo_table: list[OutcomeRecord], tmp_path: Path
) -> None:
    """The wait for an identical request's answer is part of the request's own time: when
    that answer never comes (the first request timed out), the one that waited has only
    what is left of server.request_timeout_s to route in — a 504 at its deadline, not an
    answer long past it."""
    cfg = gateway_config(tmp_path, upstream.base_url, cache={"enabled": True})
    cfg["server"] = {**cfg.get("server", {}), "request_timeout_s": 3}
    gw = start_gateway(tmp_path, cfg)
    try:
        rec = next(prompts(demo_table, MODEL))
        upstream.fault(MODEL, "timeout")  # the first request's call never answers
        upstream.fault(MODEL, "latency=2000", count=2)  # and the next one is slow
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(ask, gw, rec.text)
            reached_upstream(upstream)  # the first leads: it is upstream now

            def timed() -> tuple[int, float]:
                t0 = time.monotonic()
                try:
                    ask(gw, rec.text)
                except openai.APIStatusError as exc:
                    return exc.status_code, time.monotonic() - t0
                return 200, time.monotonic() - t0

            second = pool.submit(timed)
            with pytest.raises(openai.APIStatusError) as leader_error:
                first.result(timeout=30)
            status, elapsed = second.result(timeout=30)
        assert leader_error.value.status_code == 504
        assert "within 3 s" in str(leader_error.value)
        assert status == 504 and elapsed < 3 + 0.9
    finally:
        gw.stop()


def test_the_router_s_answers_are_cached_per_policy_and_routing_controls(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    rec = next(table_iter)
    first = ask(cached, rec.text, model="xrouter")
    assert first.headers["x-xrouter-cache"] == "miss"
    assert ask(cached, rec.text, model="xrouter").headers["x-xrouter-cache"] == "hit"
    # Another trade-off, allow-list or policy may route elsewhere: not the same question.
    weight = {"xrouter": {"cost_weight": 3.0}}
    assert (
        ask(cached, rec.text, model="xrouter", extra_body=weight).headers["x-xrouter-cache"]
        == "miss"
    )
    allow = {"xrouter": {"models": [OTHER]}}
    r = ask(cached, rec.text, model="xrouter", extra_body=allow)
    assert r.headers["x-xrouter-cache"] == "miss" and r.parse().model == OTHER
    r = ask(cached, rec.text, model="xrouter/cheapest")
    assert r.headers["x-xrouter-cache"] == "miss"
    # A sampling parameter is part of the question too.
    assert (
        ask(cached, rec.text, model="xrouter", temperature=0.2).headers["x-xrouter-cache"] == "miss"
    )
    # The routed hit keeps the routed answer's model and carries no decision.
    hit = ask(cached, rec.text, model="xrouter").parse()
    assert hit.model == first.parse().model
    meta = extra(hit)["xrouter"]
    assert meta["cache"]["hit"] is True and meta["decision"]["actions"] == []


def test_a_request_can_refuse_the_cache_or_keep_its_answer_out(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    rec = next(table_iter)
    keep_out = {"xrouter": {"cache": {"no_store": True}}}
    assert ask(cached, rec.text, extra_body=keep_out).headers["x-xrouter-cache"] == "miss"
    time.sleep(0.2)
    assert ask(cached, rec.text).headers["x-xrouter-cache"] == "miss"  # nothing was kept
    time.sleep(0.2)
    assert ask(cached, rec.text).headers["x-xrouter-cache"] == "hit"
    fresh = {"xrouter": {"cache": {"no_cache": True}}}
    r = ask(cached, rec.text, extra_body=fresh)
    assert r.headers["x-xrouter-cache"] == "bypass" and extra(r.parse().usage)["cost"] > 0
    # Only answers younger than max_age_s are acceptable.
    time.sleep(0.3)
    old = {"xrouter": {"cache": {"max_age_s": 0.1}}}
    assert ask(cached, rec.text, extra_body=old).headers["x-xrouter-cache"] == "miss"
    assert upstream.stats()["requests"][MODEL] == 4
    # A stream of several choices is never served from the cache, nor kept: bypassed too.
    with httpx.stream(
        "POST", f"{cached.base_url}/chat/completions", timeout=10,
        json={"model": MODEL, "messages": [{"role": "user", "content": rec.text}],
              "stream": True, "n": 2},
    ) as streamed:  # fmt: skip
        assert streamed.status_code == 200 and streamed.headers["x-xrouter-cache"] == "bypass"
        streamed.read()
    # A control the cache does not know is a 400 naming it, like every routing control.
    with pytest.raises(openai.BadRequestError) as err:
        ask(cached, rec.text, extra_body={"xrouter": {"cache": {"ttl": 5}}})
    assert "xrouter.cache.ttl" in str(err.value)


def test_the_responses_and_messages_apis_share_the_chat_answers(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    rec = next(table_iter)
    chat = ask(cached, rec.text).parse()
    raw = client(cached).responses.with_raw_response.create(model=MODEL, input=rec.text)
    assert raw.headers["x-xrouter-cache"] == "hit"
    resp = raw.parse()
    assert resp.output_text == chat.choices[0].message.content
    assert resp.usage is not None and extra(resp.usage)["cost"] == 0
    # And Anthropic's Messages API (asking for the same max_tokens as the chat request).
    plain = ask(cached, rec.text, max_tokens=1024).parse().choices[0].message.content
    claude = anthropic.Anthropic(base_url=cached.url, api_key="unused", max_retries=0)
    raw_msg = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=1024, messages=[{"role": "user", "content": rec.text}]
    )
    assert raw_msg.headers["x-xrouter-cache"] == "hit"
    msg = raw_msg.parse()
    assert [b.text for b in msg.content if isinstance(b, TextBlock)] == [plain]
    assert extra(msg.usage)["cost"] == 0
    assert upstream.stats()["requests"][MODEL] == 2  # the plain request, and its max_tokens one


def _cache_samples(gw: Gateway) -> dict[str, float]:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    return {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("xrouter_cache_")
    }


def _chat_cache_hits(gw: Gateway) -> int:
    spend = httpx.get(
        f"{gw.url}/admin/spend",
        params={"group_by": "api"},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=10,
    ).json()
    return next((r["cache_hits"] for r in spend["data"] if r["api"] == "chat"), 0)


def _dashboard_cache(gw: Gateway) -> tuple[int, float]:
    """The operators' page's answer-cache section: (hits, saved USD)."""
    page = httpx.get(f"{gw.url}/dashboard", timeout=10).text
    assert "<h2>Answer cache</h2>" in page
    section = page.split("<h2>Answer cache</h2>")[1].split("<h2>")[0]
    # Bounded, as every aggregate on the page: no all-time scan on each refresh.
    assert "all time" not in section and "last 14 days" in section
    cells = [c.split(">")[-1] for c in section.split("</td>")]
    return int(cells[1]), float(cells[2].lstrip("$"))


def test_spend_report_and_metrics_count_hits_and_savings(
    cached: Gateway, table_iter: Iterator[OutcomeRecord]
) -> None:
    # The module's gateway is shared: its counters already hold other tests' hits, so this
    # test counts what its own requests add (exactly one miss, then two plain hits).
    rec = next(table_iter)
    before, hits_before, page_before = (
        _cache_samples(cached),
        _chat_cache_hits(cached),
        _dashboard_cache(cached),
    )
    paid = extra(ask(cached, rec.text).parse().usage)["cost"]
    assert ask(cached, rec.text).headers["x-xrouter-cache"] == "hit"
    assert ask(cached, rec.text).headers["x-xrouter-cache"] == "hit"
    # The ledger writes off the request path: wait for the two hits' rows, not for a time.
    deadline = time.monotonic() + 10
    while _chat_cache_hits(cached) < hits_before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _chat_cache_hits(cached) - hits_before == 2
    after = _cache_samples(cached)

    def added(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert added('xrouter_cache_lookups_total{result="hit"}') == 2
    assert added('xrouter_cache_stores_total{result="stored"}') == 1
    saved = added('xrouter_cache_saved_usd_total{policy="passthrough"}')
    assert saved == pytest.approx(2 * paid, abs=1e-9) and saved > 0
    # The operators' page says how many answers came from the cache and what they saved.
    page_hits, page_saved = _dashboard_cache(cached)
    assert page_hits - page_before[0] == 2
    assert page_saved - page_before[1] == pytest.approx(2 * paid, abs=2e-6)


def test_each_key_has_its_own_answers(
    upstream: Upstream, tmp_path: Path, demo_table: list[OutcomeRecord]
) -> None:
    cfg = gateway_config(
        tmp_path, upstream.base_url, auth={"enabled": True}, cache={"enabled": True}
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        keys = [
            httpx.post(f"{gw.url}/admin/keys", json={"alias": a}, headers=admin).json()["key"]
            for a in ("team-a", "team-b")
        ]
        rec = next(prompts(demo_table, MODEL))
        assert ask(gw, rec.text, key=keys[0]).headers["x-xrouter-cache"] == "miss"
        assert ask(gw, rec.text, key=keys[0]).headers["x-xrouter-cache"] == "hit"
        assert ask(gw, rec.text, key=keys[1]).headers["x-xrouter-cache"] == "miss"

        # A cached routed answer is served only while its model is one the key may use.
        routed = ask(gw, rec.text, model="xrouter", key=keys[0])
        answered_by = routed.parse().model
        assert ask(gw, rec.text, model="xrouter", key=keys[0]).headers["x-xrouter-cache"] == "hit"
        key_id = httpx.get(f"{gw.url}/admin/keys", headers=admin).json()["data"]
        [kid] = [k["key_id"] for k in key_id if k["alias"] == "team-a"]
        others = [m for m in (MODEL, OTHER) if m != answered_by]
        r = httpx.patch(
            f"{gw.url}/admin/keys/{kid}", json={"allowed_models": others}, headers=admin
        )
        assert r.status_code == 200, r.text
        again = ask(gw, rec.text, model="xrouter", key=keys[0])
        assert again.headers["x-xrouter-cache"] == "miss"
        assert again.parse().model in others
    finally:
        gw.stop()


def test_keys_with_other_routing_defaults_share_no_routed_answers(
    upstream: Upstream, tmp_path: Path, demo_table: list[OutcomeRecord]
) -> None:
    # A global cache shares answers between keys, but not between trade-offs: a key whose
    # default lambda differs gets its own routed answers.
    cfg = gateway_config(
        tmp_path,
        upstream.base_url,
        auth={"enabled": True},
        cache={"enabled": True, "scope": "global"},
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}

        def key(alias: str, **fields: Any) -> str:
            made = httpx.post(
                f"{gw.url}/admin/keys", json={"alias": alias, **fields}, headers=admin
            )
            return str(made.json()["key"])

        plain, same, thrifty = (
            key("plain"),
            key("same"),
            key("thrifty", routing={"cost_weight": 20}),
        )
        rec = next(prompts(demo_table, MODEL))
        assert ask(gw, rec.text, model="xrouter", key=plain).headers["x-xrouter-cache"] == "miss"
        assert ask(gw, rec.text, model="xrouter", key=same).headers["x-xrouter-cache"] == "hit"
        assert ask(gw, rec.text, model="xrouter", key=thrifty).headers["x-xrouter-cache"] == "miss"
        assert ask(gw, rec.text, model="xrouter", key=thrifty).headers["x-xrouter-cache"] == "hit"
        # Nor between keys the router chooses for from different models: the answering
        # model is one the narrower key may use, but its routing saw fewer choices.
        answered = ask(gw, rec.text, model="xrouter", key=plain).parse().model
        others = [m for m in DEMO_MODELS if m != answered]
        narrow = key("narrow", allowed_models=[answered, *others[1:]])
        assert ask(gw, rec.text, model="xrouter", key=narrow).headers["x-xrouter-cache"] == "miss"
    finally:
        gw.stop()


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    prefix = f"xrtest-cache-{uuid.uuid4().hex[:10]}"
    yield prefix
    r = redis.Redis(host="127.0.0.1", port=6379)
    keys = list(r.scan_iter(match=f"{prefix}:*"))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.mark.redis
def test_gateways_sharing_redis_share_answers(
    upstream: Upstream, tmp_path: Path, demo_table: list[OutcomeRecord], redis_prefix: str
) -> None:
    cache = {"enabled": True, "backend": "redis", "key_prefix": redis_prefix, "scope": "global"}
    limits = {"redis_url": "redis://127.0.0.1:6379/0"}
    gws = [
        start_gateway(
            tmp_path / name,
            gateway_config(tmp_path / name, upstream.base_url, cache=cache, limits=limits),
        )
        for name in ("a", "b")
    ]
    try:
        rec = next(prompts(demo_table, OTHER))
        first = ask(gws[0], rec.text, model=OTHER)
        assert first.headers["x-xrouter-cache"] == "miss"
        deadline = time.monotonic() + 5
        while True:  # the store is write-behind
            r = ask(gws[1], rec.text, model=OTHER)
            if r.headers["x-xrouter-cache"] == "hit" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.headers["x-xrouter-cache"] == "hit"
        assert r.parse().choices[0].message.content == rec.outcomes[OTHER].response
        hit = extra(r.parse())["xrouter"]["cache"]
        assert hit["request_id"] == first.headers["x-xrouter-request-id"]
        # Stored with the configured TTL.
        ttl = redis.Redis(host="127.0.0.1", port=6379).pttl(
            next(redis.Redis(host="127.0.0.1", port=6379).scan_iter(match=f"{redis_prefix}:*"))
        )
        assert 3_590_000 < ttl <= 3_600_000
        # Clearing through one gateway clears it for both.
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        cleared = httpx.delete(f"{gws[0].url}/admin/cache", headers=admin).json()
        assert cleared == {"deleted": 1, "backend": "redis"}
        assert ask(gws[1], rec.text, model=OTHER).headers["x-xrouter-cache"] == "miss"
    finally:
        for gw in gws:
            gw.stop()


@pytest.mark.redis
def test_an_answer_a_stream_cannot_carry_is_not_streamed_from_the_cache(
    upstream: Upstream, tmp_path: Path, demo_table: list[OutcomeRecord], redis_prefix: str
) -> None:
    """A stream re-rendered from a stored answer carries text and tool calls: a stored answer
    with log probabilities serves plain requests, and a stream asking for them is routed
    afresh rather than answered without them."""
    cache = {"enabled": True, "backend": "redis", "key_prefix": redis_prefix}
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url, cache=cache))
    r = redis.Redis(host="127.0.0.1", port=6379)
    try:
        rec = next(prompts(demo_table, OTHER))
        assert ask(gw, rec.text, model=OTHER, logprobs=True).headers["x-xrouter-cache"] == "miss"
        deadline = time.monotonic() + 5
        while not (stored := list(r.scan_iter(match=f"{redis_prefix}:*"))):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # As an upstream that returns log probabilities would have had it stored (the replay
        # upstream returns none).
        logprobs = {"content": [{"token": "x", "logprob": -0.1, "bytes": None, "top_logprobs": []}]}
        (key,) = stored
        value = json.loads(r.get(key) or b"{}")
        value["choices"][0]["logprobs"] = logprobs
        r.set(key, json.dumps(value))
        plain = ask(gw, rec.text, model=OTHER, logprobs=True)
        assert plain.headers["x-xrouter-cache"] == "hit"
        assert json.loads(plain.text)["choices"][0]["logprobs"] == logprobs
        with httpx.stream(
            "POST",
            f"{gw.base_url}/chat/completions",
            json={
                "model": OTHER,
                "messages": [{"role": "user", "content": rec.text}],
                "logprobs": True,
                "stream": True,
            },
        ) as streamed:
            assert streamed.headers["x-xrouter-cache"] == "miss"
            assert "[DONE]" in streamed.read().decode()
    finally:
        r.close()
        gw.stop()


def test_a_cache_outage_serves_every_request_without_the_cache(
    upstream: Upstream, tmp_path: Path, demo_table: list[OutcomeRecord]
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    cache = {"enabled": True, "backend": "redis", "redis_url": dead, "timeout_ms": 50}
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url, cache=cache))
    try:
        rec = next(prompts(demo_table, MODEL))
        for _ in range(3):
            r = ask(gw, rec.text)
            assert r.headers["x-xrouter-cache"] == "miss"
            assert r.parse().choices[0].message.content == rec.outcomes[MODEL].response
        assert upstream.stats()["requests"][MODEL] == 3
        text = httpx.get(f"{gw.url}/metrics").text
        assert 'xrouter_cache_lookups_total{result="error"} 3.0' in text
        # One warning for the outage, not one per request.
        assert gw.log().count("answer cache lookup failed") == 1
    finally:
        gw.stop()


def test_a_hit_is_not_training_data(
    cached: Gateway, tmp_path: Path, table_iter: Iterator[OutcomeRecord]
) -> None:
    """Off-policy learning reads logged decisions and their costs; a cached answer has
    neither, so ``xrouter export`` leaves it out even when it has feedback."""
    import subprocess
    import sys

    from tests.support.replay import REPO_ROOT

    rec = next(table_iter)
    ids = [ask(cached, rec.text, model="xrouter").headers["x-xrouter-request-id"] for _ in "ab"]
    for rid in ids:
        ledger_rows(cached, rid)
        fb = httpx.post(f"{cached.base_url}/feedback", json={"request_id": rid, "score": 1})
        assert fb.status_code == 200
    time.sleep(0.3)
    out = tmp_path / "export.jsonl"
    url = f"sqlite+aiosqlite:///{cached.config_path.parent / 'ledger.db'}"
    subprocess.run(
        [sys.executable, "-m", "gateway.cli", "export", "--ledger", url, "--out", str(out)],
        check=True,
        cwd=REPO_ROOT,
        capture_output=True,
    )
    exported = {json.loads(line)["id"] for line in out.read_text().splitlines()}
    assert ids[0] in exported and ids[1] not in exported


def test_a_deployed_router_does_not_answer_with_its_predecessor_s_choices(
    cached: Gateway, table_iter: Iterator[OutcomeRecord]
) -> None:
    """The serving checkpoint is part of a routed answer's key: after ``xrouter deploy``
    the router's cached answers are misses; a pass-through's are not."""
    from router.checkpoint import load_checkpoint

    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    routed, direct = next(table_iter), next(table_iter)
    assert ask(cached, routed.text, model="xrouter").headers["x-xrouter-cache"] == "miss"
    assert ask(cached, direct.text).headers["x-xrouter-cache"] == "miss"
    assert ask(cached, routed.text, model="xrouter").headers["x-xrouter-cache"] == "hit"
    serving = httpx.get(f"{cached.url}/admin/router", headers=admin).json()["checkpoint"]
    other = next(
        c
        for c in (load_checkpoint("packaged:demo-rl"), load_checkpoint("packaged:demo"))
        if c.version != serving["version"]
    )
    try:
        r = httpx.post(
            f"{cached.url}/admin/reload", headers=admin, json={"checkpoint": str(other.path)}
        )
        assert r.status_code == 200, r.text
        assert ask(cached, routed.text, model="xrouter").headers["x-xrouter-cache"] == "miss"
        assert ask(cached, routed.text, model="xrouter").headers["x-xrouter-cache"] == "hit"
        assert ask(cached, direct.text).headers["x-xrouter-cache"] == "hit"
    finally:
        # The module's other tests expect the default router.
        r = httpx.post(
            f"{cached.url}/admin/reload", headers=admin, json={"checkpoint": serving["path"]}
        )
        assert r.status_code == 200, r.text


def test_a_price_reload_does_not_serve_answers_routed_under_the_old_prices(
    upstream: Upstream, tmp_path: Path, table_iter: Iterator[OutcomeRecord]
) -> None:
    """The prices of the models a request could be routed to are part of a routed answer's
    key: after a reload that changes them, the cost-aware policy routes afresh (the answer
    bought for the cheapest model is not served once that model is the dearest), while a
    pass-through's answer, and a reload that changes no price, keep their hits."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    cfg = gateway_config(tmp_path, upstream.base_url, cache={"enabled": True})
    gw = start_gateway(tmp_path, cfg)
    routed, direct = next(table_iter), next(table_iter)

    def reload(pricing: dict[str, Any] | None) -> None:
        if pricing is None:
            cfg.pop("pricing", None)
        else:
            cfg["pricing"] = pricing
        gw.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(f"{gw.url}/admin/reload", headers=admin, timeout=30)
        assert r.status_code == 200, r.text

    try:
        first = ask(gw, routed.text, model="xrouter/cheapest")
        assert first.headers["x-xrouter-cache"] == "miss"
        cheapest = first.parse().model
        assert ask(gw, routed.text, model="xrouter/cheapest").headers["x-xrouter-cache"] == "hit"
        assert ask(gw, direct.text).headers["x-xrouter-cache"] == "miss"

        reload(None)  # the same prices, in a new snapshot: the answers stay
        assert ask(gw, routed.text, model="xrouter/cheapest").headers["x-xrouter-cache"] == "hit"

        # The cheapest model becomes the dearest.
        reload({"overrides": {cheapest: {"input": 1000, "output": 1000}}})
        r = ask(gw, routed.text, model="xrouter/cheapest")
        assert r.headers["x-xrouter-cache"] == "miss"
        again = r.parse()
        assert again.model != cheapest
        hit = ask(gw, routed.text, model="xrouter/cheapest")
        assert hit.headers["x-xrouter-cache"] == "hit" and hit.parse().model == again.model
        # What the hit saved is what its answer cost at the prices in force.
        assert extra(hit.parse())["xrouter"]["cache"]["saved_usd"] == pytest.approx(
            extra(again.usage)["cost"]
        )
        # A model asked for by name answers the same whatever it costs.
        assert ask(gw, direct.text).headers["x-xrouter-cache"] == "hit"

        # Back to the old prices: the answer routed under them is served again.
        reload(None)
        back = ask(gw, routed.text, model="xrouter/cheapest")
        assert back.headers["x-xrouter-cache"] == "hit" and back.parse().model == cheapest
    finally:
        gw.stop()


def test_tool_calls_come_back_from_the_cache_streamed_or_not(cached: Gateway) -> None:
    c = client(cached)
    question = f"Weather in Paris? ({uuid.uuid4().hex[:8]})"
    messages: Any = [{"role": "user", "content": question}]
    first = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL]
    )
    assert first.headers["x-xrouter-cache"] == "miss"
    [call] = first.parse().choices[0].message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    with c.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], stream=True
    ) as resp:
        assert resp.headers["x-xrouter-cache"] == "hit"
        chunks = list(resp.parse())
    deltas = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert [(d.id, d.function.name, d.function.arguments) for d in deltas if d.function] == [
        (call.id, call.function.name, call.function.arguments)
    ]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"

    # A relayed stream keeps only its text: with tools offered it may have been a tool call,
    # so it is not stored, and the same question asked plainly is a miss.
    question = f"Weather in Rome? ({uuid.uuid4().hex[:8]})"
    messages = [{"role": "user", "content": question}]
    list(
        c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], stream=True)
    )
    time.sleep(0.2)
    again = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL]
    )
    assert again.headers["x-xrouter-cache"] == "miss"
    assert again.parse().choices[0].message.tool_calls


plausible_body = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["xrouter", "xrouter/cheapest", "xrouter/cascade", OTHER]),
        "messages": st.tuples(st.lists(turn, max_size=3), last_turn).map(lambda t: [*t[0], t[1]]),
    },
    optional={
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "max_tokens": st.integers(1, 4096),
        "n": st.integers(1, 3),
        "stop": st.lists(st.text(min_size=1, max_size=5), max_size=2),
        "seed": st.integers(0, 2**31),
        "user": st.text(max_size=20),
        "response_format": st.just({"type": "json_object"}),
        "xrouter": st.fixed_dictionaries(
            {}, optional={"cost_weight": st.floats(0, 5), "models": st.just([OTHER, MODEL])}
        ),
    },
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
    database=None,  # the same examples on every checkout (see test_api_fuzz.FUZZ)
)
@given(body=plausible_body)
def test_every_plain_answer_is_served_again_from_the_cache(cached: Gateway, body: dict) -> None:
    """Generated requests (conversations of the fuzz suite's turns, any model or policy, any
    mix of parameters): every non-streamed 200 is answered again, identically and for
    nothing, and no parameter makes the cache fail a request."""
    with httpx.Client(base_url=cached.base_url, timeout=30) as http:
        first = http.post("/chat/completions", json=body)
        second = http.post("/chat/completions", json=body)
    event(f"first {first.status_code}")
    assert first.status_code < 500 or first.status_code in (502, 503, 504), first.text
    if first.status_code != 200:
        assert second.status_code == first.status_code or second.status_code >= 500
        return
    assert second.status_code == 200, second.text
    assert second.headers["x-xrouter-cache"] == "hit"
    assert second.json()["choices"] == first.json()["choices"]
    assert second.json()["usage"]["cost"] == 0


def test_an_operator_can_clear_the_cache(
    cached: Gateway, gateway: Gateway, table_iter: Iterator[OutcomeRecord]
) -> None:
    """``DELETE /admin/cache``: every stored answer is gone (a model changed behind its
    name, say); it takes the admin key, and says so when the cache is off."""
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    rec = next(table_iter)
    ask(cached, rec.text)
    assert ask(cached, rec.text).headers["x-xrouter-cache"] == "hit"
    assert httpx.delete(f"{cached.url}/admin/cache").status_code == 401
    r = httpx.delete(f"{cached.url}/admin/cache", headers=admin)
    assert r.status_code == 200 and r.json()["deleted"] >= 1 and r.json()["backend"] == "memory"
    assert ask(cached, rec.text).headers["x-xrouter-cache"] == "miss"
    off = httpx.delete(f"{gateway.url}/admin/cache", headers=admin)
    assert off.status_code == 409 and off.json()["error"]["code"] == "cache_disabled"


def test_only_answers_given_freely_are_kept(
    cached: Gateway, upstream: Upstream, table_iter: Iterator[OutcomeRecord]
) -> None:
    # A stream whose answer is more than its text (log probabilities asked for) is not
    # kept: the relay keeps only the text, which a plain request would then get without
    # the log probabilities it asked for.
    rec = next(table_iter)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": rec.text}]
    list(
        client(cached).chat.completions.create(
            model=MODEL, messages=messages, stream=True, logprobs=True
        )
    )
    time.sleep(0.3)  # what is kept is stored in the background
    assert ask(cached, rec.text, logprobs=True).headers["x-xrouter-cache"] == "miss"

    # An answer the router settled for — the cheapest model failed, the next stood in —
    # is not kept either: once the cheapest model is back, the same request goes to it.
    rec = next(table_iter)
    cheapest = "llama-3.2-3b-instruct"
    upstream.fault(cheapest, "status=500", count=2)  # both attempts (max_retries 1)
    first = ask(cached, rec.text, model="xrouter/cheapest")
    assert first.parse().model != cheapest
    time.sleep(0.3)
    again = ask(cached, rec.text, model="xrouter/cheapest")
    assert again.headers["x-xrouter-cache"] == "miss"
    assert again.parse().model == cheapest
    deadline = time.monotonic() + 5
    while True:  # this one, given freely, is kept (stored in the background)
        r = ask(cached, rec.text, model="xrouter/cheapest")
        if r.headers["x-xrouter-cache"] == "hit" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r.headers["x-xrouter-cache"] == "hit"


def test_a_refusal_comes_back_from_the_cache_as_a_refusal(tmp_path: Path) -> None:
    """A refusal is a message's ``refusal``, not its text: kept from a plain answer and
    streamed again, or kept from a stream and served plain, it is still the refusal."""
    refusal = "I can't help with that."
    with scripted_upstream(tmp_path) as up:
        for prompt in ("refuse plain first", "refuse streamed first"):
            up.answer(prompt, {"content": None, "refusal": refusal}, deltas=[
                {"role": "assistant", "content": None},
                {"refusal": "I can't "}, {"refusal": "help with that."},
            ])  # fmt: skip
        cfg = gateway_config(tmp_path, up.base_url, cache={"enabled": True})
        gw = start_gateway(tmp_path, cfg)
        try:

            def until_hit(stream: bool, prompt: str) -> httpx.Response:
                body = {"model": MODEL, "stream": stream,
                        "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
                deadline = time.monotonic() + 5
                while True:  # stored in the background
                    r = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
                    if r.headers["x-xrouter-cache"] == "hit" or time.monotonic() > deadline:
                        assert r.headers["x-xrouter-cache"] == "hit"
                        return r
                    time.sleep(0.05)

            def streamed_message(sse: str) -> dict[str, str]:
                message: dict[str, str] = {}
                for line in sse.splitlines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line.removeprefix("data: "))["choices"]:
                            for k in ("content", "refusal"):
                                piece = choice["delta"].get(k)
                                if piece:
                                    message[k] = message.get(k, "") + piece
                return message

            # Kept from a plain answer, streamed from the cache.
            c = client(gw)
            ask = [{"role": "user", "content": "refuse plain first"}]
            plain = c.chat.completions.create(model=MODEL, messages=ask)  # type: ignore[arg-type]
            assert plain.choices[0].message.refusal == refusal
            assert streamed_message(until_hit(True, "refuse plain first").text) == {
                "refusal": refusal
            }
            # The Responses API reads it from the cached stream as a refusal part.
            with c.responses.stream(model=MODEL, input="refuse plain first") as stream:
                final = stream.get_final_response()
            assert extra(final)["xrouter"]["cache"]["hit"]
            assert [p.type for p in final.output[0].content] == ["refusal"]  # type: ignore[union-attr]

            # Kept from a stream, served plain from the cache.
            streamed = c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "refuse streamed first"}],
                stream=True,
            )
            assert "".join(ch.choices[0].delta.refusal or "" for ch in streamed if ch.choices) == (
                refusal
            )
            hit = until_hit(False, "refuse streamed first").json()["choices"][0]["message"]
            assert (hit["content"], hit["refusal"]) == (None, refusal)
        finally:
            gw.stop()
