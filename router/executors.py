"""Call executors for the orchestration loop: real providers (gateway) and recorded
outcomes (training and offline evaluation)."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from pricing import TokenUsage, usd_to_micros
from router.outcomes import OutcomeRecord
from router.policy import CallOutcome, RouteContext, ToolCall
from router.providers.base import InFlight, StreamStats
from router.providers.client import DownstreamClient, StreamCall
from router.providers.errors import ProviderError


def downstream_request(ctx: RouteContext, call: ToolCall) -> dict[str, Any]:
    """The body a downstream model receives: the client's real conversation (system prompt,
    history, content parts, tools) plus the router's system prompt for that model, if any.
    The seed kept only the first user message; we never drop the conversation."""
    messages = list(ctx.messages)
    if call.system_prompt:
        if (
            messages
            and messages[0].get("role") in ("system", "developer")
            and isinstance(messages[0].get("content"), str)
        ):
            messages[0] = {
                **messages[0],
                "content": f"{call.system_prompt}\n\n{messages[0]['content']}",
            }
        else:
            messages.insert(0, {"role": "system", "content": call.system_prompt})
    # Every parameter the client set reaches the model as given (unknown ones included: they
    # may be provider-specific); routing-only fields never get here.
    body: dict[str, Any] = dict(ctx.request_params)
    body["messages"] = messages
    if ctx.tools:
        body["tools"] = ctx.tools
    if call.temperature is not None:
        body["temperature"] = call.temperature
    if call.max_tokens is not None:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        body["max_tokens"] = min(call.max_tokens, limit) if limit else call.max_tokens
        body.pop("max_completion_tokens", None)
    return body


def _first_message(body: Mapping[str, Any]) -> dict[str, Any] | None:
    choices = body.get("choices") or []
    if not choices:
        return None
    msg = choices[0].get("message")
    return dict(msg) if isinstance(msg, dict) else None


class ProviderExecutor:
    """Executes calls through the DownstreamClient (retries, fallbacks, real usage)."""

    def __init__(self, client: DownstreamClient) -> None:
        self.client = client

    async def execute(
        self, ctx: RouteContext, call: ToolCall, turn: int, in_flight: InFlight | None = None
    ) -> CallOutcome:
        body = downstream_request(ctx, call)
        started = time.perf_counter()
        try:
            r = await self.client.complete(call.model, body, allowed=ctx.pool, in_flight=in_flight)
        except ProviderError as err:
            return CallOutcome.provider_failed(call, turn, started, err)
        return CallOutcome(
            call=call,
            turn=turn,
            ok=True,
            model=r.model,
            message=_first_message(r.body),
            response=r.body,
            usage=r.usage,
            cost_micros=r.cost_micros,
            latency_ms=r.latency_ms,
            attempts=r.attempts,
            fallback_from=r.fallback_from,
            fallback_reason=r.fallback_reason,
            deployment=r.deployment,
        )

    async def open_stream(
        self, ctx: RouteContext, call: ToolCall, turn: int, in_flight: InFlight | None = None
    ) -> _ProviderStream:
        sc = await self.client.open_stream(
            call.model, downstream_request(ctx, call), allowed=ctx.pool, in_flight=in_flight
        )
        return _ProviderStream(sc, call, turn)


@dataclass(slots=True)
class _ProviderStream:
    sc: StreamCall
    call: ToolCall
    turn: int

    @property
    def chunks(self) -> AsyncIterator[dict[str, Any]]:
        return self.sc.chunks

    @property
    def model(self) -> str:
        return self.sc.model.name

    async def aclose(self) -> None:
        """Give back the stream's concurrency slot and upstream response, read or not (a
        client that left before the relay started)."""
        await self.sc.aclose()

    def finish(self) -> CallOutcome:
        st = self.sc.stats
        # Finished: the upstream sent its usage, or at least a finish_reason (a server that
        # ignores stream_options.include_usage), and did not fail after it (a bad usage
        # chunk fails the request); anything else was cut off mid-answer.
        complete = (st.usage is not None or st.finish_reason is not None) and not st.error_kind
        return CallOutcome(
            call=self.call,
            turn=self.turn,
            ok=complete,
            model=self.sc.model.name,
            message={"role": "assistant", "content": st.text},
            response={"choices": [{"index": 0, "finish_reason": st.finish_reason}]},
            usage=self.sc.usage(),
            cost_micros=self.sc.cost_micros(),
            latency_ms=st.latency_ms,
            ttft_ms=st.ttft_ms,
            attempts=self.sc.attempts,
            fallback_from=self.sc.fallback_from,
            fallback_reason=self.sc.fallback_reason,
            deployment=self.sc.model.deployment,
            error=None
            if complete
            else "stream ended before it finished; usage estimated from what was generated",
            error_kind=None if complete else (st.error_kind or "connection"),
        )


class OutcomeExecutor:
    """Replays recorded outcomes: the answer, tokens and cost a model really produced for
    this prompt. ``ctx.request_id`` is the outcome record's id."""

    def __init__(self, records: Mapping[str, OutcomeRecord]) -> None:
        self.records = records

    def _outcome(self, ctx: RouteContext, call: ToolCall, turn: int) -> CallOutcome:
        start = time.perf_counter()
        record = self.records.get(ctx.request_id)
        rec = record.outcomes.get(call.model) if record else None
        if rec is None:
            return CallOutcome(
                call=call,
                turn=turn,
                ok=False,
                model=call.model,
                error="no recorded outcome",
                error_kind="not_found",
            )
        text = rec.response or ""
        usage = TokenUsage(
            rec.prompt_tokens or 0, rec.completion_tokens or math.ceil(len(text) / 4)
        )
        if rec.cost_usd is not None:
            cost = usd_to_micros(rec.cost_usd)
        else:
            cost = ctx.pool[call.model].price.cost_micros(usage)
        message = {"role": "assistant", "content": text}
        response = {
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "xrouter_score": rec.score,
        }
        return CallOutcome(
            call=call,
            turn=turn,
            ok=True,
            model=call.model,
            message=message,
            response=response,
            usage=usage,
            cost_micros=cost,
            latency_ms=(time.perf_counter() - start) * 1000,
        )

    async def execute(
        self, ctx: RouteContext, call: ToolCall, turn: int, in_flight: InFlight | None = None
    ) -> CallOutcome:
        # A recorded outcome is read at once: nothing is ever in flight.
        return self._outcome(ctx, call, turn)

    async def open_stream(
        self, ctx: RouteContext, call: ToolCall, turn: int, in_flight: InFlight | None = None
    ) -> _RecordedStream:
        outcome = self._outcome(ctx, call, turn)
        if not outcome.ok:
            raise ProviderError(
                "not_found", outcome.error or "no recorded outcome", model=call.model
            )
        return _RecordedStream(outcome)


class _RecordedStream:
    def __init__(self, outcome: CallOutcome) -> None:
        self.outcome = outcome
        self.stats = StreamStats()
        self.chunks = self._gen()

    @property
    def model(self) -> str:
        return self.outcome.model

    async def _gen(self) -> AsyncGenerator[dict[str, Any], None]:
        words = self.outcome.text.split(" ")
        for i in range(0, len(words), 4):
            piece = " ".join(words[i : i + 4]) + (" " if i + 4 < len(words) else "")
            yield {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        yield {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": self.outcome.usage.to_openai(),
        }

    async def aclose(self) -> None:
        await self.chunks.aclose()

    def finish(self) -> CallOutcome:
        return self.outcome
