"""The replay upstream's aiohttp application: OpenAI chat completions answered from an
outcome table, fault and latency injection, and the ``/_replay/*`` control API.

Routes (all but /health need ``Authorization: Bearer <api_key>`` when an api_key is set):
``POST /v1/chat/completions`` (also ``/chat/completions``), ``GET /v1/models``, ``GET /health``,
``POST|GET|DELETE /_replay/faults``, ``GET /_replay/stats``, ``POST /_replay/reset``.
See ``faults.py`` for the fault syntax and ``synth.py`` for answers to unrecorded prompts.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator

import orjson
from aiohttp import web
from pydantic import ValidationError

from gateway.off_loop import read_sized
from gateway.replay.faults import Fault, FaultQueue, FaultSyntaxError, ReplayStats, split_marker
from gateway.replay.render import (
    CONTENT,
    ENDING,
    USAGE,
    IdFactory,
    completion_body,
    stream_events,
)
from gateway.replay.schema import ChatRequest, FaultRequest, error_body, validation_message
from gateway.replay.synth import ReplayRequestError, synthesize
from gateway.replay.table import ReplayTable
from router.outcomes import conversation_text

log = logging.getLogger(__name__)

FAULT_HEADER = "x-replay-fault"
LATENCY_HEADER = "x-replay-latency-ms"
# Deliberately secret-looking: a gateway must scrub this before it reaches its clients.
FAKE_SECRET = "sk-replay-SECRET-123 at http://10.1.2.3:9/internal"
_JSON = "application/json"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# What the bad-event fault sends: valid JSON, not a chat completion (chunk).
BAD_EVENT = b'{"choices": [null]}'


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=_JSON)


def _error(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> web.Response:
    return _json(error_body(message, status, code=code, param=param), status)


def _read_chat(raw: bytes) -> tuple[ChatRequest, str]:
    """The request and its conversation's text (what the table is matched on)."""
    req = ChatRequest.model_validate(orjson.loads(raw))
    return req, conversation_text(req.messages)


def _latency_header(request: web.Request) -> float:
    """Extra delay asked for by the ``x-replay-latency-ms`` header, in seconds."""
    raw = request.headers.get(LATENCY_HEADER)
    if raw is None:
        return 0.0
    ms = float(raw)
    if not 0 <= ms < math.inf:
        raise ValueError(f"{LATENCY_HEADER} must be a finite number >= 0")
    return ms / 1000.0


def _hang_up(request: web.BaseRequest) -> None:
    """Close the connection mid-response: no (further) response bytes, no [DONE].

    ``close()``, not ``abort()``: what was already written is flushed first, so a cut stream
    deterministically delivers exactly the events sent before the cut, then EOF."""
    if request.transport is not None:
        request.transport.close()


class ReplayService:
    """The request handlers and the mutable state (fault queue, counters) of one server."""

    def __init__(
        self, table: ReplayTable, *, latency_ms: float, api_key: str | None, chunk_delay_ms: float
    ) -> None:
        self.table = table
        self.latency_s = latency_ms / 1000.0
        self.chunk_delay_s = chunk_delay_ms / 1000.0
        self.faults = FaultQueue()
        self.stats = ReplayStats()
        self._ids = IdFactory()
        self._auth = f"Bearer {api_key}" if api_key else None
        models = [
            {"id": m, "object": "model", "created": 0, "owned_by": "replay"} for m in table.models
        ]
        self._models_body = orjson.dumps({"object": "list", "data": models})

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if self._auth is None or request.headers.get("Authorization") == self._auth:
            return None
        return _error(401, "Incorrect API key provided.", "invalid_api_key")

    # -- OpenAI surface -------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        raw = await request.read()
        try:
            # A large body (a 6 MB prompt took ~1 s to read, match and count) is read, and
            # answered below, in a worker thread: the demo's and the tests' other calls go on.
            req, conversation = await read_sized(len(raw), lambda: _read_chat(raw))
        except orjson.JSONDecodeError as exc:
            return _error(400, f"The request body is not valid JSON: {exc}", "invalid_json")
        except ValidationError as exc:
            message, param = validation_message(exc)
            return _error(400, message, "invalid_request", param)
        if not self.table.has_model(req.model):
            self.stats.count_request(None)
            return _error(
                404, f"The model `{req.model}` does not exist.", "model_not_found", "model"
            )
        self.stats.count_request(req.model)

        prompt, marker = split_marker(conversation)
        try:
            fault = self._fault_for(request, req.model, marker)
            delay = self.latency_s + _latency_header(request)
        except ValueError as exc:  # includes FaultSyntaxError
            return _error(400, f"Bad replay fault or latency: {exc}", "invalid_replay_fault")
        if fault is not None:
            self.stats.count_fault(fault)
            if fault.kind == "latency":
                delay += fault.value / 1000.0
        if delay > 0:
            await asyncio.sleep(delay)
        if fault is not None and (failed := await self._fail(request, req, fault)) is not None:
            return failed

        try:
            completion = await read_sized(len(raw), lambda: synthesize(self.table, req, prompt))
        except ReplayRequestError as exc:
            return _error(400, str(exc), "invalid_request", exc.param)
        meta = self._ids.meta(req.model)
        usage = fault is None or fault.kind != "no-usage"
        bad = int(fault.value) if fault is not None and fault.kind == "bad-event" else None
        bad_usage = fault is not None and fault.kind == "bad-usage"
        if not req.stream or (fault is not None and fault.kind == "no-stream"):
            if bad is not None or bad_usage:
                return _json(BAD_EVENT)
            return _json(completion_body(completion, req.n, meta, usage=usage))
        cut = int(fault.value) if fault is not None and fault.kind == "cut-stream" else None
        return await self._stream(
            request,
            stream_events(completion, req.n, meta, req.include_usage and usage),
            cut,
            bad,
            bad_usage,
        )

    async def _fail(
        self, request: web.Request, req: ChatRequest, fault: Fault
    ) -> web.Response | None:
        """Carry out a fault that replaces the answer; None for faults that shape it instead."""
        if fault.kind == "status":
            code = int(fault.value)
            return _error(
                code,
                f"Replay fault: injected HTTP {code} (upstream {FAKE_SECRET})",
                f"replay_{code}",
            )
        if fault.kind == "rate-limit":
            limited = _error(
                429, "Replay fault: rate limit reached, retry later", "rate_limit_exceeded"
            )
            limited.headers["retry-after"] = f"{fault.value:g}"
            return limited
        if fault.kind == "timeout":
            # Outlives any sane client timeout; the server runs with handler cancellation,
            # so the sleep ends as soon as the client gives up and disconnects.
            await asyncio.sleep(fault.value)
            return _error(504, "Replay fault: timeout elapsed", "replay_timeout")
        if fault.kind == "drop" or (fault.kind == "cut-stream" and not req.stream):
            _hang_up(request)
            return web.Response()  # never sent: aiohttp finds the transport closed
        return None

    async def _stream(
        self,
        request: web.Request,
        events: Iterator[tuple[bytes, int]],
        cut: int | None,
        bad: int | None = None,
        bad_usage: bool = False,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        sent = 0
        try:
            for event, kind in events:
                if bad_usage and kind == USAGE:
                    # The answer is complete (its finish_reason went out), its usage is not.
                    event = b"data: " + BAD_EVENT + b"\n\n"
                if cut is not None and (
                    kind in (ENDING, USAGE) or (kind == CONTENT and sent >= cut)
                ):
                    _hang_up(request)  # cut-stream: no finish_reason, no [DONE]
                    return resp
                if bad is not None and (
                    kind in (ENDING, USAGE) or (kind == CONTENT and sent >= bad)
                ):
                    await resp.write(b"data: " + BAD_EVENT + b"\n\n")
                    bad = None
                await resp.write(event)  # one write per event: never buffer the stream
                if kind == CONTENT:
                    sent += 1
                    if self.chunk_delay_s > 0:
                        await asyncio.sleep(self.chunk_delay_s)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            log.debug("client went away mid-stream")
            self.stats.streams_abandoned += 1
        return resp

    def _fault_for(self, request: web.Request, model: str, marker: str | None) -> Fault | None:
        # One fault per request: a header beats a prompt marker beats the queue, and the
        # queue is only consumed when neither of the others applies.
        header = request.headers.get(FAULT_HEADER)
        if header:
            return Fault.parse(header)
        if marker is not None:
            return Fault.parse(marker)
        return self.faults.pop(model)

    async def models(self, request: web.Request) -> web.Response:
        return self._unauthorized(request) or _json(self._models_body)

    async def health(self, request: web.Request) -> web.Response:
        return _json(b'{"status":"ok"}')

    # -- control API ----------------------------------------------------------------------
    async def queue_fault(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        try:
            body = FaultRequest.model_validate(orjson.loads(await request.read()))
            fault = Fault.parse(body.fault)
        except orjson.JSONDecodeError as exc:
            return _error(400, f"The request body is not valid JSON: {exc}", "invalid_json")
        except ValidationError as exc:
            message, param = validation_message(exc)
            return _error(400, message, "invalid_request", param)
        except FaultSyntaxError as exc:
            return _error(400, str(exc), "invalid_replay_fault", "fault")
        if body.model != "*" and not self.table.has_model(body.model):
            return _error(
                404, f"The model `{body.model}` does not exist.", "model_not_found", "model"
            )
        self.faults.push(body.model, fault, body.count)
        return _json(orjson.dumps({"queued": self.faults.snapshot()}))

    async def list_faults(self, request: web.Request) -> web.Response:
        return self._unauthorized(request) or _json(
            orjson.dumps({"queued": self.faults.snapshot()})
        )

    async def clear_faults(self, request: web.Request) -> web.Response:
        return self._unauthorized(request) or _json(orjson.dumps({"cleared": self.faults.clear()}))

    async def get_stats(self, request: web.Request) -> web.Response:
        return self._unauthorized(request) or _json(orjson.dumps(self.stats.snapshot()))

    async def reset_stats(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        self.stats.reset()
        return _json(orjson.dumps(self.stats.snapshot()))


SERVICE_KEY = web.AppKey("replay_service", ReplayService)


def create_app(
    table: ReplayTable,
    *,
    latency_ms: float = 0.0,
    api_key: str | None = None,
    stream_chunk_delay_ms: float = 0.0,
) -> web.Application:
    """The replay upstream as an aiohttp application (``app[SERVICE_KEY]`` is its state)."""
    service = ReplayService(
        table, latency_ms=latency_ms, api_key=api_key, chunk_delay_ms=stream_chunk_delay_ms
    )
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[SERVICE_KEY] = service
    app.router.add_post("/v1/chat/completions", service.chat_completions)
    app.router.add_post("/chat/completions", service.chat_completions)
    app.router.add_get("/v1/models", service.models)
    app.router.add_get("/health", service.health)
    app.router.add_post("/_replay/faults", service.queue_fault)
    app.router.add_get("/_replay/faults", service.list_faults)
    app.router.add_delete("/_replay/faults", service.clear_faults)
    app.router.add_get("/_replay/stats", service.get_stats)
    app.router.add_post("/_replay/reset", service.reset_stats)
    return app
