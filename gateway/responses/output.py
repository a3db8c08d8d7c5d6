"""The chat service's answer in the Responses API's shape: a ``response`` object, or its
stream of typed events.

Both are translations of what the chat service already produced (its JSON body, or its SSE
chunks as they are sent), so routing, metering, budgets and the ledger are the chat path's,
unchanged. Ids are derived from the request id: ``resp_<request id>`` (which
``POST /v1/feedback`` accepts), ``msg_<request id>`` for the answer, ``fc_<call id>`` for a
function call (a call the model gave no id has ``call_<request id>_<its index>``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from gateway.call_ids import call_id
from gateway.responses.request import ResponsesRequest
from gateway.responses.tools import ToolMap
from gateway.translation import StreamTranslation, chat_answer, grown_name, with_meta

log = logging.getLogger(__name__)

# finish_reason -> why a response is incomplete (None: complete).
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any]:
    u = chat_usage or {}
    prompt_details = u.get("prompt_tokens_details") or {}
    out = {
        "input_tokens": u.get("prompt_tokens", 0),
        "input_tokens_details": {
            "cached_tokens": prompt_details.get("cached_tokens") or 0,
            "cache_write_tokens": prompt_details.get("cache_write_tokens") or 0,
        },
        "output_tokens": u.get("completion_tokens", 0),
        "output_tokens_details": {
            "reasoning_tokens": (u.get("completion_tokens_details") or {}).get(
                "reasoning_tokens", 0
            )
        },
        "total_tokens": u.get("total_tokens", 0),
    }
    if "cost" in u:
        out["cost"] = u["cost"]
    return out


# A failed response's ``error.code`` is one of the codes OpenAI defines (its SDK refuses
# others); of those, what a gateway's failure can be. The gateway's own code (which model
# pool was unavailable, what it sent back) stays in the message.
_RATE_LIMITED = frozenset({"upstream_rate_limited", "rate_limited", "rate_limit_exceeded"})


def response_error(code: str | None, message: str) -> dict[str, str]:
    if code in _RATE_LIMITED:
        kind = "rate_limit_exceeded"
    else:
        kind = "server_error"
    if code and code != kind:
        message = f"{message} ({code})" if message else code
    return {"code": kind, "message": message}


def message_item(
    request_id: str, parts: list[dict[str, Any]], status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{request_id}",
        "status": status,
        "role": "assistant",
        "content": parts,
    }


def content_part(kind: str, text: str) -> dict[str, Any]:
    """An ``output_text`` part, or a ``refusal`` (a chat message's ``refusal``)."""
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_parts(text: str | None, refusal: str | None) -> list[dict[str, Any]]:
    parts = [content_part("output_text", text)] if text else []
    if refusal:
        parts.append(content_part("refusal", refusal))
    return parts or [content_part("output_text", "")]


def function_call_item(
    call: dict[str, Any], tools: ToolMap, status: str = "completed"
) -> dict[str, Any]:
    fn = call.get("function") or {}
    namespace, name = tools.call_name(fn.get("name", ""))
    item = {
        "type": "function_call",
        "id": f"fc_{call.get('id', '')}",
        "call_id": call.get("id", ""),
        "name": name,
        "arguments": fn.get("arguments") or "",
        "status": status,
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def response_object(
    req: ResponsesRequest,
    request_id: str,
    created_at: int,
    *,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    chat_usage: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    xrouter: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    incomplete = _INCOMPLETE.get(finish_reason or "")
    if status == "completed" and incomplete is not None:
        status = "incomplete"
    body: dict[str, Any] = {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": created_at,
        # When it completed (OpenAI's field; None until then, or when it did not).
        "completed_at": int(time.time()) if status == "completed" else None,
        "status": status,
        "model": model,
        "output": output,
        "error": error,
        "incomplete_details": {"reason": incomplete} if status == "incomplete" else None,
        "instructions": req.instructions,
        "metadata": req.metadata or {},
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "text": req.text or {"format": {"type": "text"}},
        "store": False,  # nothing is stored: GET /v1/responses/{id} does not exist here
        "user": req.user,  # echoed, as OpenAI echoes it
        "safety_identifier": req.safety_identifier,
        "usage": usage(chat_usage) if chat_usage is not None else None,
    }
    return with_meta(body, xrouter, req.tool_map.ignored)


def from_chat_completion(req: ResponsesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` object for a chat completion the chat service returned."""
    request_id, message, finish, meta = chat_answer(chat)
    output: list[dict[str, Any]] = []
    text, refusal = message.get("content"), message.get("refusal")
    if text or refusal or not message.get("tool_calls"):
        status = "incomplete" if finish in _INCOMPLETE else "completed"
        output.append(message_item(request_id, message_parts(text, refusal), status))
    tools = req.tool_map
    # A call cut off by the output limit is as incomplete as its stream says it is.
    call_status = "incomplete" if finish in _INCOMPLETE else "completed"
    output.extend(
        function_call_item({**c, "id": call_id(c.get("id"), request_id, i)}, tools, call_status)
        for i, c in enumerate(message.get("tool_calls") or [])
    )
    return response_object(
        req,
        request_id,
        int(chat.get("created") or 0),
        model=chat.get("model", req.model),
        status="completed",
        output=output,
        chat_usage=chat.get("usage"),
        finish_reason=finish,
        xrouter=meta or None,
    )


class EventStream(StreamTranslation):
    """Turns the chat service's SSE chunks into the Responses API's events.

    The chat stream always ends with a usage chunk (``choices: []``, with the cost and the
    ``xrouter`` object) or an error chunk; the events end with ``response.completed`` (or
    ``response.incomplete``) or ``response.failed``.
    """

    def __init__(
        self, req: ResponsesRequest, request_id: str, created_at: int, model: str | None = None
    ) -> None:
        self.req = req
        self.request_id = request_id
        self.created_at = created_at
        # The answering model when the stream starts knowing it (response.created says so).
        self.model = model or req.model
        self._seq = 0
        # The message item's content parts in the order they opened ("output_text",
        # "refusal"), and each one's text so far.
        self._parts: dict[str, list[str]] = {}
        self._text_index: int | None = None  # output index of the message item, once open
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> item
        self._call_index: dict[int, int] = {}  # chat tool-call index -> output index, once added
        self._names: dict[int, str] = {}  # chat tool-call index -> the chat name so far
        self._renamed: set[int] = set()  # calls a name piece came for after they were added
        # Calls not announced yet, in the order they started. A call whose first piece came
        # without its id (some servers send it in a later chunk) waits for it, whatever comes
        # meanwhile: an item's id is in its output_item.added and may not change after (the
        # OpenAI SDK refuses the stream), and a made-up one would not be the id the JSON
        # answer has, nor one the upstream knows when the call's output is sent back. It
        # waits for its name and its arguments to begin too: its name, also in
        # output_item.added, is whole then (some servers stream it in pieces), and fixed
        # from then on. Calls that start after it wait behind it, so that the output keeps
        # the chat answer's order.
        self._held: list[int] = []
        self._finish: str | None = None
        self.done = False

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _response(self, status: str, **kw: Any) -> dict[str, Any]:
        return response_object(
            self.req, self.request_id, self.created_at, model=self.model, status=status, **kw
        )

    def start(self) -> bytes:
        r = self._response("in_progress", output=[])
        return self._event("response.created", response=r) + self._event(
            "response.in_progress", response=r
        )

    def ended_early(self) -> bytes:
        return self._failed("server_error", "the stream ended early")

    def on_chunk(self, chunk: dict[str, Any]) -> bytes:
        if "error" in chunk:
            err = chunk["error"] or {}
            return self._failed(err.get("code") or err.get("type"), err.get("message", ""))
        self.model = chunk.get("model") or self.model
        choices = chunk.get("choices")
        if not choices:
            return self._complete(chunk) if "usage" in chunk else b""
        out = b""
        delta = choices[0].get("delta") or {}
        if delta.get("content"):
            out += self._on_text("output_text", delta["content"])
        if delta.get("refusal"):
            out += self._on_text("refusal", delta["refusal"])
        for call in delta.get("tool_calls") or []:
            out += self._on_call(call)
        if choices[0].get("finish_reason"):
            self._finish = choices[0]["finish_reason"]
        return out

    def _next_index(self) -> int:
        return (self._text_index is not None) + len(self._call_index)

    def _open_part(self, kind: str) -> tuple[bytes, list[str]]:
        """The message item's ``kind`` part (opened, with its events, if it is not yet)."""
        out = b""
        if self._text_index is None:
            self._text_index = self._next_index()
            out += self._event(
                "response.output_item.added",
                output_index=self._text_index,
                item=message_item(self.request_id, [], "in_progress"),
            )
        part = self._parts.get(kind)
        if part is None:
            part = self._parts[kind] = []
            out += self._event(
                "response.content_part.added",
                item_id=f"msg_{self.request_id}",
                output_index=self._text_index,
                content_index=len(self._parts) - 1,
                part=content_part(kind, ""),
            )
        return out, part

    def _on_text(self, kind: str, text: str) -> bytes:
        out, part = self._open_part(kind)
        part.append(text)
        item_id = f"msg_{self.request_id}"
        index = 0 if len(self._parts) == 1 else list(self._parts).index(kind)
        # Two calls rather than one with a kwargs dict built per delta: this runs per chunk.
        if kind == "refusal":
            return out + self._event(
                "response.refusal.delta",
                item_id=item_id,
                output_index=self._text_index,
                content_index=index,
                delta=text,
            )
        return out + self._event(
            "response.output_text.delta",
            item_id=item_id,
            output_index=self._text_index,
            content_index=index,
            delta=text,
            logprobs=[],
        )

    def _on_call(self, delta: dict[str, Any]) -> bytes:
        index = int(delta.get("index", 0))
        fn = delta.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            call = {"id": delta.get("id") or ""}
            item = self._calls[index] = function_call_item(call, self.req.tool_map, "in_progress")
            self._names[index] = ""
            self._held.append(index)
        elif not item["call_id"] and delta.get("id") and index in self._held:
            self._set_id(index, delta["id"])
        name = grown_name(self._names[index], fn.get("name"))
        if name != self._names[index] and index in self._call_index:
            # Announced: its name is in output_item.added, which a client has acted on (the
            # SDK's snapshot keeps it), so it stays the name in every later event and in
            # the response. A server that sends more of it after the arguments began breaks
            # the chat stream's convention: said once per call.
            if index not in self._renamed:
                self._renamed.add(index)
                log.warning(
                    "responses %s: tool call %d's name piece %r came after it was announced "
                    "as %r; dropped",
                    self.request_id, index, fn.get("name"), self._names[index],
                )  # fmt: skip
        elif name != self._names[index]:
            self._names[index] = name
            namespace, item["name"] = self.req.tool_map.call_name(name)
            item.pop("namespace", None)
            if namespace is not None:
                item["namespace"] = namespace
        item["arguments"] += fn.get("arguments") or ""
        if index in self._held:
            return self._announce_ready()
        return self._arguments(index, fn["arguments"]) if fn.get("arguments") else b""

    def _set_id(self, index: int, given: str) -> None:
        """The call's id: ``given``, or (``""``: it never came) the one ``call_id`` makes."""
        item = self._calls[index]
        item["call_id"] = call_id(given, self.request_id, index)
        item["id"] = f"fc_{item['call_id']}"

    def _added(self, index: int) -> bytes:
        item = self._calls[index]
        return self._event(
            "response.output_item.added",
            output_index=self._call_index[index],
            item={**item, "arguments": ""},
        )

    def _arguments(self, index: int, piece: str) -> bytes:
        return self._event(
            "response.function_call_arguments.delta",
            item_id=self._calls[index]["id"],
            output_index=self._call_index[index],
            delta=piece,
        )

    def _announce_ready(self) -> bytes:
        """The held calls' events, in order, up to the first still waiting for its id, its
        name or its arguments to begin."""
        out = b""
        while self._held and self._ready(self._held[0]):
            out += self._announce(self._held.pop(0))
        return out

    def _ready(self, index: int) -> bool:
        item = self._calls[index]
        return bool(item["call_id"] and self._names[index] and item["arguments"])

    def _announce_held(self) -> bytes:
        """Every held call's events: the stream is ending. A call whose id never came is
        announced with the one the JSON answer gives it (``call_id``)."""
        for index in self._held:
            if not self._calls[index]["call_id"]:
                self._set_id(index, "")
        out = b"".join(self._announce(index) for index in self._held)
        self._held.clear()
        return out

    def _announce(self, index: int) -> bytes:
        """A call's ``output_item.added`` at the next output index, with the arguments that
        came while it was held as one piece."""
        self._call_index[index] = self._next_index()
        out = self._added(index)
        arguments = self._calls[index]["arguments"]
        return out + self._arguments(index, arguments) if arguments else out

    def _items(self, text_status: str) -> list[tuple[int, dict[str, Any]]]:
        """The output items as they stand, by output index."""
        items: list[tuple[int, dict[str, Any]]] = []
        if self._text_index is not None:
            parts = [content_part(k, "".join(v)) for k, v in self._parts.items()]
            items.append((self._text_index, message_item(self.request_id, parts, text_status)))
        for index, item in self._calls.items():
            items.append((self._call_index[index], {**item, "status": text_status}))
        return sorted(items, key=lambda p: p[0])

    def _close_items(self) -> tuple[bytes, list[dict[str, Any]]]:
        """The events that close every open item, and the items."""
        status = "incomplete" if self._finish in _INCOMPLETE else "completed"
        out = self._announce_held()  # calls whose id or name never came
        items = self._items(status)
        for at_index, item in items:
            if item["type"] == "message":
                for j, part in enumerate(item["content"]):
                    at = {"item_id": item["id"], "output_index": at_index, "content_index": j}
                    if part["type"] == "refusal":
                        out += self._event("response.refusal.done", refusal=part["refusal"], **at)
                    else:
                        out += self._event(
                            "response.output_text.done", text=part["text"], logprobs=[], **at
                        )
                    out += self._event("response.content_part.done", part=part, **at)
            else:
                out += self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=at_index,
                    arguments=item["arguments"],
                )
            out += self._event("response.output_item.done", output_index=at_index, item=item)
        return out, [item for _, item in items]

    def _complete(self, final: dict[str, Any]) -> bytes:
        opened = b""
        if self._text_index is None and not self._calls:
            # An empty answer is still a message (as the non-streamed response has it), and
            # a client building the output from the events must have seen it opened.
            opened, _ = self._open_part("output_text")
        out, output = self._close_items()
        out = opened + out
        r = self._response(
            "completed",
            output=output,
            chat_usage=final.get("usage"),
            finish_reason=self._finish,
            xrouter=final.get("xrouter"),
        )
        self.done = True
        kind = "response.incomplete" if r["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=r)

    def _failed(self, code: str | None, message: str) -> bytes:
        # The items stay open (no .done events): what was streamed, marked incomplete.
        self.done = True
        out = self._announce_held()
        output = [item for _, item in self._items("incomplete")]
        r = self._response("failed", output=output, error=response_error(code, message))
        return out + self._event("response.failed", response=r)
