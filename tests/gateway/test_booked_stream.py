"""A streamed answer whose client left before its body's first step is still booked.

A stream's body books the request in its ``finally``. Under ASGI spec 2.4 a server's
``send`` raises ``OSError`` once the client is gone, so a client gone by the time the
response starts ends it at its first message, before the body is ever iterated — and a body
that never started never ran its ``finally``: no ledger row, the call left open. (Uvicorn
declares 2.3 today, where Starlette starts the body before a disconnect can cancel it: read
to its end, as here, the stream is booked once.) Driven through the real Starlette response
with the ASGI messages a server sends, on the gateway's real renderer, hooks, ledger
writer, loop and provider, against the replay upstream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from starlette.requests import ClientDisconnect

from gateway.booked_stream import BookedStream
from gateway.hooks import RequestHooks, RequestLog
from gateway.ledger import schema
from gateway.ledger.store import open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.messages import adapt as messages_adapt
from gateway.messages.request import parse_request as parse_messages
from gateway.principal import Principal
from gateway.render import Renderer
from gateway.responses import adapt as responses_adapt
from gateway.responses.request import parse_request as parse_responses
from gateway.schemas import ChatCompletionRequest
from gateway.settings import LedgerSettings
from pricing import load_default_catalog
from router.executors import ProviderExecutor
from router.loop import Orchestrator
from router.policies.baselines import FixedPolicy
from router.policy import RouteContext
from router.pool import ModelPool, PoolModelConfig
from router.providers.client import DownstreamClient
from router.route_result import RouteResult
from tests.gateway.conftest import Upstream

MODEL = "llama-3.2-3b-instruct"
MESSAGES = [{"role": "user", "content": "What is the boiling point of water in Celsius?"}]


def scope(spec_version: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version}}


class Setup:
    def __init__(self, engine: Any, writer: LedgerWriter, client: DownstreamClient) -> None:
        self.engine, self.writer, self.client = engine, writer, client
        self.hooks = RequestHooks(ledger=writer)
        self.renderer = Renderer(self.hooks, lambda *_: None)
        self.orchestrator = Orchestrator(ProviderExecutor(client))

    async def routed(self, request_id: str, *, stream: bool) -> tuple[RequestLog, RouteResult]:
        rlog = RequestLog(
            request_id=request_id,
            created_at=time.time(),
            principal=Principal(key_id=None),
            t0=time.perf_counter(),
            requested_model=MODEL,
            policy="passthrough",
            stream=True,
        )
        ctx = RouteContext(
            request_id=request_id, messages=MESSAGES, pool=self.client.pool, cost_weight=0.0
        )
        result = await self.orchestrator.run(FixedPolicy(MODEL), ctx, stream=stream)
        rlog.result = result
        return rlog, result

    async def row(self, request_id: str) -> tuple[Any, list[Any]]:
        await self.writer.flush()
        async with self.engine.connect() as conn:
            req = (
                await conn.execute(
                    sa.select(schema.requests.c.status, schema.requests.c.total_cost_micros).where(
                        schema.requests.c.request_id == request_id
                    )
                )
            ).first()
            calls = (
                await conn.execute(
                    sa.select(schema.calls.c.model, schema.calls.c.cost_micros).where(
                        schema.calls.c.request_id == request_id
                    )
                )
            ).all()
        return req, calls


@pytest.fixture
async def setup(upstream: Upstream, tmp_path: Path) -> AsyncIterator[Setup]:
    url = f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    engine = await open_ledger_engine(url)
    writer = LedgerWriter(engine, LedgerSettings(url=url, spill_dir=str(tmp_path / "spill")))
    await writer.start()
    cfg = PoolModelConfig(name=MODEL, model=f"openai/{MODEL}", api_base=upstream.base_url)
    client = DownstreamClient(ModelPool.from_configs([cfg], load_default_catalog()))
    try:
        yield Setup(engine, writer, client)
    finally:
        await client.aclose()
        await writer.close()
        await engine.dispose()


async def serve(response: Any, *, client_gone: bool) -> list[dict[str, Any]]:
    """``response`` served by an ASGI 2.4 server to a client gone from the start (``send``
    raises ``OSError``, ``receive`` is the disconnect), or by uvicorn (2.3) to one that reads
    it all."""
    sent: list[dict[str, Any]] = []
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not client_gone:
            await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if client_gone:
            raise OSError("the client closed the connection")
        sent.append(message)

    if client_gone:
        with pytest.raises(ClientDisconnect):
            await response(scope("2.4"), receive, send)
    else:
        await response(scope("2.3"), receive, send)
    return sent


def chat_request() -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": MESSAGES, "stream": True}
    )


async def test_a_relayed_stream_whose_client_left_before_it_started_is_booked(
    setup: Setup, upstream: Upstream
) -> None:
    rlog, result = await setup.routed("relayed-gone", stream=True)
    assert result.stream is not None  # the upstream's stream is open, unread
    response = setup.renderer.stream(chat_request(), rlog, result, 30.0)
    assert isinstance(response, BookedStream)
    assert await serve(response, client_gone=True) == []
    # Booked as a client that left: the call it opened is closed and charged its prompt.
    (status, total), calls = await setup.row("relayed-gone")
    assert status == 499
    assert [c.model for c in calls] == [MODEL] and total == calls[0].cost_micros > 0
    assert upstream.abandoned_streams()["streams_abandoned"] == 1


async def test_a_stream_read_to_its_end_is_booked_once(setup: Setup) -> None:
    rlog, result = await setup.routed("relayed-read", stream=True)
    sent = await serve(setup.renderer.stream(chat_request(), rlog, result, 30.0), client_gone=False)
    assert b"data: [DONE]" in b"".join(m.get("body", b"") for m in sent)
    (status, total), calls = await setup.row("relayed-read")
    assert (status, len(calls)) == (200, 1) and total > 0


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
async def test_a_complete_answer_streamed_to_a_client_gone_before_it_started_is_booked(
    setup: Setup, api: str
) -> None:
    # A complete answer re-streamed (the router picked it whole, or the cache had it), in
    # each API's stream: the translations keep the chat stream's bookkeeping.
    request_id = f"text-{api}"
    rlog, result = await setup.routed(request_id, stream=False)
    response: Any = setup.renderer.text_stream(chat_request(), rlog, result)
    if api == "messages":
        req = parse_messages({"model": MODEL, "max_tokens": 64, "messages": MESSAGES})
        response = messages_adapt(req, response)
    elif api == "responses":
        response = responses_adapt(parse_responses({"model": MODEL, "input": "hi"}), response)
    assert isinstance(response, BookedStream)
    await serve(response, client_gone=True)
    (status, total), calls = await setup.row(request_id)
    # The answer was bought before the stream: its call is in the row at its full cost.
    assert status == 499 and [c.model for c in calls] == [MODEL] and total > 0
