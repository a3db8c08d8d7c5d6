"""Authentication: the key lookup cache against a real key repository (SQLite ledger), and
the scrape token in front of /metrics."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.auth import CACHE_TTL_S, Authenticator
from gateway.errors import APIError
from gateway.ledger.keys import KeyRepository
from gateway.ledger.store import open_ledger_engine
from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway

MODEL = "gemma-2-9b-it"


async def test_a_flood_of_bad_tokens_does_not_evict_the_real_keys(tmp_path: Path) -> None:
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    try:
        repo = KeyRepository(engine)
        info, secret = await repo.create("app")
        auth = Authenticator(repo, enabled=True, admin_key=None, cache_size=4)
        assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == info.key_id
        # Revoked in the database behind the cache's back: a cached key is served until its
        # entry goes, which is what shows whether the entry is still there.
        await repo.revoke(info.key_id)
        for _ in range(10):  # more refused tokens than the cache holds
            with pytest.raises(APIError) as exc:
                await auth.caller({"authorization": f"Bearer xr-{secrets.token_urlsafe(32)}"})
            assert exc.value.status == 401
        assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == info.key_id
        # A refused token is refused from the cache too, and invalidation drops both.
        auth.invalidate()
        with pytest.raises(APIError):
            await auth.caller({"authorization": f"Bearer {secret}"})
    finally:
        await engine.dispose()


async def test_known_keys_are_taken_as_last_read_while_the_database_is_down(
    tmp_path: Path,
) -> None:
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    try:
        repo = KeyRepository(engine)
        info, secret = await repo.create("app")
        auth = Authenticator(repo, enabled=True, admin_key=None, ttl_s=0.01, stale_if_error_s=0.5)
        assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == info.key_id
        # The key table goes away, as with a database that stopped answering.
        async with engine.begin() as conn:
            await conn.exec_driver_sql("ALTER TABLE api_keys RENAME TO api_keys_away")
        await asyncio.sleep(0.05)  # past the cache's TTL: every lookup now fails
        assert (await auth.caller({"authorization": f"Bearer {secret}"})).key_id == info.key_id
        # A key never read is not guessed at: the outage, said as one (not a 401).
        with pytest.raises(APIError) as exc:
            await auth.caller({"authorization": f"Bearer xr-{secrets.token_urlsafe(32)}"})
        assert (exc.value.status, exc.value.code) == (503, "database_unavailable")
        # Taken as last read for so long only.
        await asyncio.sleep(0.6)
        with pytest.raises(APIError) as exc:
            await auth.caller({"authorization": f"Bearer {secret}"})
        assert exc.value.status == 503
        async with engine.begin() as conn:
            await conn.exec_driver_sql("ALTER TABLE api_keys_away RENAME TO api_keys")
        await repo.revoke(info.key_id)
        await asyncio.sleep(0.05)  # past the TTL a failed lookup holds the next one back
        # The database answers again, and is believed.
        with pytest.raises(APIError) as exc:
            await auth.caller({"authorization": f"Bearer {secret}"})
        assert exc.value.status == 401
    finally:
        await engine.dispose()


def test_an_outage_of_the_key_table_does_not_stop_traffic(
    upstream: Upstream, tmp_path: Path
) -> None:
    """With auth on, a ledger outage does not stop a running gateway (the README's promise):
    the keys in hand go on being served, on all three APIs, and their rows land once the
    database is back; a key the gateway never read is a 503 with a request id."""
    cfg = gateway_config(tmp_path, upstream.base_url, auth={"enabled": True})
    gw = start_gateway(tmp_path, cfg)
    db = sqlite3.connect(tmp_path / "ledger.db")
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        r = httpx.post(f"{gw.url}/admin/keys", json={"alias": "app"}, headers=admin)
        assert r.status_code == 201, r.text
        key = r.json()["key"]
        oai = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
        ant = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        oai.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        db.execute("ALTER TABLE api_keys RENAME TO api_keys_away")
        db.commit()
        time.sleep(CACHE_TTL_S + 0.5)
        ids = [
            oai.chat.completions.create(model=MODEL, messages=messages).id,  # type: ignore[arg-type]
            oai.responses.create(model=MODEL, input="hi").id,
            ant.messages.create(model=MODEL, max_tokens=64, messages=messages).id,  # type: ignore[arg-type]
        ]
        stranger = "xr-" + secrets.token_urlsafe(32)
        with pytest.raises(openai.InternalServerError) as oerr:
            openai.OpenAI(base_url=gw.base_url, api_key=stranger, max_retries=0).responses.create(
                model=MODEL, input="hi"
            )
        assert oerr.value.status_code == 503 and oerr.value.request_id
        with pytest.raises(anthropic.InternalServerError) as aerr:
            anthropic.Anthropic(base_url=gw.url, api_key=stranger, max_retries=0).messages.create(
                model=MODEL,
                max_tokens=64,
                messages=messages,  # type: ignore[arg-type]
            )
        assert aerr.value.status_code == 503 and aerr.value.request_id
        assert "Traceback" not in gw.log()
        db.execute("ALTER TABLE api_keys_away RENAME TO api_keys")
        db.commit()
        rids = [i.split("_", 1)[1] if "_" in i else i.removeprefix("chatcmpl-") for i in ids]
        deadline = time.monotonic() + 10
        while True:
            rows = {
                rid
                for rid in rids
                if db.execute("SELECT 1 FROM requests WHERE request_id = ?", (rid,)).fetchone()
            }
            if len(rows) == len(rids) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert rows == set(rids)
    finally:
        db.close()
        gw.stop()


def test_metrics_behind_a_scrape_token(upstream: Upstream, tmp_path: Path) -> None:
    token = secrets.token_urlsafe(24)
    cfg = gateway_config(tmp_path, upstream.base_url, metrics={"bearer_token": token})
    gw = start_gateway(tmp_path, cfg)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            r = httpx.get(f"{gw.url}/metrics", headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert len(r.headers["x-request-id"]) == 32  # as every error carries one
        r = httpx.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "xrouter_requests_total" in r.text
        # The token opens nothing else, and health checks stay open.
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
        r = httpx.get(f"{gw.url}/admin/keys", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code in (401, 403) and r.headers["x-request-id"]
        assert token not in gw.log()
    finally:
        gw.stop()


NO_ADMIN_KEY = "auth is on and no admin key is set"


def test_a_gateway_without_an_admin_key_serves_the_ledger_s_keys_and_says_so(
    tmp_path: Path,
) -> None:
    """Auth on and no admin key: every admin call is a 403, so no key can be made; the keys
    made while one was set are still served. The start says so in one warning (before, it
    started as any other and answered every request 401, with nothing to say why)."""
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1", auth={"enabled": True})
    gw = start_gateway(tmp_path, cfg, name="with-admin-key")
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        r = httpx.post(f"{gw.url}/admin/keys", json={"alias": "app"}, headers=admin)
        assert r.status_code == 201, r.text
        key = r.json()["key"]
    finally:
        gw.stop()
    assert NO_ADMIN_KEY not in gw.log()

    # No admin key, and an empty one: `${XROUTER_ADMIN_KEY:-}` with the variable unset.
    for name, auth in (("none", {}), ("empty", {"admin_key": "${XROUTER_ADMIN_KEY_T:-}"})):
        cfg["auth"] = {"enabled": True, **auth}
        gw = start_gateway(tmp_path, cfg, name=name, env={"XROUTER_ADMIN_KEY_T": ""})
        try:
            r = httpx.get(f"{gw.url}/v1/key", headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200 and r.json()["data"]["label"] == "app", r.text
            r = httpx.post(f"{gw.url}/admin/keys", json={"alias": "b"}, headers=admin)
            assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_disabled"), r.text
        finally:
            gw.stop()
        warnings = [line for line in gw.log().splitlines() if NO_ADMIN_KEY in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0], (name, gw.log())
        assert "auth.admin_key" in warnings[0] and "XROUTER_AUTH__ADMIN_KEY" in warnings[0]


def test_a_key_is_read_by_one_rule_on_every_route(upstream: Upstream, tmp_path: Path) -> None:
    """A key comes as `Authorization: Bearer` (OpenAI's clients), `x-api-key` (Anthropic's)
    or `api-key` (Azure OpenAI's), as LiteLLM's proxy takes it, on every route that takes a
    key: `x-api-key` was taken by the models, Messages, key and feedback routes but refused
    (401) by chat completions and the Responses API, and `api-key` by every route. Of two
    headers that carry different keys the first in that order wins."""
    cfg = gateway_config(tmp_path, upstream.base_url, auth={"enabled": True})
    gw = start_gateway(tmp_path, cfg)
    try:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        key, other = (
            httpx.post(f"{gw.url}/admin/keys", json={"alias": alias}, headers=admin).json()["key"]
            for alias in ("app", "other")
        )
        messages = [{"role": "user", "content": "hi"}]
        first = httpx.post(
            f"{gw.base_url}/chat/completions",
            json={"model": MODEL, "messages": messages},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert first.status_code == 200, first.text
        made = first.json()["id"]
        # Every route that takes a client's key, and what it answers that key.
        calls: list[tuple[str, str, dict[str, Any] | None, int]] = [
            ("POST", "/chat/completions", {"model": MODEL, "messages": messages}, 200),
            ("POST", "/responses", {"model": MODEL, "input": "hi"}, 200),
            ("POST", "/messages", {"model": MODEL, "max_tokens": 64, "messages": messages}, 200),
            ("POST", "/messages/count_tokens", {"model": MODEL, "messages": messages}, 200),
            ("GET", "/models", None, 200),
            ("GET", f"/models/{MODEL}", None, 200),
            ("GET", "/key", None, 200),
            ("GET", f"/generation?id={made}", None, 200),
            ("POST", "/feedback", {"request_id": made, "score": 1.0}, 200),
            ("GET", "/responses/resp_x", None, 404),  # nothing stored, said once authenticated
        ]
        ways = [
            {"Authorization": f"Bearer {key}"},
            {"x-api-key": key},
            {"api-key": key},
            {"Authorization": f"Bearer {key}", "x-api-key": key, "api-key": key},  # one key
            {"Authorization": f"Basic {key}", "api-key": key},  # another scheme carries none
        ]
        for headers in ways:
            for method, path, body, status in calls:
                r = httpx.request(
                    method, f"{gw.base_url}{path}", json=body, headers=headers, timeout=30
                )
                assert r.status_code == status, (headers, path, r.text)
        # Azure OpenAI's SDK sends its key as api-key (its chat calls go to Azure's
        # /deployments/{model}/ paths, which the gateway does not serve).
        azure = openai.AzureOpenAI(
            base_url=gw.base_url, api_key=key, api_version="2025-04-01-preview", max_retries=0
        )
        assert azure.responses.create(model=MODEL, input="hi").status == "completed"
        assert MODEL in {m.id for m in azure.models.list()}

        # Headers that disagree: the first in the order wins, as LiteLLM's proxy reads them
        # (a placeholder key beside the real one is common), and the request is that key's.
        conflicts = [
            ({"Authorization": f"Bearer {key}", "x-api-key": other}, "app"),
            ({"Authorization": f"Bearer {other}", "api-key": key}, "other"),
            ({"x-api-key": key, "api-key": other}, "app"),
            ({"x-api-key": "xr-nonsense", "api-key": key}, None),
        ]
        for headers, alias in conflicts:
            r = httpx.get(f"{gw.base_url}/key", headers=headers)
            if alias is None:
                assert r.status_code == 401, r.text
                continue
            assert r.status_code == 200 and r.json()["data"]["alias"] == alias, (headers, r.text)
            for method, path, body, status in calls:
                r = httpx.request(method, f"{gw.base_url}{path}", json=body, headers=headers)
                # Another key's request is not found, for its generation and feedback alike.
                theirs = alias != "app" and ("generation" in path or "feedback" in path)
                assert r.status_code == (404 if theirs else status), (headers, path, r.text)
        # The operators' credentials stay on Authorization, as the README documents them.
        assert (
            httpx.get(f"{gw.url}/admin/keys", headers={"x-api-key": ADMIN_KEY}).status_code == 401
        )
        assert httpx.get(f"{gw.url}/admin/keys", headers={"api-key": ADMIN_KEY}).status_code == 401
        assert key not in gw.log() and other not in gw.log()
    finally:
        gw.stop()


def test_with_auth_off_no_key_header_is_read(gateway: Gateway) -> None:
    """Auth off: whatever key headers a client sends (two that disagree included) name
    nobody and refuse nothing."""
    headers = {"Authorization": "Bearer a", "x-api-key": "b", "api-key": "c"}
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 200, r.text
