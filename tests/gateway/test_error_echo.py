"""An error message names what the client sent, but never more than the first 256 characters
of it: a huge model name, id, path or field name is not echoed back whole."""

from __future__ import annotations

import httpx
import pytest

from gateway.echo import ECHO_LIMIT, MESSAGE_LIMIT, clip, echo
from tests.support.gateway import ADMIN_KEY, Gateway

CHAT = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "echo check"}]}
# Within the fixture gateway's 64 KB body limit; URLs within the HTTP parser's line limit.
HUGE = 60_000
LONG_URL = 8_000


def test_clip_and_echo_keep_the_start_and_say_the_length() -> None:
    assert clip("short") == "short" and echo("short") == "'short'"
    long = "m" * 1_000_000
    assert clip(long) == "m" * ECHO_LIMIT + "… (1000000 characters)"
    assert echo(long) == repr("m" * ECHO_LIMIT) + "… (1000000 characters)"
    assert echo(5) == "5" and echo(None) == "None"


def bounded(r: httpx.Response, status: int) -> str:
    """The error's message, once its answer is checked to be small."""
    assert r.status_code == status, r.text[:500]
    assert len(r.content) < 2 * ECHO_LIMIT + 1000, len(r.content)
    body = r.json()
    message = str(body["error"]["message"])
    assert len(message) <= MESSAGE_LIMIT
    return message


def test_a_huge_model_name_is_clipped_in_the_404(gateway: Gateway) -> None:
    name = "x" * HUGE
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        chat = client.post("/v1/chat/completions", json={**CHAT, "model": name})
        message = bounded(chat, 404)
        assert message.startswith(f"the model '{'x' * ECHO_LIMIT}'… ({HUGE} characters)")
        assert message.endswith("GET /v1/models lists the available ones")
        assert chat.json()["error"]["code"] == "model_not_found"
        # Every API that resolves a model: the Responses API, Anthropic's, /v1/models.
        responses = client.post("/v1/responses", json={"model": name, "input": "hi"})
        assert f"… ({HUGE} characters)" in bounded(responses, 404)
        anthropic = client.post(
            "/v1/messages",
            json={"model": name, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            headers={"anthropic-version": "2023-06-01"},
        )
        assert anthropic.status_code == 404 and len(anthropic.content) < 2 * ECHO_LIMIT + 1000
        model = client.get("/v1/models/" + "y" * LONG_URL)
        assert f"… ({LONG_URL} characters)" in bounded(model, 404)


def test_huge_values_in_the_routing_controls_are_clipped(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        unknown = client.post(
            "/v1/chat/completions", json={**CHAT, "xrouter": {"models": ["z" * 100] * 500}}
        )
        assert "characters)" in bounded(unknown, 400)
        # A field name is the client's too: in the message and in ``param``.
        field = client.post("/v1/chat/completions", json={**CHAT, "xrouter": {"k" * HUGE: 1}})
        bounded(field, 400)
        assert field.json()["error"]["param"] == "xrouter." + "k" * (ECHO_LIMIT - 8) + (
            f"… ({HUGE + 8} characters)"
        )


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_huge_unknown_path_is_clipped_in_the_404(gateway: Gateway, method: str) -> None:
    path = "/" + "p" * LONG_URL
    r = httpx.request(method, gateway.url + path, timeout=30)
    message = bounded(r, 404)
    assert message == f"{method} {clip(path)} is not served by this gateway"
    # A wrong base URL's hint names the path the client meant: one the gateway serves.
    hinted = httpx.get(gateway.url + "/v1/v1/" + "q" * LONG_URL, timeout=30)
    assert f"… ({LONG_URL + 7} characters)" in bounded(hinted, 404)


def test_a_huge_path_in_a_405_is_clipped(gateway: Gateway) -> None:
    path = "/v1/models/" + "m" * LONG_URL
    r = httpx.delete(gateway.url + path, timeout=30)
    assert bounded(r, 405) == f"DELETE is not allowed on {clip(path)}; it takes GET"


def test_huge_request_ids_are_not_echoed_whole(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        feedback = client.post("/v1/feedback", json={"request_id": "r" * HUGE, "score": 1})
        assert "r" * (ECHO_LIMIT + 1) not in bounded(feedback, 400)
        generation = client.get("/v1/generation", params={"id": "g" * LONG_URL})
        assert "g" * (ECHO_LIMIT + 1) not in bounded(generation, 400)
        stored = client.get("/v1/responses/resp_" + "s" * LONG_URL)
        assert f"… ({LONG_URL + 5} characters)" in bounded(stored, 404)


def test_a_huge_key_id_is_clipped_in_the_admin_404(secured: Gateway) -> None:
    key = httpx.get(
        f"{secured.url}/admin/keys/" + "k" * LONG_URL,
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )
    assert bounded(key, 404) == f"no key {echo('k' * LONG_URL)}"
