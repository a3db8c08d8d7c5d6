"""Token usage as providers report it (OpenAI's ``usage`` object)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4  # English text under GPT-style BPE tokenizers, on average


# No call reads or writes a billion tokens; anything larger is a broken or hostile report.
MAX_CALL_TOKENS = 10**9


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return 0
    try:
        n = int(float(value)) if not isinstance(value, int) else value
    except (ValueError, OverflowError):
        return 0
    return min(max(n, 0), MAX_CALL_TOKENS)


def estimate_tokens(text: str) -> int:
    """A token count from text length, ``ceil(chars / 4)``: only where no provider or
    recorded count exists (a stream cut off before its usage chunk, sources without
    counts, synthesized replay content)."""
    return tokens_for_chars(len(text))


def tokens_for_chars(chars: int) -> int:
    """``estimate_tokens`` for a text known only by its length."""
    return math.ceil(chars / CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Token counts of one call.

    Follows OpenAI's convention: ``cached_tokens`` is a subset of ``prompt_tokens`` and
    ``reasoning_tokens`` a subset of ``completion_tokens``.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )

    @classmethod
    def from_openai(cls, usage: dict[str, Any] | None) -> TokenUsage:
        """Parse an OpenAI ``usage`` dict, including the nested detail objects.

        Counts come from another server and become money: each is read as a whole number in
        ``[0, MAX_CALL_TOKENS]`` (a negative count would be a refund, an absurd one would
        overflow the ledger's columns), anything unreadable counts as 0, and the cached and
        reasoning subsets never exceed the counts they are part of."""
        if not isinstance(usage, dict) or not usage:
            return cls()
        prompt_details = usage.get("prompt_tokens_details")
        completion_details = usage.get("completion_tokens_details")
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        cached = (
            _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, dict) else 0
        )
        reasoning = (
            _count(completion_details.get("reasoning_tokens"))
            if isinstance(completion_details, dict)
            else 0
        )
        return cls(prompt, completion, min(cached, prompt), min(reasoning, completion))

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.cached_tokens:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        if self.reasoning_tokens:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out
