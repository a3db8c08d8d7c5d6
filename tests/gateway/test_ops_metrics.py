"""What operators read off a running gateway: readiness, the metrics their alerts use (key
budgets, upstream errors, requests no model answered), labels for what a reload brings, and
the admin API's key and spend edges."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.redis_server import PrivateRedis

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
MODEL = "mixtral-8x22b-instruct-v0.1"  # the dearest demo model: budgets bind quickly
FAILING = "qwen2.5-7b-instruct"
PROMPT = "Explain briefly why the sky is blue."
MAX_TOKENS = 40
# One call's worst case as the gateway reserves it for PROMPT (prompt estimate x input price
# + max_tokens x output price, $1.2 per 1M tokens each way): see test_operators.
WORST = -(-(((len(PROMPT) + 8) // 3 + 1 + 8) + MAX_TOKENS) * 12 // 10)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(gw: Gateway) -> Samples:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of ``name``'s samples with these labels (None: no such series)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    return sum(found) if found else None


def eventually(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    """``check()``'s first truthy answer (metrics are read back off the request path)."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def create_key(gw: Gateway, **fields: Any) -> dict[str, Any]:
    r = httpx.post(
        f"{gw.url}/admin/keys", json={"alias": f"k-{secrets.token_hex(4)}", **fields}, headers=ADMIN
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def chat(gw: Gateway, key: str | None, model: str = MODEL) -> httpx.Response:
    return httpx.post(
        f"{gw.base_url}/chat/completions",
        json={
            "model": model,
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": PROMPT}],
        },
        headers={"Authorization": f"Bearer {key}"} if key else None,
        timeout=30,
    )


def spent_micros(gw: Gateway, key_id: str) -> int:
    listed = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN).json()["data"]
    return round(next(k for k in listed if k["key_id"] == key_id)["spent_usd"] * 1e6)


@pytest.fixture(scope="module")
def gw(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("ops-metrics")
    g = start_gateway(tmp, gateway_config(tmp, upstream.base_url, auth={"enabled": True}))
    yield g
    g.stop()


def test_the_budget_gauge_is_budget_minus_spend_and_says_when_a_key_is_refused(
    gw: Gateway,
) -> None:
    budget = WORST * 5 // 2  # two calls' holds fit, a third only once they settled
    k = create_key(gw, budget_usd=budget / 1e6, budget_period="total")
    alias = k["alias"]

    assert chat(gw, k["key"]).status_code == 200
    spent = spent_micros(gw, k["key_id"])
    assert 0 < spent < WORST

    # Not what was left after the call's hold (budget - WORST), but after its settle.
    def gauge_is(expected_micros: int) -> bool:
        got = value(scrape(gw), "xrouter_key_budget_remaining_usd", key_alias=alias)
        return got is not None and round(got * 1e6) == expected_micros

    assert eventually(lambda: gauge_is(budget - spent)), scrape(gw)

    statuses: list[int] = []
    while not statuses or statuses[-1] == 200:
        statuses.append(chat(gw, k["key"]).status_code)
        assert len(statuses) < 10, statuses
    before = scrape(gw)
    r = chat(gw, k["key"])
    assert r.status_code == 429 and r.json()["error"]["code"] == "key_budget_exceeded"
    spent = spent_micros(gw, k["key_id"])
    left = budget - spent
    assert 0 <= left < WORST  # too little for the call: refused with something left
    # The gauge shows what is left (not 0), and the refusals say the key is out: what the
    # XrouterKeyBudgetExhausted alert reads.
    assert eventually(lambda: gauge_is(left))
    name = "xrouter_key_budget_refusals_total"
    refused_before = value(before, name, key_alias=alias) or 0
    assert value(scrape(gw), name, key_alias=alias) == refused_before + 1


def test_the_budget_gauge_follows_a_raised_budget_without_a_call(
    upstream: Upstream, tmp_path: Path
) -> None:
    """A budget raised through the admin API (on any replica) shows in the gauge at the next
    refresh (metrics.budget_refresh_s), not only at the key's next call here: a key refused
    for want of budget may never call again, and its alert would fire on."""
    cfg = gateway_config(
        tmp_path, upstream.base_url, auth={"enabled": True}, metrics={"budget_refresh_s": 0.3}
    )
    g = start_gateway(tmp_path, cfg)
    try:
        k = create_key(g, budget_usd=WORST * 3 / 1e6, budget_period="total")
        alias = k["alias"]
        assert chat(g, k["key"]).status_code == 200
        spent = spent_micros(g, k["key_id"])

        def gauge_is(expected_micros: int) -> bool:
            got = value(scrape(g), "xrouter_key_budget_remaining_usd", key_alias=alias)
            return got is not None and round(got * 1e6) == expected_micros

        assert eventually(lambda: gauge_is(WORST * 3 - spent))
        r = httpx.patch(
            f"{g.url}/admin/keys/{k['key_id']}",
            json={"budget_usd": WORST * 10 / 1e6},
            headers=ADMIN,
        )
        assert r.status_code == 200
        assert eventually(lambda: gauge_is(WORST * 10 - spent)), scrape(g)
        # Revoked: the series goes, and the refresh does not bring it back.
        assert httpx.delete(f"{g.url}/admin/keys/{k['key_id']}", headers=ADMIN).status_code == 200
        time.sleep(1.0)  # three refreshes
        assert value(scrape(g), "xrouter_key_budget_remaining_usd", key_alias=alias) is None
    finally:
        g.stop()


def test_a_call_the_budget_refused_is_no_upstream_call(gw: Gateway) -> None:
    k = create_key(gw, budget_usd=(WORST // 2) / 1e6, budget_period="total")
    before = scrape(gw)
    r = chat(gw, k["key"])
    assert r.status_code == 429 and r.json()["error"]["code"] == "key_budget_exceeded"

    def calls(s: Samples, le: str) -> float:
        name = "xrouter_downstream_calls_per_request_bucket"
        return value(s, name, policy="passthrough", le=le) or 0

    # The request is accounted for (its count of calls observed: none was made) ...
    after = eventually(
        lambda: s if calls(s := scrape(gw), "+Inf") > calls(before, "+Inf") else None
    )
    assert after
    assert calls(after, "0.0") == calls(before, "0.0") + 1
    # ... and the call it was refused is no upstream call: no duration observed for it.
    count = "xrouter_upstream_duration_seconds_count"
    assert value(after, count, model=MODEL) == value(before, count, model=MODEL)


def test_a_failed_call_counts_its_attempts_and_a_failed_request_no_model(
    gw: Gateway, upstream: Upstream
) -> None:
    k = create_key(gw)
    before = scrape(gw)
    upstream.fault(FAILING, "status=500", count=2)  # both attempts (max_retries 1)
    r = chat(gw, k["key"], FAILING)
    assert r.status_code >= 500, r.text
    after = eventually(
        lambda: (
            s
            if value(s := scrape(gw), "xrouter_requests_total", status_class="5xx")
            != value(before, "xrouter_requests_total", status_class="5xx")
            else None
        )
    )
    assert after

    def delta(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0) - (value(before, name, **labels) or 0)

    # Two failed attempts and no answer: all of the model's attempts failed, which is what
    # XrouterUpstreamErrors computes, errors / (errors + answered calls).
    errors = delta("xrouter_upstream_errors_total", model=FAILING)
    answered = delta("xrouter_upstream_duration_seconds_count", model=FAILING)
    assert (errors, answered) == (2, 0)
    # No model answered it: "none", not an unknown model's "other".
    assert delta("xrouter_requests_total", model="none", status_class="5xx") == 1
    assert delta("xrouter_requests_total", model="other") == 0


def test_a_request_refused_before_a_policy_is_resolved_is_labelled_none(gw: Gateway) -> None:
    k = create_key(gw)
    before = scrape(gw)
    r = chat(gw, k["key"], "no-such-model")
    assert r.status_code == 404, r.text
    name = "xrouter_requests_total"

    def counted() -> float | None:
        now = value(scrape(gw), name, policy="none", model="none", status_class="4xx") or 0
        return now - (value(before, name, policy="none", model="none", status_class="4xx") or 0)

    assert eventually(counted) == 1
    assert value(scrape(gw), name, policy="other") is None


def test_build_info_names_the_installed_version(gw: Gateway) -> None:
    samples = scrape(gw)
    assert value(samples, "xrouter_build_info", version=version("xrouter")) == 1
    assert value(samples, "xrouter_build_info", version="unknown") is None


def test_budget_series_go_with_a_revoked_renamed_or_rebudgeted_key(
    upstream: Upstream, tmp_path: Path
) -> None:
    cfg = gateway_config(
        tmp_path, upstream.base_url, auth={"enabled": True}, metrics={"budget_gauge_keys": 3}
    )
    g = start_gateway(tmp_path, cfg)
    try:
        keys = [create_key(g, budget_usd=1.0) for _ in range(4)]
        for k in keys:
            assert chat(g, k["key"]).status_code == 200

        def exported() -> set[str]:
            return {
                dict(labels)["key_alias"]
                for name, labels in scrape(g)
                if name == "xrouter_key_budget_remaining_usd"
            }

        first3 = {k["alias"] for k in keys[:3]}
        assert eventually(lambda: exported() == first3), exported()  # the fourth: no slot
        revoked, renamed, rebudgeted, waiting = keys
        assert httpx.delete(f"{g.url}/admin/keys/{revoked['key_id']}", headers=ADMIN).is_success
        r = httpx.patch(
            f"{g.url}/admin/keys/{renamed['key_id']}",
            json={"alias": renamed["alias"] + "-new"},
            headers=ADMIN,
        )
        assert r.status_code == 200, r.text
        r = httpx.patch(
            f"{g.url}/admin/keys/{rebudgeted['key_id']}", json={"budget_usd": None}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        assert exported() == set()
        # The slots are free again: the key that had none gets one at its next call.
        assert chat(g, waiting["key"]).status_code == 200
        assert eventually(lambda: exported() == {waiting["alias"]}), exported()
        assert chat(g, renamed["key"]).status_code == 200
        assert eventually(lambda: exported() == {waiting["alias"], renamed["alias"] + "-new"})
    finally:
        g.stop()


def test_models_and_policies_a_reload_brings_are_labelled_by_name(
    upstream: Upstream, tmp_path: Path
) -> None:
    added = "gemma-2-9b-it"
    cfg = gateway_config(tmp_path, upstream.base_url)
    cfg["pool"] = [m for m in cfg["pool"] if m["name"] != added]
    g = start_gateway(tmp_path, cfg)
    try:
        cfg = gateway_config(
            tmp_path,
            upstream.base_url,
            # The llm policy exists once a router model is configured; whether the replay
            # upstream answers as one does not matter to its label.
            router={
                "watch_files": False,
                "circuit_breaker": {"failures": 0},
                "llm": {"base_url": upstream.base_url, "max_retries": 0, "timeout_s": 5},
            },
        )
        g.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(f"{g.url}/admin/reload", headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        assert added in r.json()["pool"] and "llm" in r.json()["policies"]
        assert chat(g, None, added).status_code == 200
        chat(g, None, "xrouter/llm")

        def labelled() -> bool:
            s = scrape(g)
            return bool(
                value(s, "xrouter_requests_total", model=added, policy="passthrough")
                and value(s, "xrouter_requests_total", policy="llm")
            )

        assert eventually(labelled), scrape(g)
        assert value(scrape(g), "xrouter_requests_total", policy="other") is None
        assert value(scrape(g), "xrouter_requests_total", model="other") is None
    finally:
        g.stop()


def test_an_alias_of_only_spaces_is_a_400_naming_it(gw: Gateway) -> None:
    r = httpx.post(f"{gw.url}/admin/keys", json={"alias": "   "}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "alias", r.text
    k = create_key(gw)
    r = httpx.patch(f"{gw.url}/admin/keys/{k['key_id']}", json={"alias": " \t "}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "alias", r.text


def test_a_revoked_key_cannot_be_changed(gw: Gateway) -> None:
    k = create_key(gw, rpm=10)
    url = f"{gw.url}/admin/keys/{k['key_id']}"
    assert httpx.delete(url, headers=ADMIN).status_code == 200
    # A revoked key stays as it was revoked: PATCH is a 404, as rotate is.
    r = httpx.patch(url, json={"rpm": 99}, headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "key_not_found", r.text
    listed = httpx.get(f"{gw.url}/admin/keys?include_revoked=1", headers=ADMIN).json()["data"]
    assert next(x for x in listed if x["key_id"] == k["key_id"])["rpm"] == 10


def test_spend_report_bounds_may_be_epoch_seconds(gw: Gateway) -> None:
    # As the ledger's to_utc takes them.
    spender = create_key(gw)
    assert chat(gw, spender["key"]).status_code == 200

    def report(**params: str) -> httpx.Response:
        return httpx.get(
            f"{gw.url}/admin/spend", params={"key": spender["key_id"], **params}, headers=ADMIN
        )

    now = time.time()
    r = report(since=str(int(now - 3600)), until=f"{now + 3600:.3f}")
    assert r.status_code == 200, r.text
    assert sum(row["requests"] for row in r.json()["data"]) == 1
    r = report(since=str(int(now + 3600)))
    assert r.status_code == 200 and r.json()["data"] == [], r.text
    assert report(since="20250131").status_code == 200  # still an ISO date
    for bad in ("1" + "0" * 20, "soon"):
        r = report(since=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "since", r.text


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["open", "closed"])
def test_readiness_counts_the_limit_store_only_when_it_gates_requests(
    upstream: Upstream, tmp_path: Path, mode: str
) -> None:
    server = PrivateRedis()
    cfg = gateway_config(
        tmp_path,
        upstream.base_url,
        auth={"enabled": True},
        limits={"backend": "redis", "redis_url": server.url, "on_store_error": mode},
    )
    g = start_gateway(tmp_path, cfg)
    try:
        k = create_key(g, budget_usd=5.0)
        server.stop()
        r = httpx.get(f"{g.url}/readyz", timeout=10)
        # Reported either way; with "open" requests are still served, so the replica stays
        # in its Service (Kubernetes would otherwise take every replica out at once).
        assert r.json()["checks"]["limits"] is False
        if mode == "open":
            assert r.status_code == 200 and r.json()["status"] == "ready", r.text
            assert chat(g, k["key"]).status_code == 200
        else:
            assert r.status_code == 503 and r.json()["status"] == "not_ready", r.text
            assert chat(g, k["key"]).status_code == 503
    finally:
        server.stop()
        g.stop()
