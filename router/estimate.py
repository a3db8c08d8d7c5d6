"""A deliberately high prompt-token estimate, made before a call, for budget holds and tpm.

Settlement always uses the provider's real usage; this only has to be high enough that a
request's hold covers what it will be charged, and cheap enough for the hot path (no
tokenizer). Text counts one token per 3 bytes of UTF-8: real tokenizers average about 4
characters a token on English, and a CJK character (3 bytes) is about one token, so the bytes
keep the estimate high for every script, where characters would undercount Chinese,
Japanese and Korean three times over. Everything else a provider bills for is counted too:
tool calls in the history, tool results, the tool schemas offered, and images and audio,
which are priced by size and not by their text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

# An image costs tokens by resolution, not by the bytes of its URL: OpenAI's high-detail
# pricing tops out near 1,500 tokens for the largest image it accepts (Anthropic: ~1,600 for
# a 1.15-megapixel one), so a fixed, high count per image covers both without decoding it.
IMAGE_TOKENS = 1_600
# Audio is billed by duration, which base64 bytes bound from above for any codec worth
# sending: 16 kHz 16-bit PCM is 43 kB of base64 a second, and gpt-4o bills ~10 tokens a
# second; one token per 1,000 base64 characters keeps well above that.
AUDIO_CHARS_PER_TOKEN = 1_000
# Per message: role and separators in every chat template.
MESSAGE_OVERHEAD_TOKENS = 4
BYTES_PER_TOKEN = 3


def _text_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN)


def _json_tokens(value: Any) -> int:
    return math.ceil(len(orjson.dumps(value)) / BYTES_PER_TOKEN)


def _part_tokens(part: Any) -> int:
    if not isinstance(part, dict):
        return _text_tokens(str(part))
    kind = part.get("type")
    if kind == "text":
        return _text_tokens(str(part.get("text", "")))
    if kind in ("image_url", "image", "input_image"):
        return IMAGE_TOKENS
    if kind in ("input_audio", "audio"):
        audio = part.get("input_audio")
        data = audio.get("data", "") if isinstance(audio, dict) else ""
        return 64 + len(str(data)) // AUDIO_CHARS_PER_TOKEN
    # Files and parts this gateway does not model: their JSON, which is at least what the
    # provider reads (a PDF's base64 is far more than its text).
    return _json_tokens(part)


def _content_tokens(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return _text_tokens(content)
    if isinstance(content, list):
        return sum(_part_tokens(p) for p in content)
    return _text_tokens(str(content))


def message_tokens(message: dict[str, Any]) -> int:
    tokens = MESSAGE_OVERHEAD_TOKENS + _content_tokens(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                tokens += MESSAGE_OVERHEAD_TOKENS + _text_tokens(
                    f"{fn.get('name', '')}{fn.get('arguments', '')}"
                )
    name = message.get("name")
    if isinstance(name, str):
        tokens += _text_tokens(name)
    return tokens


def estimate_prompt_tokens(
    messages: list[dict[str, Any]],
    system_prompt: str | None = None,
    tools: Any = None,
) -> int:
    """A high estimate of a call's prompt tokens: its messages, an extra system prompt (the
    router's instructions to the model it calls), and the JSON of the tools it offers."""
    tokens = 8 + sum(message_tokens(m) for m in messages if isinstance(m, dict))
    if system_prompt:
        tokens += MESSAGE_OVERHEAD_TOKENS + _text_tokens(system_prompt)
    if tools:
        tokens += _json_tokens(tools)
    return tokens


def requested_max_tokens(params: Mapping[str, Any]) -> int | None:
    """The most output tokens a request asks for per choice: the larger of ``max_tokens``
    and ``max_completion_tokens`` when it sets both (servers differ in which one they
    honour; OpenAI's and vLLM's: ``max_completion_tokens``). None when it sets neither."""
    asked = [int(v) for v in (params.get("max_tokens"), params.get("max_completion_tokens")) if v]
    return max(asked) if asked else None
