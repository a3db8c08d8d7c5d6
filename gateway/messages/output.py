"""The chat service's answer in the Anthropic Messages API's shape: a ``message`` object,
its stream of events, or an Anthropic-shaped error.

Like the Responses API (``gateway.responses``), these are translations of what the chat
service already produced, so routing, metering, budgets and the ledger are the chat path's.
The message id is ``msg_<request id>`` (which ``POST /v1/feedback`` accepts); tool-use ids
are the chat tool-call ids, so a ``tool_result`` names the call it answers.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gateway.call_ids import call_id
from gateway.errors import UPSTREAM_CODE_STATUS
from gateway.messages.request import MessagesRequest
from gateway.translation import StreamTranslation, chat_answer, grown_name, with_meta

log = logging.getLogger(__name__)

# finish_reason -> stop_reason. A chat answer does not say which stop sequence ended it, so
# "stop" is end_turn (stop_sequence stays null).
_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason(finish_reason: str, tool_use: bool) -> str:
    """Anthropic's ``stop_reason`` for a chat ``finish_reason``. An answer of tool calls
    that finished with "stop" — what a forced tool choice ends with (OpenAI, vLLM), which
    Anthropic's ``tool_choice`` ``any`` and ``tool`` translate to — is "tool_use": agent
    loops run the tools on that reason only."""
    reason = _STOP_REASON.get(finish_reason, "end_turn")
    return "tool_use" if tool_use and reason == "end_turn" else reason


# HTTP status -> Anthropic's error type.
_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_body(status: int, openai_error: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error's content as Anthropic's ``{"type": "error", "error": ...}``;
    the gateway's own ``code`` and ``param`` ride along."""
    err: dict[str, Any] = {
        "type": _ERROR_TYPE.get(status, "api_error"),
        "message": str(openai_error.get("message") or "error"),
    }
    for field in ("code", "param"):
        if openai_error.get(field) is not None:
            err[field] = openai_error[field]
    return {"type": "error", "error": err}


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    u = chat_usage or {}
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    out: dict[str, Any] = {
        # Anthropic counts cache reads apart from input_tokens; chat counts them inside.
        "input_tokens": (u.get("prompt_tokens") or 0) - cached,
        "output_tokens": u.get("completion_tokens") or 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }
    if "cost" in u:
        out["cost"] = u["cost"]
    return out


def tool_input(arguments: str | None) -> dict[str, Any]:
    """A tool call's arguments as the object ``tool_use.input`` must be. Arguments that are
    not a JSON object (a model's malformed call) are kept, as text, under ``_raw``."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}


def message_object(
    req: MessagesRequest,
    request_id: str,
    *,
    model: str,
    content: list[dict[str, Any]],
    finish_reason: str | None,
    chat_usage: dict[str, Any] | None,
    xrouter: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None
        if finish_reason is None
        else stop_reason(finish_reason, any(b.get("type") == "tool_use" for b in content)),
        "stop_sequence": None,
        "usage": usage(chat_usage),
    }
    return with_meta(body, xrouter, req.ignored_tools)


def from_chat_completion(req: MessagesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """The ``message`` for a chat completion the chat service returned."""
    request_id, message, finish, meta = chat_answer(chat)
    content: list[dict[str, Any]] = []
    text = message.get("content") or message.get("refusal")
    if text:
        content.append({"type": "text", "text": text})
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call_id(call.get("id"), request_id, i),
                "name": fn.get("name", ""),
                "input": tool_input(fn.get("arguments")),
            }
        )
    return message_object(
        req,
        request_id,
        model=chat.get("model", req.model),
        content=content,
        finish_reason=finish or "stop",
        chat_usage=chat.get("usage"),
        xrouter=meta or None,
    )


class EventStream(StreamTranslation):
    """Turns the chat service's SSE chunks into the Messages API's events.

    ``message_start``; per content block (the text, then each tool call)
    ``content_block_start``, its deltas (``text_delta``, ``input_json_delta``) and
    ``content_block_stop``; then ``message_delta`` (stop reason, usage with the cost, the
    ``xrouter`` object) and ``message_stop`` — or an ``error`` event if the chat stream
    failed or ended early.

    Anthropic's blocks are sequential (each stopped before the next starts) while a chat
    stream may interleave parallel calls' argument pieces (OpenAI does). So one block at a
    time streams live — the text, then the first tool call, whose pieces keep arriving in
    its block whatever comes between them — and the rest is held and sent whole when the
    answer completes: further tool calls, and any text after the first call started.
    """

    def __init__(self, req: MessagesRequest, request_id: str, model: str | None = None) -> None:
        self.req = req
        self.request_id = request_id
        self.model = model or req.model
        self._blocks = 0  # blocks started so far
        self._open: int | None = None  # the block streaming live, if one is open
        self._text_done = False  # the text block was opened (and may be closed): no other
        self._live_call: int | None = None  # the chat tool-call index streaming live
        self._live_name = ""  # its name, in its content_block_start: final
        self._renamed = False  # a piece of its name came after that (logged once)
        # The live call's arguments, held until they show whether they are a JSON object
        # (first character "{": streamed as they come) or not (a string, a list: sent at
        # the end as ``tool_input`` makes them, ``{"_raw": ...}``, as the whole message has
        # them — Anthropic's SDKs parse the pieces as the object ``input`` must be).
        self._live_args = ""
        self._live_object: bool | None = None  # None: undecided (whitespace so far)
        # held for the end: chat tool-call index -> [id, name, arguments], in order of start
        self._calls: dict[int, list[str]] = {}
        self._late_text: list[str] = []
        self._finish: str | None = None
        self.done = False

    @staticmethod
    def _event(kind: str, payload: dict[str, Any]) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def start(self) -> bytes:
        message = message_object(
            self.req, self.request_id, model=self.model, content=[], finish_reason=None,
            chat_usage=None,
        )  # fmt: skip
        message.pop("xrouter", None)  # comes with message_delta, once known
        return self._event("message_start", {"type": "message_start", "message": message})

    def ended_early(self) -> bytes:
        return self._error(502, {"message": "the stream ended early"})

    def on_chunk(self, chunk: dict[str, Any]) -> bytes:
        if "error" in chunk:
            self.done = True
            err = chunk["error"] or {}
            status = 500
            if err.get("type") == "upstream_error":
                status = UPSTREAM_CODE_STATUS.get(err.get("code") or "", 502)
            return self._error(status, err)
        self.model = chunk.get("model") or self.model
        choices = chunk.get("choices")
        if not choices:
            return self._finish_message(chunk) if "usage" in chunk else b""
        out = b""
        delta = choices[0].get("delta") or {}
        text = delta.get("content") or delta.get("refusal")
        if text:
            out += self._on_text(text)
        for call in delta.get("tool_calls") or []:
            out += self._on_call(call)
        if choices[0].get("finish_reason"):
            self._finish = choices[0]["finish_reason"]
        return out

    def _start(self, index: int, block: dict[str, Any]) -> bytes:
        return self._event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )

    def _stop(self, index: int) -> bytes:
        return self._event("content_block_stop", {"type": "content_block_stop", "index": index})

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return self._event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def _next_block(self, block: dict[str, Any]) -> bytes:
        """Stop the open block, if any, and start ``block`` as the open one."""
        out = self._stop(self._open) if self._open is not None else b""
        self._open = self._blocks
        self._blocks += 1
        return out + self._start(self._open, block)

    def _on_text(self, text: str) -> bytes:
        if self._live_call is not None:
            self._late_text.append(text)  # the tool call's block is open: later
            return b""
        out = b""
        if not self._text_done:
            self._text_done = True
            out += self._next_block({"type": "text", "text": ""})
        assert self._open is not None
        return out + self._delta(self._open, {"type": "text_delta", "text": text})

    def _on_call(self, call: dict[str, Any]) -> bytes:
        position = int(call.get("index", 0))
        fn = call.get("function") or {}
        arguments = fn.get("arguments") or ""
        if position == self._live_call:
            if grown_name(self._live_name, fn.get("name")) != self._live_name:
                self._late_name(position, fn["name"])
            return self._live_piece(arguments)
        entry = self._calls.setdefault(position, ["", "", ""])
        entry[0] = entry[0] or call.get("id") or ""
        entry[1] = grown_name(entry[1], fn.get("name"))
        entry[2] += arguments
        # A block's id and name are in its content_block_start: the first call is held until
        # its id has come (some servers send it in a later chunk), and its name and its
        # arguments have begun (its name is whole then: some servers stream it in pieces
        # before them).
        if self._live_call is None and all(entry) and next(iter(self._calls)) == position:
            del self._calls[position]  # it streams from here
            return self._go_live(position, *entry)
        return b""

    def _late_name(self, position: int, piece: str) -> None:
        # The block started with its name, which the SDK's message keeps: a server that
        # sends more of it after the arguments began breaks the chat stream's convention.
        if not self._renamed:
            self._renamed = True
            log.warning(
                "messages %s: tool call %d's name piece %r came after its block started "
                "as %r; dropped",
                self.request_id, position, piece, self._live_name,
            )  # fmt: skip

    def _go_live(self, position: int, given: str, name: str, arguments: str) -> bytes:
        self._live_call = position
        self._live_name = name
        out = self._next_block({"type": "tool_use", "id": given, "name": name, "input": {}})
        return out + self._live_piece(arguments)

    def _live_piece(self, arguments: str) -> bytes:
        assert self._open is not None
        if not arguments:
            return b""
        if self._live_object is None:
            self._live_args += arguments
            start = self._live_args.lstrip()[:1]
            if not start:
                return b""
            self._live_object = start == "{"
            if not self._live_object:
                return b""
            arguments, self._live_args = self._live_args, ""
        elif not self._live_object:
            self._live_args += arguments
            return b""
        return self._delta(self._open, {"type": "input_json_delta", "partial_json": arguments})

    def _live_rest(self) -> bytes:
        """What the live call held back, once its arguments are complete."""
        if self._live_call is None or self._live_object or not self._live_args.strip():
            return b""
        assert self._open is not None
        whole = orjson.dumps(tool_input(self._live_args)).decode()
        return self._delta(self._open, {"type": "input_json_delta", "partial_json": whole})

    def _held_blocks(self) -> bytes:
        """Stop the open block, then send what was held, each block whole."""
        out = self._live_rest()
        out += self._stop(self._open) if self._open is not None else b""
        self._open = None
        held: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
        for position, (given, name, arguments) in self._calls.items():
            # A call whose id never came: the one the JSON answer gives it.
            called = call_id(given, self.request_id, position)
            block = {"type": "tool_use", "id": called, "name": name, "input": {}}
            # Whole, so as the whole message has it: a JSON object, or ``{"_raw": ...}``.
            whole = orjson.dumps(tool_input(arguments)).decode() if arguments.strip() else ""
            piece = {"type": "input_json_delta", "partial_json": whole} if whole else None
            held.append((block, piece))
        if self._late_text:
            held.append(
                (
                    {"type": "text", "text": ""},
                    {"type": "text_delta", "text": "".join(self._late_text)},
                )
            )
        for block, piece in held:
            index = self._blocks
            self._blocks += 1
            out += self._start(index, block)
            if piece is not None:
                out += self._delta(index, piece)
            out += self._stop(index)
        return out

    def _finish_message(self, final: dict[str, Any]) -> bytes:
        self.done = True
        tool_use = self._live_call is not None or bool(self._calls)
        out = self._held_blocks()
        u = usage(final.get("usage"))
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(self._finish or "stop", tool_use),
                "stop_sequence": None,
            },
            "usage": u,
        }
        meta = dict(final.get("xrouter") or {})
        if self.req.ignored_tools:
            meta["ignored_tools"] = self.req.ignored_tools
        if meta:
            delta["xrouter"] = meta
        return (
            out
            + self._event("message_delta", delta)
            + self._event("message_stop", {"type": "message_stop"})
        )

    def _error(self, status: int, err: dict[str, Any]) -> bytes:
        return self._event("error", error_body(status, err))
