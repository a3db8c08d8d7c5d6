"""Ids for the tool calls a model gave without one.

Some OpenAI-compatible servers (older vLLM, Ollama and llama.cpp builds, some Mistral
paths) send tool calls with no ``id`` (missing, null or ``""``). A client sends its calls
back on the next turn, each named by its id, and the tool messages that answer them name
them too: the chat service's own checks refuse a call without an id and a tool message
whose ``tool_call_id`` names no call, so a conversation through such a server could not go
on. Every API names such a call ``call_<request id>_<index>`` (``call_id``); the chat API's
complete answers (``with_call_ids``) and relayed streams (``StreamCallIds``) here, the
Responses and Messages translations as they build their items and blocks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StreamCallIds", "call_id", "with_call_ids"]


def call_id(given: Any, request_id: str, index: int, choice: int = 0) -> str:
    """A tool call's id: the model's, or for a call that came without one (some
    OpenAI-compatible servers send none) one made of the request id and the call's index in
    the answer: unique in it (two calls without an id shared one, ``""``), and the same in
    the answer's stream and in its JSON. A call of a later choice (``n`` > 1) has the
    choice's index too, ``call_<request id>_<choice>_<index>``: the first choice's are
    those the Responses and Messages APIs give (they answer with the first choice only),
    and the two forms cannot meet: after ``call_<request id>_`` (hex, no ``_``) comes one
    number in the first, two joined by ``_`` in the second."""
    if isinstance(given, str) and given:
        return given
    if choice == 0:
        return f"call_{request_id}_{index}"
    return f"call_{request_id}_{choice}_{index}"


def _given(call: Any) -> bool:
    given = call.get("id") if isinstance(call, dict) else None
    return isinstance(given, str) and bool(given)


def _calls(choice: Any) -> list[Any]:
    """A choice's ``message.tool_calls``, or ``[]`` (none, or not a list of them)."""
    message = choice.get("message") if isinstance(choice, dict) else None
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return calls if isinstance(calls, list) else []


def with_call_ids(choices: list[Any], request_id: str) -> list[Any]:
    """A chat completion's ``choices`` with every tool call that came without an id given
    one (``call_id``); ``choices`` itself is left as it is (the answer cache keeps the
    model's answer, which a hit names by its own request id). The same list when no call
    lacks one, as most answers have none."""
    if all(_given(c) for choice in choices for c in _calls(choice) if isinstance(c, dict)):
        return choices
    named: list[Any] = []
    for i, choice in enumerate(choices):
        calls = _calls(choice)
        if all(_given(c) for c in calls if isinstance(c, dict)):
            named.append(choice)
            continue
        at = choice["index"] if isinstance(choice.get("index"), int) else i
        calls = [
            {**c, "id": call_id(c.get("id"), request_id, j, at)} if isinstance(c, dict) else c
            for j, c in enumerate(calls)
        ]
        named.append({**choice, "message": {**choice["message"], "tool_calls": calls}})
    return named


class StreamCallIds:
    """Names, in a relayed chat stream, the tool calls that come without an id.

    The OpenAI SDK accumulates a streamed call by its ``index`` and concatenates its string
    fields, ``id`` included: an id may be sent once per call. So a call whose first delta
    has no id gets ``call_id``'s on that delta, and an id the upstream sends for it in a
    later delta is not relayed (the client's id stays the one it was given; holding the
    call back until an id came, as the Responses and Messages streams do, would hold its
    arguments and everything after them for an id that may never come). A call whose
    first delta has its id is relayed as it came, but for that id sent again (some servers
    repeat it in every delta, which the SDK would join into ``call_xcall_x``): a later
    piece equal to the id so far is a repeat, as the Responses and Messages streams take a
    repeated name."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        # Per (choice index, call index) seen: the id the client has for it so far, and
        # whether it is one made here.
        self._ids: dict[tuple[int, int], tuple[str, bool]] = {}

    def name(self, choices: list[dict[str, Any]]) -> None:
        """Name the calls of one chunk's ``choices`` (checked by the provider: objects with
        integer indexes), in place."""
        for choice in choices:
            delta = choice.get("delta")
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            if not calls:
                continue
            at = choice.get("index", 0)
            for call in calls:
                key = (at, call.get("index", 0))
                seen = self._ids.get(key)
                if seen is None:
                    made = not _given(call)
                    if made:
                        call["id"] = call_id(None, self.request_id, key[1], at)
                    self._ids[key] = (call["id"], made)
                elif seen[1] or ("id" in call and call["id"] in (seen[0], None, "")):
                    call.pop("id", None)  # ours stands; a repeat or nothing adds nothing
                elif _given(call):
                    self._ids[key] = (seen[0] + call["id"], False)  # a piece, as the SDK joins
