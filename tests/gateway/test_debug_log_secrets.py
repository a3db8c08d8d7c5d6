"""No credential reaches a client, a log line at DEBUG, /metrics or the admin API: the pool's
API keys (one from the environment), credentials in an api_base (``user:password@``, a
``?key=`` query), the admin key, the scrape token and a virtual key, through answers and
every kind of upstream failure, on both transports, streamed and not. An api_base with a
query string is also served: the native transport called ``<base>?key=…/chat/completions``
(every call a 404) until 2026-11-29."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.ledger.keys import hash_secret
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.replay import start_replay_upstream, stop_replay_upstream

UPSTREAM_KEY = "sk-upstream-REALKEY-0123456789"
WRONG_KEY = "WRONGPOOLKEYnoprefix987654321"
LITELLM_WRONG_KEY = "LITELLMWRONGKEYnoprefix55555"
URL_PASSWORD = "URLPASSWORDdead456"
QUERY_KEY = "QUERYKEYsecret-abc123"
SCRAPE_TOKEN = "SCRAPETOKEN-zzz-0123456789"
SECRETS = (
    UPSTREAM_KEY,
    WRONG_KEY,
    LITELLM_WRONG_KEY,
    URL_PASSWORD,
    QUERY_KEY,
    ADMIN_KEY,
    SCRAPE_TOKEN,
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("debug-secrets")
    proc, base = start_replay_upstream(tmp, "--api-key", UPSTREAM_KEY)
    dead = "http://127.0.0.1:1/v1"
    common = {"max_retries": 0, "timeout_s": 5}
    pool = [
        {"name": "llama-3.2-3b-instruct", "api_base": base, "api_key": "${POOL_KEY}"},
        {"name": "gemma-2-9b-it", "api_base": base, "api_key": WRONG_KEY},
        # The replay upstream takes the key as a bearer token and ignores the query: the
        # call answers once its path comes before the query.
        {"name": "qwen2.5-7b-instruct", "api_base": f"{base}?key={QUERY_KEY}",
         "api_key": "${POOL_KEY}"},
        {"name": "llama-3.1-8b-instruct",
         "api_base": dead.replace("//", f"//bob:{URL_PASSWORD}@")},
        {"name": "mixtral-8x7b-instruct-v0.1", "api_base": base, "api_key": LITELLM_WRONG_KEY,
         "transport": "litellm"},
        {"name": "llama-3.3-70b-instruct", "api_base": f"{dead}?key={QUERY_KEY}",
         "api_key": UPSTREAM_KEY, "transport": "litellm"},
    ]  # fmt: skip
    cfg = gateway_config(
        tmp,
        base,
        server={"log_level": "debug"},
        auth={"enabled": True, "admin_key": ADMIN_KEY},
        metrics={"bearer_token": SCRAPE_TOKEN},
        pool=[{**m, "model": f"openai/{m['name']}", **common} for m in pool],
    )
    g = start_gateway(tmp, cfg, env={"POOL_KEY": UPSTREAM_KEY})
    try:
        yield g
    finally:
        g.stop()
        stop_replay_upstream(proc)


def test_no_credential_reaches_a_client_the_debug_log_or_the_admin_api(gw: Gateway) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(f"{gw.url}/admin/keys", headers=admin, json={"alias": "t"}).json()
    key = made["key"]
    auth = {"Authorization": f"Bearer {key}"}
    seen: list[str] = []
    statuses: dict[tuple[str, bool], int] = {}
    for model in (
        "llama-3.2-3b-instruct",
        "gemma-2-9b-it",
        "qwen2.5-7b-instruct",
        "llama-3.1-8b-instruct",
        "mixtral-8x7b-instruct-v0.1",
        "llama-3.3-70b-instruct",
    ):
        for stream in (False, True):
            body = {
                "model": model,
                "stream": stream,
                "messages": [{"role": "user", "content": "hi"}],
            }
            r = httpx.post(f"{gw.base_url}/chat/completions", headers=auth, json=body, timeout=30)
            statuses[model, stream] = r.status_code
            seen.append(r.text + repr(r.headers))
    assert statuses["llama-3.2-3b-instruct", False] == 200
    assert statuses["qwen2.5-7b-instruct", False] == 200, seen
    assert statuses["qwen2.5-7b-instruct", True] == 200
    assert statuses["gemma-2-9b-it", False] == 502  # refused the wrong key
    assert statuses["llama-3.1-8b-instruct", False] == 503  # nothing listening
    for path in ("/admin/keys", "/admin/router", "/admin/pricing", "/admin/spend"):
        seen.append(httpx.get(f"{gw.url}{path}", headers=admin).text)
    seen.append(httpx.get(f"{gw.url}/dashboard", headers=admin).text)
    seen.append(httpx.get(f"{gw.url}/v1/key", headers=auth).text)
    seen.append(httpx.get(f"{gw.url}/v1/models", headers=auth).text)
    seen.append(
        httpx.get(f"{gw.url}/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}).text
    )
    log = gw.log()
    assert " DEBUG " in log  # the level this test is about
    answers = "\n".join(seen)
    for secret in (*SECRETS, key, key.removeprefix("xr-")):
        assert secret not in answers, secret
        assert secret not in log, secret


def test_no_prompt_or_answer_reaches_the_debug_log_without_log_content(gw: Gateway) -> None:
    # LiteLLM printed each request's body (a curl line with the messages) and aiosqlite
    # every SQL parameter (ledger rows, key hashes) once the gateway ran at DEBUG, though
    # ledger.log_content (default none) keeps prompts out of the ledger itself.
    canary = "CANARYPROMPTxyzzy-4242"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    key = httpx.post(f"{gw.url}/admin/keys", headers=admin, json={"alias": "c"}).json()["key"]
    for model in ("llama-3.2-3b-instruct", "mixtral-8x7b-instruct-v0.1", "xrouter"):
        body = {"model": model, "messages": [{"role": "user", "content": canary}]}
        httpx.post(
            f"{gw.base_url}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=body,
            timeout=30,
        )
    log = gw.log()
    assert " DEBUG " in log
    digest = hash_secret(key)  # what the ledger looks a key up by
    leaked = [line for line in log.splitlines() if canary in line or digest in line]
    assert not leaked, leaked[:3]
