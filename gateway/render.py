"""How a routed answer goes back to a chat client: the completion's body, or its stream
(relayed from the upstream, or re-streamed when the router selected or synthesized the
answer), with the cost headers, ``usage.cost`` and the ``xrouter`` object. Each response
hands the request to the hooks for accounting exactly once, and offers its answer to the
answer cache through ``remember``."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
from starlette.responses import Response

from gateway.booked_stream import BookedStream
from gateway.cache import CachedAnswer
from gateway.call_ids import StreamCallIds, with_call_ids
from gateway.errors import from_provider_error, internal_error
from gateway.hooks import RequestHooks, RequestLog
from gateway.runtime import ROUTER_MODEL
from gateway.schemas import ChatCompletionRequest
from pricing.money import format_usd, micros_to_usd
from router.providers.errors import ProviderError
from router.route_result import RouteResult

__all__ = ["SSE_HEADERS", "Renderer", "id_headers", "usage_with_cost", "xrouter_meta"]

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Offers a served answer to the cache: (request log, result, answering model, choices).
Remember = Callable[[RequestLog, RouteResult, str | None, list[dict[str, Any]]], None]


def id_headers(request_id: str) -> dict[str, str]:
    """The request's id, as the gateway names it and as OpenAI's API does (``x-request-id``,
    which the OpenAI SDKs read into ``_request_id`` and their errors' ``request_id``): the
    id ``/v1/feedback`` and ``/v1/generation`` take."""
    return {"x-xrouter-request-id": request_id, "x-request-id": request_id}


# A relayed stream hands the event loop a turn at least this often (chunks).
_YIELD_EVERY = 32


def xrouter_meta(request_id: str, policy: str, result: RouteResult | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"request_id": request_id, "policy": policy}
    if result is None:
        return meta
    calls = [
        {
            "model": o.model,
            "role": o.role,
            "turn": o.turn,
            "status": "ok" if o.ok else ("refused" if o.error_kind == "budget" else "error"),
            "prompt_tokens": o.usage.prompt_tokens,
            "completion_tokens": o.usage.completion_tokens,
            "cost_usd": micros_to_usd(o.cost_micros),
            "latency_ms": round(o.latency_ms, 3),
            **({"error": o.error} if o.error else {}),
            **({"fallback_from": o.fallback_from} if o.fallback_from else {}),
            **({"fallback_reason": o.fallback_reason} if o.fallback_reason else {}),
            **({"deployment": o.deployment} if o.deployment else {}),
        }
        for o in (*result.state.router_calls, *result.state.outcomes)
    ]
    meta.update(
        calls=calls,
        cost_usd=micros_to_usd(result.cost_micros),
        router_cost_usd=micros_to_usd(result.router_cost_micros),
        downstream_cost_usd=micros_to_usd(result.downstream_cost_micros),
        decision=result.decision.to_dict(),
    )
    hit: CachedAnswer | None = result.extras.get("cache")
    if hit is not None:
        meta["cache"] = {
            "hit": True,
            "request_id": hit.request_id,
            "age_s": round(max(time.time() - hit.created_at, 0.0), 3),
            "saved_usd": micros_to_usd(hit.cost_micros),
        }
    return meta


def usage_with_cost(result: RouteResult) -> dict[str, Any]:
    hit: CachedAnswer | None = result.extras.get("cache")
    if hit is not None:
        # The answer's own tokens, as when it was first served; this request paid nothing.
        return {**hit.usage, "cost": 0.0}
    usage = result.usage().to_openai()
    usage["cost"] = micros_to_usd(result.cost_micros)
    return usage


class Renderer:
    def __init__(self, hooks: RequestHooks, remember: Remember) -> None:
        self.hooks = hooks
        self.remember = remember

    def headers(
        self, rlog: RequestLog, result: RouteResult, *, cost: bool = True
    ) -> dict[str, str]:
        h = {
            **id_headers(rlog.request_id),
            "x-xrouter-policy": rlog.policy,
            "x-xrouter-model": result.final_model or ROUTER_MODEL,
        }
        if cost:
            h["x-xrouter-cost-usd"] = format_usd(result.cost_micros)
            h["x-xrouter-overhead-ms"] = f"{rlog.overhead_ms(result):.3f}"
        h.update(rlog.extra_headers)
        return h

    async def json(self, rlog: RequestLog, result: RouteResult) -> Response:
        if result.response is not None and result.final_model is not None:
            body = dict(result.response)
            body.pop("xrouter_score", None)
        else:
            body = {
                "object": "chat.completion",
                "created": int(rlog.created_at),
                "choices": [
                    {
                        "index": 0,
                        "message": result.message or {"role": "assistant", "content": ""},
                        "finish_reason": result.finish_reason,
                    }
                ],
            }
        body["id"] = f"chatcmpl-{rlog.request_id}"
        body["model"] = result.final_model or ROUTER_MODEL
        body["usage"] = usage_with_cost(result)
        body["xrouter"] = xrouter_meta(rlog.request_id, rlog.policy, result)
        rlog.status = 200
        rlog.response_text = first_text(body)
        choices = body.get("choices") or []
        self.remember(rlog, result, result.final_model, choices)
        # The client's answer names every tool call (the cache keeps the model's answer, for
        # a hit to name by its own request id).
        body["choices"] = with_call_ids(choices, rlog.request_id)
        headers = self.headers(rlog, result)
        payload = orjson.dumps(body)
        # The row is durable (committed or journaled) before the client sees a 200.
        await self.hooks.finish(rlog, result)
        return Response(payload, media_type="application/json", headers=headers)

    def final_chunks(self, rlog: RequestLog, result: RouteResult, model: str) -> bytes:
        chunk = {
            "id": f"chatcmpl-{rlog.request_id}",
            "object": "chat.completion.chunk",
            "created": int(rlog.created_at),
            "model": model,
            "choices": [],
            "usage": usage_with_cost(result),
            "xrouter": xrouter_meta(rlog.request_id, rlog.policy, result),
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"

    def stream(
        self, req: ChatCompletionRequest, rlog: RequestLog, result: RouteResult, timeout_s: float
    ) -> Response:
        """The upstream's chunks relayed as they arrive, then the usage chunk."""
        assert result.stream is not None
        stream = result.stream
        cid = f"chatcmpl-{rlog.request_id}"
        model_name = result.final_model or ROUTER_MODEL
        hooks = self.hooks

        # The request's deadline covers the stream too: a budget hold must never outlive
        # its call (holds expire request_timeout_s + 60 s after they are taken).
        deadline = rlog.t0 + timeout_s

        text_only = streamed_text_only(req)
        # The chat client's stream names every tool call. The Responses and Messages
        # translations read this stream and name a call themselves: they hold it until an
        # id that comes in a later delta has come, which a made-up one here would hide.
        call_ids = StreamCallIds(rlog.request_id) if rlog.api == "chat" else None
        # A text-only answer may be a refusal instead (its own delta field, which the relay
        # does not keep): kept here so that a cached refusal is served as one again.
        refusal: list[str] = []

        began = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal began
            began = True
            rlog.status = 499  # until the stream completes: the client may go away
            chunks = aiter(stream.chunks)
            relayed = 0
            try:
                while True:
                    relayed += 1
                    if relayed % _YIELD_EVERY == 0:
                        # An upstream that sends faster than it is relayed never makes this
                        # loop wait, and a loop that never waits starves the event loop: the
                        # client's hang-up would go unseen (the whole answer read and paid
                        # for) and every other request on the worker would stall meanwhile.
                        await asyncio.sleep(0)
                    # The timeout is entered and left around each chunk's await, never held
                    # across a yield: between chunks this generator is suspended and its
                    # task runs the server's code, which a firing timeout would cancel.
                    try:
                        async with asyncio.timeout(deadline - time.perf_counter()):
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    except TimeoutError:
                        raise ProviderError(
                            "timeout", f"the request did not finish within {timeout_s:g} s"
                        ) from None
                    choices = chunk.get("choices")
                    if not choices:
                        continue  # upstream usage-only chunk: ours, with cost, comes last
                    if text_only:
                        piece = (choices[0].get("delta") or {}).get("refusal")
                        if piece:
                            refusal.append(piece)
                    if call_ids is not None:
                        call_ids.name(choices)
                    chunk["id"] = cid
                    chunk["model"] = model_name
                    chunk.pop("usage", None)
                    yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                outcome = result.state.outcomes[-1] if result.state.outcomes else None
                if outcome is not None and not outcome.ok:
                    raise ProviderError("connection", outcome.error or "stream failed")
                rlog.status = 200
                rlog.response_text = outcome.text if outcome is not None else None
                if outcome is not None and text_only:
                    # The relay kept the first choice's text, all a text-only answer has
                    # besides a refusal.
                    finish = ((outcome.response or {}).get("choices") or [{}])[0]
                    message: dict[str, Any] = {"role": "assistant", "content": outcome.text}
                    if refusal:
                        message.update(content=outcome.text or None, refusal="".join(refusal))
                    choice = {
                        "index": 0,
                        "message": message,
                        "finish_reason": finish.get("finish_reason") or "stop",
                    }
                    self.remember(rlog, result, result.final_model, [choice])
                # As for a JSON answer: the row is durable before the client reads [DONE].
                await hooks.finish(rlog, result)
                yield self.final_chunks(rlog, result, model_name)
            except ProviderError as err:
                api = from_provider_error(err)
                rlog.status, rlog.error_type = api.status, api.code
                yield b"data: " + orjson.dumps(api.body()) + b"\n\ndata: [DONE]\n\n"
            except Exception:
                # A bug of ours mid-stream: the client still gets an error event to end on
                # (the headers are long gone), the log the traceback, the ledger its row.
                log.exception("stream of request %s failed", rlog.request_id)
                api = internal_error()
                rlog.status, rlog.error_type = api.status, api.code
                yield b"data: " + orjson.dumps(api.body()) + b"\n\ndata: [DONE]\n\n"
            finally:
                # Closed early (the client left, or a translation stopped reading): closing
                # the stream records the call and settles its hold, read or not, which must
                # happen before the ledger row is built, not whenever the generator is
                # collected.
                await stream.aclose()
                await hooks.finish(rlog, result)

        async def settle() -> None:
            if began:
                return
            # The client left before the body's first step (BookedStream): the call is
            # closed, recorded and settled as for a client that left mid-stream.
            rlog.status = 499
            try:
                await stream.aclose()
            finally:
                await hooks.finish(rlog, result)

        return BookedStream(
            body(),
            settle,
            headers={**self.headers(rlog, result, cost=False), **SSE_HEADERS},
            deadline=deadline,
            on_stall=functools.partial(_stalled, rlog),
        )

    def text_stream(
        self,
        req: ChatCompletionRequest,
        rlog: RequestLog,
        result: RouteResult,
        timeout_s: float | None = None,
    ) -> Response:
        """The answer is already complete (the router selected or synthesized it, or the cache
        had it): stream it, every choice of it (``n`` > 1 asks for several), its writes
        bounded by the request's deadline (``timeout_s`` from its start)."""
        body_json = result.response if result.response is not None and result.final_model else None
        fallback = result.message or {"role": "assistant", "content": ""}
        choices = [
            {
                "index": c["index"] if isinstance(c.get("index"), int) else i,
                "message": c.get("message") or fallback,
                "finish_reason": c.get("finish_reason") or result.finish_reason,
                **({"logprobs": c["logprobs"]} if c.get("logprobs") else {}),
            }
            for i, c in enumerate((body_json or {}).get("choices") or [{}])
        ]
        # Streamed with every tool call named, as the JSON answer has them; kept as they came.
        named = with_call_ids(choices, rlog.request_id)
        cid = f"chatcmpl-{rlog.request_id}"
        model = result.final_model or ROUTER_MODEL
        created = int(rlog.created_at)
        hooks = self.hooks

        def chunk(
            index: int,
            delta: dict[str, Any],
            finish: str | None = None,
            logprobs: Any = None,
        ) -> bytes:
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish}
            if logprobs is not None:
                choice["logprobs"] = logprobs
            c = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }
            return b"data: " + orjson.dumps(c) + b"\n\n"

        def choice_chunks(choice: dict[str, Any]) -> Iterator[bytes]:
            index, message = choice["index"], choice["message"]
            content = message.get("content")
            text = content if isinstance(content, str) else ""
            yield chunk(index, {"role": "assistant", "content": ""})
            logprobs = choice.get("logprobs")
            if logprobs is not None:
                # The tokens' log probabilities belong with the text they score: one piece.
                yield chunk(index, {"content": text}, logprobs=logprobs)
            elif text:
                words = text.split(" ")
                for i in range(0, len(words), 8):
                    piece = " ".join(words[i : i + 8]) + (" " if i + 8 < len(words) else "")
                    yield chunk(index, {"content": piece})
            refusal = message.get("refusal")
            if isinstance(refusal, str) and refusal:
                # A refusal streams as the refusal it is (a delta field of its own), not
                # as an empty answer.
                yield chunk(index, {"refusal": refusal})
            if message.get("tool_calls"):
                # After the text, as a model streams them: the Responses and Messages
                # streams put their items in the order the deltas come, and the JSON answer
                # has the text first too.
                calls = [dict(tc, index=i) for i, tc in enumerate(message["tool_calls"])]
                yield chunk(index, {"tool_calls": calls})
            yield chunk(index, {}, choice["finish_reason"])

        began = False

        async def body() -> AsyncIterator[bytes]:
            nonlocal began
            began = True
            rlog.status = 499
            try:
                for choice in named:
                    for piece in choice_chunks(choice):
                        yield piece
                rlog.status = 200
                first = choices[0]["message"].get("content")
                rlog.response_text = first if isinstance(first, str) else ""
                self.remember(rlog, result, result.final_model, choices)
                await hooks.finish(rlog, result)  # durable before [DONE]
                yield self.final_chunks(rlog, result, model)
            except Exception:
                # A bug of ours mid-stream: the client still gets an error event to end on
                # (the headers are long gone), the log the traceback, the ledger its row.
                log.exception("stream of request %s failed", rlog.request_id)
                api = internal_error()
                rlog.status, rlog.error_type = api.status, api.code
                yield b"data: " + orjson.dumps(api.body()) + b"\n\ndata: [DONE]\n\n"
            finally:
                await hooks.finish(rlog, result)

        async def settle() -> None:
            if not began:  # the client left before the body's first step (BookedStream)
                rlog.status = 499
                await hooks.finish(rlog, result)

        return BookedStream(
            body(),
            settle,
            headers={**self.headers(rlog, result, cost=False), **SSE_HEADERS},
            deadline=None if timeout_s is None else rlog.t0 + timeout_s,
            on_stall=functools.partial(_stalled, rlog),
        )


def _stalled(rlog: RequestLog) -> None:
    """A stream cut because its client read nothing more by the request's deadline: booked
    as a client's hang-up (499), marked as such (the body's bookkeeping runs next)."""
    if not rlog.finished:
        rlog.status, rlog.error_type = 499, "client_stalled"


# Request fields whose answer holds more than the first choice's text (the relay keeps only
# that text): legacy function calling and audio output.
_NON_TEXT_FIELDS = ("functions", "audio")


def streamed_text_only(req: ChatCompletionRequest) -> bool:
    """A relayed stream whose whole answer is the first choice's text (or its refusal): no
    tools offered (no tool calls), one choice, no log probabilities, no audio or legacy
    functions."""
    extra = req.model_extra or {}
    return (
        req.tools is None
        and req.n == 1
        and not req.logprobs
        and not req.top_logprobs
        and not any(extra.get(f) for f in _NON_TEXT_FIELDS)
        and all(m == "text" for m in extra.get("modalities") or ())
    )


def first_text(body: dict[str, Any]) -> str | None:
    choices = body.get("choices") or []
    if not choices:
        return None
    content = (choices[0].get("message") or {}).get("content")
    return content if isinstance(content, str) else None
