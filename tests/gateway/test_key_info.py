"""``GET /v1/key``: a key reads its own limits and spend, as OpenRouter's ``/key`` answers."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.support.gateway import ADMIN_KEY, Gateway
from tests.support.sdk import extra

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def test_a_key_reads_its_budget_and_spend(secured: Gateway) -> None:
    made = httpx.post(
        f"{secured.url}/admin/keys",
        json={"alias": "reader", "budget_usd": 2.0, "budget_period": "daily", "rpm": 100,
              "allowed_models": ["gemma-2-9b-it"], "duration": "7d"},
        headers=ADMIN,
    ).json()  # fmt: skip
    key = made["key"]
    c = openai.OpenAI(base_url=secured.base_url, api_key=key, max_retries=0)
    resp = c.chat.completions.create(
        model="gemma-2-9b-it", messages=[{"role": "user", "content": "What is 2 + 2?"}]
    )
    cost = extra(resp.usage)["cost"]
    r = httpx.get(f"{secured.base_url}/key", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert (data["key_id"], data["alias"], data["budget_usd"], data["budget_period"]) == (
        made["key_id"],
        "reader",
        2.0,
        "daily",
    )
    assert data["spent_usd"] == pytest.approx(cost, abs=1e-9)
    assert data["remaining_usd"] == pytest.approx(2.0 - cost, abs=1e-9)
    assert data["resets_at"] - data["period_start"] == 86400  # today, in UTC
    assert (data["rpm"], data["allowed_models"], data["expires_at"]) == (
        100,
        ["gemma-2-9b-it"],
        made["expires_at"],
    )
    # OpenRouter's names for the same figures.
    assert (data["label"], data["limit"], data["usage"], data["limit_remaining"]) == (
        data["alias"],
        data["budget_usd"],
        data["spent_usd"],
        data["remaining_usd"],
    )
    # Anthropic's clients send the key as x-api-key; the answer is the same.
    same = httpx.get(f"{secured.base_url}/key", headers={"x-api-key": key})
    assert same.json() == r.json()
    # The admin's view agrees.
    listed = httpx.get(f"{secured.url}/admin/keys", headers=ADMIN).json()["data"]
    mine = next(k for k in listed if k["key_id"] == made["key_id"])
    assert mine["spent_usd"] == data["spent_usd"]


def test_a_key_without_a_budget_reads_what_it_spent(secured: Gateway) -> None:
    """A key with limits but no budget was told it had spent $0 (`usage` 0, as OpenRouter
    clients read it): the limit store counts spend only against a budget. It is the ledger's
    figure, all time, once the request's row is written."""
    made = httpx.post(
        f"{secured.url}/admin/keys", json={"alias": "no-budget", "rpm": 100}, headers=ADMIN
    ).json()
    key = made["key"]
    c = openai.OpenAI(base_url=secured.base_url, api_key=key, max_retries=0)
    costs = [
        extra(
            c.chat.completions.create(
                model="gemma-2-9b-it", messages=[{"role": "user", "content": f"What is {n} + 2?"}]
            ).usage
        )["cost"]
        for n in range(2)
    ]
    deadline = time.monotonic() + 10
    while True:
        r = httpx.get(f"{secured.base_url}/key", headers={"Authorization": f"Bearer {key}"})
        data = r.json()["data"]
        if data["spent_usd"] == pytest.approx(sum(costs)) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sum(costs) > 0 and data["spent_usd"] == pytest.approx(sum(costs)), data
    assert data["usage"] == data["spent_usd"]
    assert (data["budget_usd"], data["remaining_usd"], data["limit_remaining"]) == (
        None,
        None,
        None,
    )


def test_no_key_no_report(secured: Gateway, gateway: Gateway) -> None:
    r = httpx.get(f"{secured.base_url}/key")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.get(f"{secured.base_url}/key", headers={"Authorization": "Bearer xr-nope"})
    assert r.status_code == 401
    # With authentication off there is no key to describe.
    r = httpx.get(f"{gateway.base_url}/key")
    assert r.status_code == 404 and r.json()["error"]["code"] == "key_not_found"
