"""Content an upstream gives as a list of parts rather than a string.

Mistral's reasoning models (Magistral) answer and stream ``content`` as parts — ``text``
parts and ``thinking`` parts holding text parts of their own — and some OpenAI-compatible
servers stream ``[{"type": "text", "text": "..."}]``. Answers and streams are relayed in
OpenAI's shape, where a message's or a delta's ``content`` is a string: its text parts'
text, and the thinking parts' text as ``reasoning_content``, the field vLLM, DeepSeek and
LiteLLM give reasoning in.
"""

from __future__ import annotations

from typing import Any

# Part types that hold a model's reasoning rather than its answer.
_REASONING = frozenset({"thinking", "reasoning"})


def is_parts(content: Any) -> bool:
    """Whether ``content`` is a list of part objects (an empty list is one)."""
    return isinstance(content, list) and all(isinstance(p, dict) for p in content)


def parts_text(parts: list[Any]) -> str:
    """The text parts' text, joined: pieces of one text. Thinking parts, and parts of
    types that hold no text (images, ...), are not the answer's text."""
    return "".join(
        p["text"]
        for p in parts
        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    )


def parts_reasoning(parts: list[Any]) -> str:
    """The thinking parts' text, joined. Mistral's holds a list of text parts under
    ``thinking``; a string there (as Anthropic's thinking blocks have it) is taken too."""
    out: list[str] = []
    for p in parts:
        if not isinstance(p, dict) or p.get("type") not in _REASONING:
            continue
        inner = p.get(p["type"], p.get("text"))
        if isinstance(inner, str):
            out.append(inner)
        elif isinstance(inner, list):
            out.append(parts_text(inner))
    return "".join(out)


def _flatten(message: dict[str, Any]) -> None:
    """``message`` (a delta or an answer's message) with its ``content`` parts made OpenAI's
    shape, in place: ``content`` their text (None without any), ``reasoning_content`` their
    thinking (after any the message carried already)."""
    parts = message["content"]
    message["content"] = parts_text(parts) or None
    reasoning = parts_reasoning(parts)
    if reasoning:
        before = message.get("reasoning_content")
        message["reasoning_content"] = (before if isinstance(before, str) else "") + reasoning


def flatten_parts(chunk: dict[str, Any]) -> None:
    """Rewrite, in place, each delta of ``chunk`` whose ``content`` is a list of parts into
    OpenAI's shape (see :func:`_flatten`). Run on every chunk of a stream, before anything
    reads it; what is not a choice or delta object is left as it is."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and isinstance(delta.get("content"), list):
            _flatten(delta)


def flatten_answer(completion: dict[str, Any]) -> None:
    """The same for each message of a non-streamed ``chat.completion``, so that an answer
    reads as the same answer streamed does (and the answer cache, which replays an answer
    as a stream, holds text)."""
    for choice in completion.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            _flatten(message)
