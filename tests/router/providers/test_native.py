"""The native transport's connection reuse: idle upstream connections are kept for the pool
model's ``keep_alive_s`` and no longer, so the gateway stops reusing a connection before an
upstream with a short idle timeout (vLLM: 5 s) closes it under a call. And its credentials:
those in an api_base go as HTTP Basic auth; a call that cannot be made is a failed call."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from decimal import Decimal
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from pricing import ModelPrice
from router.pool import DEFAULT_KEEP_ALIVE_S, ModelPool, PoolModel, PoolModelConfig
from router.providers.client import DownstreamClient
from router.providers.errors import ProviderError
from router.providers.native import NativeOpenAIProvider
from tests.support.fault_upstream import FaultUpstream, fault_upstream

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
_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[int]]]:
    """An OpenAI-compatible upstream on loopback that records each call's client port (one
    port per connection the client opened)."""
    ports: list[int] = []

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        assert request.transport is not None
        ports.append(request.transport.get_extra_info("peername")[1])
        return web.json_response(_ANSWER)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1", ports
    finally:
        await runner.cleanup()


def _model(base: str, keep_alive_s: float) -> PoolModel:
    return PoolModel(
        name="m",
        provider="openai",
        upstream_model="m",
        api_base=base,
        api_key=None,
        transport="native",
        price=ModelPrice(input=Decimal("0.1"), output=Decimal("0.2")),
        max_output_tokens=16,
        timeout_s=5,
        max_concurrency=8,
        max_retries=0,
        fallbacks=(),
        description="",
        keep_alive_s=keep_alive_s,
    )


async def test_an_idle_connection_is_reused_within_keep_alive_and_not_after(
    upstream: tuple[str, list[int]],
) -> None:
    base, ports = upstream
    provider = NativeOpenAIProvider()
    try:
        short, long = _model(base, 0.3), dataclasses.replace(_model(base, 30), name="m2")
        for model in (short, long):
            first = await provider.complete(model, _BODY)
            assert first.body["choices"][0]["message"]["content"] == "ok"
            await asyncio.sleep(0.8)  # idle past the short keep-alive, within the long one
            await provider.complete(model, _BODY)
    finally:
        await provider.aclose()
    short_ports, long_ports = ports[:2], ports[2:]
    assert short_ports[0] != short_ports[1], "the short keep-alive reused an expired connection"
    assert long_ports[0] == long_ports[1], "the long keep-alive did not reuse its connection"


async def test_models_with_the_same_keep_alive_share_one_connection_pool(
    upstream: tuple[str, list[int]],
) -> None:
    base, ports = upstream
    provider = NativeOpenAIProvider()
    try:
        a, b = _model(base, 30), dataclasses.replace(_model(base, 30), name="b")
        await provider.complete(a, _BODY)
        await provider.complete(b, _BODY)  # same host, same pool: the idle connection
    finally:
        await provider.aclose()
    assert ports[0] == ports[1]


def test_the_default_keep_alive_is_below_uvicorn_servers_idle_timeout() -> None:
    # vLLM and SGLang serve with uvicorn, which closes idle connections after 5 s.
    cfg = PoolModelConfig(
        name="m", model="hosted_vllm/m", api_base="http://h/v1", price=ModelPrice.free()
    )
    assert cfg.keep_alive_s == DEFAULT_KEEP_ALIVE_S < 5
    with pytest.raises(ValueError, match="keep_alive_s"):
        PoolModelConfig(name="m", model="openai/m", keep_alive_s=0)


@pytest.fixture
async def seen_auth() -> AsyncIterator[tuple[str, list[tuple[str | None, str]]]]:
    """An upstream on loopback that records each call's Authorization header and URL."""
    seen: list[tuple[str | None, str]] = []

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        seen.append((request.headers.get("Authorization"), str(request.url)))
        return web.json_response(_ANSWER)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


async def test_credentials_in_the_api_base_are_sent_as_basic_auth(
    seen_auth: tuple[str, list[tuple[str | None, str]]],
) -> None:
    # Percent-encoded as a URL needs them (p@ss:w/rd), sent decoded, and not in the URL.
    host, seen = seen_auth
    provider = NativeOpenAIProvider()
    try:
        await provider.complete(_model(f"http://bot:p%40ss%3Aw%2Frd@{host}/v1", 4), _BODY)
    finally:
        await provider.aclose()
    assert seen == [("Basic Ym90OnBAc3M6dy9yZA==", f"http://{host}/v1/chat/completions")]


@pytest.fixture
async def up() -> AsyncIterator[FaultUpstream]:
    async with fault_upstream() as u:
        yield u


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_the_transport_cannot_make_is_a_failed_call_that_falls_back(
    up: FaultUpstream, stream: bool
) -> None:
    # Credentials in the api_base and an api_key: aiohttp refuses to send both (a
    # ValueError, neither a ClientError nor a ProviderError), which escaped as a raw 500
    # with no call booked and no fallback. The pool refuses the pair when it is loaded;
    # a model built otherwise (the router model) fails its call, without a secret in it.
    base = urlsplit(up.base_url)
    both = dataclasses.replace(
        _model(f"http://bot:hunter2hunter2@{base.netloc}{base.path}", 4),
        api_key="sk-test-key-should-not-leak",
        fallbacks=("ok",),
    )
    ok = dataclasses.replace(_model(up.base_url, 4), name="ok")
    c = DownstreamClient(ModelPool([both, ok]))
    try:
        if stream:
            sc = await c.open_stream("m", dict(_BODY))
            _ = [ch async for ch in sc.chunks]
            answered, errors = sc.model.name, sc.errors
        else:
            r = await c.complete("m", dict(_BODY))
            answered, errors = r.model, r.errors
    finally:
        await c.aclose()
    assert answered == "ok" and up.calls == 1  # the fallback's call; m's never went out
    [err] = errors
    assert isinstance(err, ProviderError) and err.model == "m"
    assert (err.kind, err.retryable) == ("upstream_4xx", False)
    assert "could not be called (ValueError)" in err.message
    for secret in ("hunter2", "sk-test-key", "bot:"):
        assert secret not in err.message
