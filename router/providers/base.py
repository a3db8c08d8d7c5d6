"""The async provider interface: one downstream chat-completions call."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pricing import TokenUsage
from router.pool import PoolModel
from router.providers.content_parts import is_parts
from router.providers.usage import prompt_tokens_estimate, reported_or_estimated


@dataclass(slots=True)
class ProviderResponse:
    """A complete (non-streamed) response in OpenAI's ``chat.completion`` shape."""

    body: dict[str, Any]
    usage: TokenUsage
    latency_ms: float
    usage_reported: bool = True  # False: the server sent no usage, ``usage`` is an estimate

    @classmethod
    def parse(
        cls, request: dict[str, Any], body: dict[str, Any], latency_ms: float
    ) -> ProviderResponse:
        usage, reported = reported_or_estimated(request, body)
        return cls(body, usage, latency_ms, reported)


@dataclass(slots=True)
class InFlight:
    """Whether a call's request is with an upstream now, and which. ``DownstreamClient``
    sets it as it hands an attempt to the provider (the model's concurrency slot taken,
    its circuit passed) and clears it when that attempt fails. A caller that stops waiting
    for the call (its client left, its deadline passed) reads it: an upstream that has the
    request has read its prompt, and bills it, even if the answer never comes."""

    model: PoolModel | None = None  # the pool model called: a fallback's, after one
    deployment: str | None = None
    request: Mapping[str, Any] | None = None  # the body sent upstream
    attempts: int = 0
    # Why the call left the model asked for, once an attempt went to a fallback (the
    # client's ``fallback_reason``): kept after that attempt fails, since the call given up
    # on later still left that model for that reason.
    fallback_reason: str | None = None

    def sent(
        self,
        model: PoolModel,
        target: PoolModel,
        request: Mapping[str, Any],
        attempts: int,
        fallback_reason: str | None = None,
    ) -> None:
        self.model, self.deployment, self.request = model, target.deployment, request
        self.attempts = attempts
        self.fallback_reason = fallback_reason

    def failed(self) -> None:
        """The attempt ended without an answer (a failed attempt is not charged)."""
        self.model = self.request = None

    def prompt_usage(self) -> TokenUsage:
        """What an upstream that got the request and never answered is known to have used:
        its prompt, estimated as a stream cut before its usage is (no completion is known).
        Nothing when no request is with an upstream."""
        if self.request is None:
            return TokenUsage()
        return TokenUsage(prompt_tokens=prompt_tokens_estimate(self.request))


def chunk_problem(chunk: Any) -> str | None:
    """What makes a parsed stream event something other than a ``chat.completion.chunk``
    the gateway can relay, or None. Checked once per event, before anything reads it: an
    upstream that sends ``[]`` or a choice of ``null`` is a bad response (the call falls
    back; not retried on that model, nor counted by its circuit), not an AttributeError deep
    in the relay."""
    if not isinstance(chunk, dict):
        return "an event is not a JSON object"
    usage = chunk.get("usage")
    if usage is not None and not isinstance(usage, dict):
        return "usage is not an object"
    choices = chunk.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list):
        return "choices is not a list"
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("index", 0), int):
            return "a choice is not an object with an integer index"
        delta = choice.get("delta")
        if delta is None:
            continue
        if not isinstance(delta, dict):
            return "a delta is not an object"
        content = delta.get("content")
        if content is not None and not isinstance(content, str) and not is_parts(content):
            # A list of part objects is content too (``flatten_parts`` makes it a string).
            return "a delta's content is not a string or a list of parts"
        calls = delta.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            return "tool_calls is not a list"
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get("index", 0), int):
                return "a tool call is not an object with an integer index"
            fn = call.get("function")
            if fn is not None and (
                not isinstance(fn, dict) or not isinstance(fn.get("arguments") or "", str)
            ):
                return "a tool call's function is not an object with string arguments"
    return None


@dataclass(slots=True)
class StreamStats:
    """Filled in while a stream is consumed; final once the iterator is exhausted."""

    usage: TokenUsage | None = None
    ttft_ms: float | None = None
    latency_ms: float = 0.0
    text_parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    chunks: int = 0
    # What was generated in every choice (text, reasoning and tool-call arguments): the
    # basis of the usage estimate when a stream ends before its usage chunk. Reasoning is
    # counted: an upstream bills it as completion tokens.
    generated_parts: int = 0
    generated_chars: int = 0
    # How the stream failed after it opened (an ``ErrorKind``: cut, timed out, a bad
    # event), None when it ended cleanly or was given up on by the caller. A stream can
    # fail after its finish_reason (a bad usage chunk), so that alone is no success.
    error_kind: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def observe(self, chunk: dict[str, Any]) -> None:
        """Accumulate what the gateway needs from one ``chat.completion.chunk``."""
        self.chunks += 1
        usage = chunk.get("usage")
        if usage:
            parsed = TokenUsage.from_openai(usage)
            # A usage chunk with no count to charge by (a total alone) reports nothing: the
            # stream is estimated as one without usage is, not booked as free.
            if parsed.prompt_tokens or parsed.completion_tokens:
                self.usage = parsed
        for choice in chunk.get("choices") or ():
            first = choice.get("index", 0) == 0
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                self.generated_parts += 1
                self.generated_chars += len(content)
                if first:
                    self.text_parts.append(content)
            reasoning = delta.get("reasoning_content")
            if reasoning and isinstance(reasoning, str):
                self.generated_parts += 1
                self.generated_chars += len(reasoning)
            for tc in delta.get("tool_calls") or ():
                arguments = (tc.get("function") or {}).get("arguments")
                if arguments:
                    self.generated_parts += 1
                    self.generated_chars += len(arguments)
            if first and choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]


class Provider(abc.ABC):
    """Calls one kind of upstream. Implementations raise ``ProviderError`` for every failure
    and never retry themselves: retries, backoff and fallbacks live in ``DownstreamClient``."""

    @abc.abstractmethod
    async def complete(self, model: PoolModel, body: dict[str, Any]) -> ProviderResponse:
        """``body`` is the OpenAI request for this model (``model`` already set upstream)."""

    @abc.abstractmethod
    def stream(
        self, model: PoolModel, body: dict[str, Any], stats: StreamStats
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield ``chat.completion.chunk`` dicts as they arrive, filling ``stats``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass
