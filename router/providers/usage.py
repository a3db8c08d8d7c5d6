"""Usage a provider did not report: estimated from text (``pricing.estimate_tokens``), so that
a call is never counted as free. Complete responses without a ``usage`` object and streams
cut off before their usage chunk both come here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pricing import TokenUsage, estimate_tokens, tokens_for_chars
from router.outcomes import content_text


def reported_or_estimated(
    request: Mapping[str, Any], response: Mapping[str, Any]
) -> tuple[TokenUsage, bool]:
    """The response's usage and True, or, when it reports none, an estimate and False."""
    usage = response.get("usage")
    if usage:
        parsed = TokenUsage.from_openai(usage)
        if parsed.prompt_tokens or parsed.completion_tokens:
            return parsed, True
        # No count it can be charged by (only a total, or only zeros and junk): no call
        # reads no prompt, so this reports nothing, and the call is estimated, not free.
    return estimate_usage(request, response), False


def zero_usage(usage: object) -> bool:
    """Whether ``usage`` counts no tokens at all: what LiteLLM fills in when the upstream
    reported none (no call has zero prompt tokens)."""
    return (
        isinstance(usage, Mapping)
        and not usage.get("prompt_tokens")
        and not usage.get("completion_tokens")
        and not usage.get("total_tokens")
    )


def estimate_usage(request: Mapping[str, Any], response: Mapping[str, Any]) -> TokenUsage:
    """Usage of a complete call whose server reported none, from the request's and the
    response's text."""
    return TokenUsage(prompt_tokens_estimate(request), completion_tokens_estimate(response))


def completion_tokens_estimate(body: Mapping[str, Any]) -> int:
    """Estimated completion tokens of a ``chat.completion``: every choice's text and
    tool-call arguments."""
    chars = 0
    for choice in body.get("choices") or ():
        message = choice.get("message") or {}
        chars += len(content_text(message.get("content")))
        calls = message.get("tool_calls") or []
        for tc in calls if isinstance(calls, list) else [calls]:
            chars += len(_arguments_text(tc))
    return tokens_for_chars(chars)


def _arguments_text(tool_call: Any) -> str:
    """A tool call's arguments as the text the model wrote. The upstream checked only that
    each choice has a message: a malformed call (a string, ``function`` no object,
    ``arguments`` an object) is the caller's to refuse — the llm router answers it with a
    tool error — so it is counted by its JSON here, never raised on."""
    function = tool_call.get("function") if isinstance(tool_call, dict) else tool_call
    arguments = function.get("arguments") if isinstance(function, dict) else function
    if not arguments:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)


def prompt_tokens_estimate(body: Mapping[str, Any]) -> int:
    """Estimated prompt tokens of a chat request: its messages' text and its tool schemas."""
    text = "\n".join(content_text(m.get("content")) for m in body.get("messages") or ())
    tools = body.get("tools")
    return estimate_tokens(text) + (estimate_tokens(json.dumps(tools)) if tools else 0)
