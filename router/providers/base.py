"""The async provider interface: one downstream chat-completions call."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pricing import TokenUsage
from router.pool import PoolModel
from router.providers.usage import reported_or_estimated


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
class StreamStats:
    """Filled in while a stream is consumed; final once the iterator is exhausted."""

    usage: TokenUsage | None = None
    ttft_ms: float | None = None
    latency_ms: float = 0.0
    text_parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    chunks: int = 0
    # What was generated in every choice (text and tool-call arguments): the basis of the
    # usage estimate when a stream ends before its usage chunk.
    generated_parts: int = 0
    generated_chars: int = 0

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def observe(self, chunk: dict[str, Any]) -> None:
        """Accumulate what the gateway needs from one ``chat.completion.chunk``."""
        self.chunks += 1
        usage = chunk.get("usage")
        if usage:
            self.usage = TokenUsage.from_openai(usage)
        for choice in chunk.get("choices") or ():
            first = choice.get("index", 0) == 0
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                self.generated_parts += 1
                self.generated_chars += len(content)
                if first:
                    self.text_parts.append(content)
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
