"""Browser calls: with ``server.cors_allow_origins`` set, a page of a named origin may call
the gateway (preflight, answer and errors readable, the cost headers exposed); other
origins get nothing, and a gateway without the setting answers no preflight."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.settings import SettingsError, load_settings
from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway

APP = "https://app.example"
PREFLIGHT = {
    "origin": APP,
    "access-control-request-method": "POST",
    # What the OpenAI JS SDK asks for in a browser.
    "access-control-request-headers": "authorization,content-type,x-stainless-os",
}
BODY = {"model": "xrouter", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def browser_gateway(
    upstream: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("cors")
    cfg = gateway_config(
        tmp, upstream.base_url, auth={"enabled": True}, server={"cors_allow_origins": [APP]}
    )
    gw = start_gateway(tmp, cfg)
    yield gw
    gw.stop()


def test_a_named_origin_passes_the_preflight(browser_gateway: Gateway) -> None:
    r = httpx.options(f"{browser_gateway.base_url}/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == APP
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "x-stainless-os" in r.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in r.headers


def test_answers_and_errors_are_readable_by_the_named_origin_only(
    browser_gateway: Gateway,
) -> None:

    url = browser_gateway.url
    created = httpx.post(
        f"{url}/admin/keys",
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
        json={"alias": "browser"},
    ).json()
    auth = {"authorization": f"Bearer {created['key']}", "origin": APP}
    r = httpx.post(f"{url}/v1/chat/completions", headers=auth, json=BODY, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == APP
    exposed = {h.strip() for h in r.headers["access-control-expose-headers"].split(",")}
    assert {"x-xrouter-cost-usd", "x-request-id", "x-ratelimit-remaining-requests"} <= exposed
    assert r.headers["x-xrouter-cost-usd"]
    # A stream, and a refusal: the page can read both.
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", headers=auth, json={**BODY, "stream": True}
    ) as s:
        assert s.headers["access-control-allow-origin"] == APP
        assert "[DONE]" in s.read().decode()
    r = httpx.post(f"{url}/v1/chat/completions", headers={"origin": APP}, json=BODY)
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == APP
    # Another origin: no preflight, nothing readable.
    other = {**PREFLIGHT, "origin": "https://evil.example"}
    r = httpx.options(f"{url}/v1/chat/completions", headers=other)
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.post(
        f"{url}/v1/chat/completions",
        headers={**auth, "origin": "https://evil.example"},
        json=BODY,
        timeout=30,
    )
    assert "access-control-allow-origin" not in r.headers


def test_without_the_setting_no_origin_is_answered(gateway: Gateway) -> None:
    r = httpx.options(f"{gateway.base_url}/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    r = httpx.post(
        f"{gateway.base_url}/chat/completions", headers={"origin": APP}, json=BODY, timeout=30
    )
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize(
    ("value", "origins"),
    [
        ("*", ["*"]),
        (
            "https://a.example, http://localhost:3000",
            ["https://a.example", "http://localhost:3000"],
        ),
        ('["https://a.example"]', ["https://a.example"]),
    ],
)
def test_origins_from_the_environment(value: str, origins: list[str]) -> None:
    # As a deployment sets them (Helm, compose): one variable, a list or comma-separated.
    env = {"XROUTER_SERVER__CORS_ALLOW_ORIGINS": value}
    assert load_settings(None, env=env).server.cors_allow_origins == origins


@pytest.mark.parametrize("origin", ["https://app.example/", "app.example", "https://*.example"])
def test_an_origin_a_browser_never_sends_is_refused_at_start(tmp_path: Path, origin: str) -> None:
    cfg = tmp_path / "x.yaml"
    cfg.write_text(f"server: {{cors_allow_origins: ['{origin}']}}\n")
    with pytest.raises(SettingsError, match="cors_allow_origins"):
        load_settings(cfg, env={})
