"""Authentication: the key lookup cache against a real key repository (SQLite ledger), and
the scrape token in front of /metrics."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest

from gateway.auth import Authenticator
from gateway.errors import APIError
from gateway.ledger.keys import KeyRepository
from gateway.ledger.store import open_ledger_engine
from tests.gateway.conftest import Upstream
from tests.support.gateway import gateway_config, start_gateway


async def test_a_flood_of_bad_tokens_does_not_evict_the_real_keys(tmp_path: Path) -> None:
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{tmp_path}/ledger.db")
    try:
        repo = KeyRepository(engine)
        info, secret = await repo.create("app")
        auth = Authenticator(repo, enabled=True, admin_key=None, cache_size=4)
        assert (await auth.principal(f"Bearer {secret}")).key_id == info.key_id
        # Revoked in the database behind the cache's back: a cached key is served until its
        # entry goes, which is what shows whether the entry is still there.
        await repo.revoke(info.key_id)
        for _ in range(10):  # more refused tokens than the cache holds
            with pytest.raises(APIError) as exc:
                await auth.principal(f"Bearer xr-{secrets.token_urlsafe(32)}")
            assert exc.value.status == 401
        assert (await auth.principal(f"Bearer {secret}")).key_id == info.key_id
        # A refused token is refused from the cache too, and invalidation drops both.
        auth.invalidate()
        with pytest.raises(APIError):
            await auth.principal(f"Bearer {secret}")
    finally:
        await engine.dispose()


def test_metrics_behind_a_scrape_token(upstream: Upstream, tmp_path: Path) -> None:
    token = secrets.token_urlsafe(24)
    cfg = gateway_config(tmp_path, upstream.base_url, metrics={"bearer_token": token})
    gw = start_gateway(tmp_path, cfg)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            r = httpx.get(f"{gw.url}/metrics", headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and "xrouter_requests_total" in r.text
        # The token opens nothing else, and health checks stay open.
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
        r = httpx.get(f"{gw.url}/admin/keys", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code in (401, 403)
        assert token not in gw.log()
    finally:
        gw.stop()
