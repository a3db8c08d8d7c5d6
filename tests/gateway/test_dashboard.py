"""``GET /dashboard``: the operators' page, on a real gateway with a real ledger."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import re
import time
from pathlib import Path

import httpx
import openai
import yaml

from gateway.ledger.inserter import BatchInserter
from gateway.ledger.store import open_ledger_engine
from tests.gateway.conftest import Upstream
from tests.gateway.ledger.factories import make_request
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.sdk import extra

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()}


def wait_for_ledger(gw: Gateway, check: str) -> str:
    """The page once ``check`` shows on it (ledger writes are batched off the hot path)."""
    deadline = time.monotonic() + 10
    while True:
        page = httpx.get(f"{gw.url}/dashboard", headers=ADMIN).text
        if check in page or time.monotonic() > deadline:
            return page
        time.sleep(0.1)


def test_open_when_auth_is_off_and_shows_what_was_spent(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    resp = client.chat.completions.create(
        model="gemma-2-9b-it", messages=[{"role": "user", "content": "dashboard check"}]
    )
    cost = extra(resp.usage)["cost"]
    r = httpx.get(f"{gateway.url}/dashboard")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = wait_for_ledger(gateway, "<td>gemma-2-9b-it</td>")
    assert "<td>gemma-2-9b-it</td>" in page and "Spend by policy" in page
    assert "passthrough" in page  # a named model is still metered, under its own policy
    row = page[page.index("<td>gemma-2-9b-it</td>") :].split("</tr>")[0]
    assert cost > 0 and f"${cost:,.6f}" in row  # the call's cost, as the client was charged
    assert "default policy <b>compact</b>" in page and "<b>knn</b>" in page


def test_spend_by_model_and_policy_covers_the_last_30_days(gateway: Gateway) -> None:
    # The page refreshes every 30 s: its aggregates are bounded, never the whole ledger.
    url = yaml.safe_load(gateway.config_path.read_text())["ledger"]["url"]
    old = make_request(
        "ancient", created_at=time.time() - 40 * 86400, models=("ancient-model",), policy="old"
    )

    async def write() -> None:
        engine = await open_ledger_engine(url)
        try:
            await BatchInserter(engine, "none", timeout_s=10).insert([old])
        finally:
            await engine.dispose()

    asyncio.run(write())
    page = httpx.get(f"{gateway.url}/dashboard").text
    assert "Spend by model (last 30 days)" in page and "Spend by policy (last 30 days)" in page
    assert "ancient-model" not in page and "<td>old</td>" not in page


def test_with_auth_on_it_takes_the_admin_key_from_a_browser_prompt_or_a_token(
    secured: Gateway,
) -> None:
    r = httpx.get(f"{secured.url}/dashboard")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{secured.url}/dashboard", headers=basic("wrong")).status_code == 401
    assert httpx.get(f"{secured.url}/dashboard", headers=basic(ADMIN_KEY)).status_code == 200
    assert httpx.get(f"{secured.url}/dashboard", headers=ADMIN).status_code == 200


def test_keys_show_their_budgets_and_chosen_names_are_escaped(secured: Gateway) -> None:
    alias = "<script>alert(1)</script>"
    made = httpx.post(
        f"{secured.url}/admin/keys",
        json={"alias": alias, "budget_usd": 2.5, "budget_period": "daily", "max_parallel": 7},
        headers=ADMIN,
    )
    assert made.status_code == 201, made.text
    page = httpx.get(f"{secured.url}/dashboard", headers=ADMIN).text
    assert alias not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    row = page[page.index("&lt;script&gt;") :].split("</tr>")[0]
    assert "$2.500000" in row and "daily" in row and made.json()["key_id"] in row
    assert ">7<" in row  # its max_parallel


def test_the_costliest_end_users_are_listed_and_escaped(gateway: Gateway) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
    users = {"<b>mallory</b>": 3, "dashboard-user-1": 1}
    for user, n in users.items():
        for i in range(n):
            client.chat.completions.create(
                model="gemma-2-9b-it",
                messages=[{"role": "user", "content": f"dashboard user check {i}"}],
                user=user,
            )
    page = wait_for_ledger(gateway, "dashboard-user-1")
    assert "Top 10 end users by cost" in page
    assert "<b>mallory</b>" not in page and "&lt;b&gt;mallory&lt;/b&gt;" in page
    section = page[page.index("Top 10 end users") :].split("</table>")[0]
    # The costlier user first, with its request count.
    assert section.index("mallory") < section.index("dashboard-user-1")
    row = section[section.index("mallory") :].split("</tr>")[0]
    assert '<td class="n">3</td>' in row


def test_no_admin_key_configured_means_no_dashboard_when_auth_is_on(
    upstream: Upstream, tmp_path: Path
) -> None:
    cfg = gateway_config(tmp_path, upstream.base_url, auth={"enabled": True, "admin_key": None})
    gw = start_gateway(tmp_path, cfg)
    try:
        r = httpx.get(f"{gw.url}/dashboard", headers=ADMIN)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
    finally:
        gw.stop()


def test_past_a_hundred_keys_it_shows_the_oldest_and_says_where_the_rest_are(
    upstream: Upstream, tmp_path: Path
) -> None:
    gw = start_gateway(
        tmp_path, gateway_config(tmp_path, upstream.base_url, auth={"enabled": True})
    )
    try:
        with httpx.Client(headers=ADMIN) as admin:
            made = [
                admin.post(f"{gw.url}/admin/keys", json={"alias": f"many-{i:03d}"}).json()
                for i in range(101)
            ]
            page = admin.get(f"{gw.url}/dashboard").text
        assert made[99]["key_id"] in page and made[100]["key_id"] not in page
        assert "The oldest 100 of 101 keys; every key: GET /admin/keys" in page
    finally:
        gw.stop()


def test_spend_by_day_shows_fourteen_whole_utc_days(gateway: Gateway) -> None:
    """The window was 14 × 24 h back from now: the oldest date shown counted only its part
    after the current time of day, under that date's whole label. Now it is today and the
    13 days before, each whole, as GET /admin/spend?group_by=day gives them."""
    url = yaml.safe_load(gateway.config_path.read_text())["ledger"]["url"]
    today = dt.datetime.now(dt.UTC).date()
    oldest = dt.datetime.combine(today - dt.timedelta(days=13), dt.time(), dt.UTC)
    rows = [
        # The oldest day's first minute (was outside the window unless it ran at midnight).
        make_request("day-early", created_at=oldest.timestamp() + 60, call_costs=(7000,)),
        # The day before it: not shown, whatever the time of day.
        make_request("day-before", created_at=oldest.timestamp() - 60, call_costs=(3000,)),
    ]

    async def write() -> None:
        engine = await open_ledger_engine(url)
        try:
            await BatchInserter(engine, "none", timeout_s=10).insert(rows)
        finally:
            await engine.dispose()

    asyncio.run(write())
    page = httpx.get(f"{gateway.url}/dashboard").text
    by_day = page[page.index("Spend by day") :].split("</table>")[0]
    day = oldest.date().isoformat()
    assert f"<td>{day}</td>" in by_day, by_day
    row = by_day[by_day.index(f"<td>{day}</td>") :].split("</tr>")[0]
    assert "$0.007000" in row, row
    assert (oldest.date() - dt.timedelta(days=1)).isoformat() not in by_day


def test_the_page_cannot_be_framed_and_its_policy_allows_its_own_style_sheet(
    gateway: Gateway,
) -> None:
    r = httpx.get(f"{gateway.url}/dashboard")
    assert r.status_code == 200
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
    csp = dict(d.partition(" ")[::2] for d in r.headers["content-security-policy"].split("; "))
    assert csp["frame-ancestors"] == "'none'" and csp["default-src"] == "'none'"
    # What a browser enforces: each inline <style> runs only if its hash is allowed; the page
    # has no script and no style attributes, which the policy would block.
    page = r.text
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert styles
    for css in styles:
        digest = base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp["style-src"].split()
    assert "<script" not in page.lower() and " style=" not in page.lower()
    assert "'unsafe-inline'" not in r.headers["content-security-policy"]
