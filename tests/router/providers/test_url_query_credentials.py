"""Credentials in an api_base's query string (``http://host/v1?key=…``, as providers that take
a key in the URL have it): the native transport puts its path before the query, and an
upstream error quoting the request's path and query never shows the key — an upstream's
"no route for /v1/chat/completions?key=…" is no whole URL the sanitizer's patterns find."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Literal

import pytest
from aiohttp import web

from pricing import ModelPrice
from router.pool import PoolModel
from router.providers.base import Provider, StreamStats
from router.providers.errors import ProviderError
from router.providers.litellm_provider import LiteLLMProvider
from router.providers.native import NativeOpenAIProvider

SECRET = "QSECRET-key-0123456789"
_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
_DELTA = {"index": 0, "delta": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[str]]]:
    """Answers a call to /v1/chat/completions with the right ``key``; refuses any other with
    a 401 whose message quotes the path and query it was sent to (as many servers do)."""
    seen: list[str] = []

    async def any_route(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(request.path_qs)
        if request.path == "/v1/chat/completions" and request.query.get("key") == SECRET:
            if not body.get("stream"):
                return web.json_response(_ANSWER)
            chunk = {**_ANSWER, "object": "chat.completion.chunk", "choices": [_DELTA]}
            events = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
            return web.Response(text=events, content_type="text/event-stream")
        message = f"invalid credentials for {request.method} {request.path_qs}"
        return web.json_response({"error": {"message": message, "type": "auth"}}, status=401)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_route)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1", seen
    finally:
        await runner.cleanup()


def _model(api_base: str, transport: Literal["native", "litellm"] = "native") -> PoolModel:
    return PoolModel(
        name="m",
        provider="openai",
        upstream_model="m",
        api_base=api_base,
        # LiteLLM will not call without one; the native transport sends it as a bearer token.
        api_key="unused-bearer-token",
        transport=transport,
        price=ModelPrice(input=Decimal("0.1"), output=Decimal("0.2")),
        max_output_tokens=16,
        timeout_s=5,
        max_concurrency=8,
        max_retries=0,
        fallbacks=(),
        description="",
    )


async def test_native_calls_the_path_before_the_api_bases_query(
    upstream: tuple[str, list[str]],
) -> None:
    base, seen = upstream
    provider = NativeOpenAIProvider()
    try:
        model = _model(f"{base}/?key={SECRET}")  # as written with the slash, too
        answer = await provider.complete(model, dict(_BODY))
        stream = provider.stream(model, dict(_BODY, stream=True), StreamStats())
        chunks = [c async for c in stream]
    except ProviderError as err:  # before the fix: a 404 on every call
        pytest.fail(f"the call failed: {err.message} (upstream saw {seen})")
    finally:
        await provider.aclose()
    assert answer.body["choices"][0]["message"]["content"] == "ok"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "ok"
    assert seen == [f"/v1/chat/completions?key={SECRET}"] * 2


@pytest.mark.parametrize("transport", ["native", "litellm"])
@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_error_quoting_the_query_does_not_show_its_key(
    upstream: tuple[str, list[str]], transport: Literal["native", "litellm"], stream: bool
) -> None:
    base, seen = upstream
    # The wrong key, percent-encoded as written: the upstream quotes it, and the decoded
    # form must go too.
    written = "WRONG%2Fkey%2B0123456789"
    model = _model(f"{base}?key={written}&api-version=2024-06-01", transport)
    provider: Provider = NativeOpenAIProvider() if transport == "native" else LiteLLMProvider()
    try:
        with pytest.raises(ProviderError) as caught:
            if stream:
                async for _ in provider.stream(model, dict(_BODY, stream=True), StreamStats()):
                    pass
            else:
                await provider.complete(model, dict(_BODY))
    finally:
        await provider.aclose()
    assert seen, "the upstream was not called"
    message = caught.value.message
    assert "WRONG" not in message and "0123456789" not in message, message
    assert "key=[redacted]" in message, message  # still says what it was sent
