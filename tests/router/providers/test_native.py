"""The native transport's connection reuse: idle upstream connections are kept for the pool
model's ``keep_alive_s`` and no longer, so the gateway stops reusing a connection before an
upstream with a short idle timeout (vLLM: 5 s) closes it under a call."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from decimal import Decimal

import pytest
from aiohttp import web

from pricing import ModelPrice
from router.pool import DEFAULT_KEEP_ALIVE_S, PoolModel, PoolModelConfig
from router.providers.native import NativeOpenAIProvider

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
